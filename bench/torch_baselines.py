#!/usr/bin/env python3
"""Torch baselines for `dsmla bench`, measured in one process on the GPU.

The same 16384-token shapes as `dsmla bench` (B sequences of S tokens, H
heads), timed with CUDA events (median after warm-up, random bf16 data):

  * cuDNN SDPA (SDPBackend.CUDNN_ATTENTION): q/k head 192, v head 128, causal,
    layout [B, H, S, D] -- the attention kernel the dense path must beat;
  * the dense route as torch composes it: up-projection GEMM, concat k_pe
    into K, cuDNN SDPA on [B, H, S, D] views, output back to [T, H*128];
  * the cuBLAS up-projection GEMM [16384, 512] x [512, H*256];
  * the sparse route's GEMMs: q absorption bmm [H, T, 128] x [H, 128, 512] and
    output up-projection bmm [H, T, 512] x [H, 512, 128];
  * the ceilings: an 8192^3 bf16 matmul and a large device-to-device copy.

Writes JSON (--json), a markdown table (--md, and always to stdout); progress
goes to stderr. Usage: python3 bench/torch_baselines.py [--json F] [--md F]
[--quick] [--repeats N] [--warmup N]
"""
import argparse
import datetime
import json
import math
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

TOKENS = 16384
LATENT = 512      # kv_lora_rank
ROPE = 64         # qk_rope
NOPE = 128        # qk_nope
V_HEAD = 128
QK_HEAD = NOPE + ROPE
GEMM_N = 8192
COPY_BYTES = 2 << 30  # each way
MAX_COPIES = 64


def softmax_scale():
    """DeepSeek-V3.2: 192^-0.5 * mscale^2, mscale = 0.1 ln 40 + 1 (same as dsmla)."""
    mscale = 0.1 * math.log(40.0) + 1.0
    return QK_HEAD ** -0.5 * mscale * mscale


def log(msg):
    print(f"[torch-baselines] {msg}", file=sys.stderr, flush=True)


def time_ms(fn, warmup, repeats):
    """Per-call times (ms) of fn(i): CUDA events around each call, no host sync in between."""
    call = 0
    for _ in range(warmup):
        fn(call)
        call += 1
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    for i in range(repeats):
        starts[i].record()
        fn(call)
        call += 1
        ends[i].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def copies_for(footprint_bytes, l2_bytes):
    """Input copies so that one pass over all of them exceeds 2 x L2."""
    if footprint_bytes >= 2 * l2_bytes:
        return 1
    return max(1, min(MAX_COPIES, math.ceil(2 * l2_bytes / max(footprint_bytes, 1))))


def randn(*shape, scale=1.0):
    return torch.randn(*shape, dtype=torch.bfloat16, device="cuda") * scale


class Bench:
    def __init__(self, args):
        self.args = args
        props = torch.cuda.get_device_properties(0)
        self.l2 = getattr(props, "L2_cache_size", 60 << 20) or (60 << 20)
        self.rows = []
        self.gemm_tflops = 0.0
        self.copy_tbps = 0.0

    def measure(self, row, make_inputs, fn, footprint, fallback=None):
        """Times fn(inputs[i % copies]) and fills row; errors are recorded, not raised.

        fallback = (fn2, note): if fn raises, fn2 is timed instead and note is recorded.
        """
        label = f"{row['what']} S {row.get('seq_len', '-')} H {row.get('num_heads', '-')}"
        log(label)
        try:
            copies = copies_for(footprint, self.l2)
            inputs = [make_inputs() for _ in range(copies)]
            try:
                samples = time_ms(lambda i: fn(inputs[i % copies]), self.args.warmup, self.args.repeats)
            except RuntimeError as e:
                if fallback is None:
                    raise
                fn, note = fallback
                row["note"] = f"{note} ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
                log(f"  {row['note']}")
                samples = time_ms(lambda i: fn(inputs[i % copies]), self.args.warmup, self.args.repeats)
            del inputs
            med = statistics.median(samples)
            row.update(median_ms=med, min_ms=min(samples), max_ms=max(samples), samples_ms=samples,
                       input_copies=copies)
            if row.get("flops"):
                row["tflops"] = row["flops"] / (med * 1e-3) / 1e12
            if row.get("bytes"):
                row["tbps"] = row["bytes"] / (med * 1e-3) / 1e12
            log(f"  {med:.3f} ms" + (f", {row['tflops']:.1f} TFLOP/s" if "tflops" in row else ""))
        except Exception as e:  # one failing baseline must not hide the others
            row["error"] = f"{type(e).__name__}: {e}".splitlines()[0]
            log(f"  error: {row['error']}")
        torch.cuda.empty_cache()
        self.rows.append(row)
        return row

    # ------------------------------------------------------------ ceilings
    def ceilings(self):
        n = GEMM_N
        row = self.measure({"what": "ceiling_gemm_bf16", "n": n, "flops": 2.0 * n ** 3,
                            "bytes": 3.0 * n * n * 2},
                           lambda: (randn(n, n), randn(n, n), torch.empty(n, n, dtype=torch.bfloat16,
                                                                         device="cuda")),
                           lambda x: torch.matmul(x[0], x[1], out=x[2]),
                           footprint=3 * n * n * 2)
        self.gemm_tflops = row.get("tflops", 0.0)
        elems = COPY_BYTES // 2
        row = self.measure({"what": "ceiling_device_copy", "bytes_each_way": COPY_BYTES,
                            "bytes": 2.0 * COPY_BYTES},
                           lambda: (randn(elems), torch.empty(elems, dtype=torch.bfloat16, device="cuda")),
                           lambda x: x[1].copy_(x[0]),
                           footprint=2 * COPY_BYTES)
        self.copy_tbps = row.get("tbps", 0.0)

    # ------------------------------------------------------------ dense path pieces
    def sdpa(self, s, h):
        b = TOKENS // s
        pairs = b * s * (s + 1) / 2
        scale = softmax_scale()
        row = {"what": "cudnn_sdpa", "seq_len": s, "num_heads": h, "num_tokens": TOKENS,
               "flops": 2.0 * pairs * h * (QK_HEAD + V_HEAD),
               "bytes": 2.0 * TOKENS * h * (2 * QK_HEAD + 2 * V_HEAD)}

        def inputs():
            return (randn(b, h, s, QK_HEAD), randn(b, h, s, QK_HEAD), randn(b, h, s, V_HEAD))

        def run(x):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(x[0], x[1], x[2], is_causal=True, scale=scale)

        self.measure(row, inputs, run, footprint=row["bytes"])

    def dense_route(self, s, h):
        """GEMM, concat k_pe into K, cuDNN SDPA on [B, H, S, D] views, output to [T, H*128].

        q / k / v are handed to SDPA as transposed views of the token-major
        tensors, as a model's forward does; if cuDNN rejects those strides, the
        route is timed with contiguous [B, H, S, D] copies instead (noted)."""
        b = TOKENS // s
        t = TOKENS
        pairs = b * s * (s + 1) / 2
        scale = softmax_scale()
        row = {"what": "torch_dense_route", "seq_len": s, "num_heads": h, "num_tokens": t,
               "flops": 2.0 * pairs * h * (QK_HEAD + V_HEAD) + 2.0 * t * LATENT * h * 256,
               "bytes": 2.0 * (t * h * QK_HEAD + t * (LATENT + ROPE) + h * 256 * LATENT + t * h * V_HEAD)}

        def inputs():
            return (randn(t, h, QK_HEAD), randn(t, LATENT), randn(t, ROPE),
                    randn(h * 256, LATENT, scale=LATENT ** -0.5))

        def run(x, contiguous):
            q, kv_c, k_pe, w_kv_b = x
            kv = F.linear(kv_c, w_kv_b).view(t, h, 256)
            k_nope, v = kv.split([NOPE, V_HEAD], dim=-1)
            k = torch.cat([k_nope, k_pe.view(t, 1, ROPE).expand(t, h, ROPE)], dim=-1)
            qh = q.view(b, s, h, QK_HEAD).transpose(1, 2)
            kh = k.view(b, s, h, QK_HEAD).transpose(1, 2)
            vh = v.reshape(b, s, h, V_HEAD).transpose(1, 2)
            if contiguous:
                qh, kh, vh = qh.contiguous(), kh.contiguous(), vh.contiguous()
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale)
            return o.transpose(1, 2).reshape(t, h * V_HEAD)

        self.measure(row, inputs, lambda x: run(x, False), footprint=row["bytes"],
                     fallback=(lambda x: run(x, True), "cuDNN rejected strided views; timed with contiguous copies"))

    def up_projection(self, h):
        t = TOKENS
        n = h * 256
        row = {"what": "cublas_up_projection", "num_heads": h, "num_tokens": t,
               "shape": f"[{t},{LATENT}]x[{LATENT},{n}]",
               "flops": 2.0 * t * LATENT * n, "bytes": 2.0 * (t * LATENT + LATENT * n + t * n)}
        self.measure(row,
                     lambda: (randn(t, LATENT), randn(n, LATENT, scale=LATENT ** -0.5),
                              torch.empty(t, n, dtype=torch.bfloat16, device="cuda")),
                     lambda x: torch.matmul(x[0], x[1].t(), out=x[2]),
                     footprint=row["bytes"])

    # ------------------------------------------------------------ sparse route GEMMs
    def absorption_bmm(self, h):
        t = TOKENS
        row = {"what": "absorption_bmm", "num_heads": h, "num_tokens": t,
               "shape": f"[{h},{t},{NOPE}]x[{h},{NOPE},{LATENT}]",
               "flops": 2.0 * h * t * NOPE * LATENT, "bytes": 2.0 * h * (t * NOPE + NOPE * LATENT + t * LATENT)}
        self.measure(row,
                     lambda: (randn(h, t, NOPE), randn(h, NOPE, LATENT, scale=NOPE ** -0.5),
                              torch.empty(h, t, LATENT, dtype=torch.bfloat16, device="cuda")),
                     lambda x: torch.bmm(x[0], x[1], out=x[2]),
                     footprint=row["bytes"])

    def output_bmm(self, h):
        t = TOKENS
        row = {"what": "output_bmm", "num_heads": h, "num_tokens": t,
               "shape": f"[{h},{t},{LATENT}]x[{h},{LATENT},{V_HEAD}]",
               "flops": 2.0 * h * t * LATENT * V_HEAD,
               "bytes": 2.0 * h * (t * LATENT + LATENT * V_HEAD + t * V_HEAD)}
        self.measure(row,
                     lambda: (randn(h, t, LATENT), randn(h, LATENT, V_HEAD, scale=LATENT ** -0.5),
                              torch.empty(h, t, V_HEAD, dtype=torch.bfloat16, device="cuda")),
                     lambda x: torch.bmm(x[0], x[1], out=x[2]),
                     footprint=row["bytes"])


def environment():
    props = torch.cuda.get_device_properties(0)
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": os.environ.get("DSMLA_GIT_COMMIT", "unknown"),
        "gpu": torch.cuda.get_device_name(0),
        "multiprocessors": props.multi_processor_count,
        "l2_bytes": getattr(props, "L2_cache_size", None),
        "memory_bytes": props.total_memory,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "python": sys.version.split()[0],
    }


def markdown(env, bench, args):
    gemm, copy = bench.gemm_tflops, bench.copy_tbps
    lines = [
        "# torch baselines",
        "",
        f"Date {env['date']}, commit {env['commit']}, {env['gpu']}, torch {env['torch']}, "
        f"CUDA {env['cuda']}, cuDNN {env['cudnn']}.",
        f"Median of {args.repeats} CUDA-event timings after {args.warmup} warm-up calls, random bf16 data, "
        f"{TOKENS} tokens.",
        "",
        f"Ceilings measured in this run: bf16 matmul {GEMM_N}^3 **{gemm:.0f} TFLOP/s**; "
        f"device copy (2 GiB, read + write) **{copy:.2f} TB/s**.",
        "",
        "| what | S | H | ms | TFLOP/s | % GEMM | TB/s | % copy |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in bench.rows:
        if r["what"].startswith("ceiling"):
            continue
        s = str(r.get("seq_len", "–"))
        h = str(r.get("num_heads", "–"))
        if "error" in r:
            lines.append(f"| {r['what']} | {s} | {h} | error: {r['error'][:80]} | | | | |")
            continue
        tf = r.get("tflops", 0.0)
        tb = r.get("tbps", 0.0)
        lines.append(f"| {r['what']} | {s} | {h} | {r['median_ms']:.3f} | {tf:.0f} | "
                     f"{100 * tf / gemm if gemm else 0:.0f}% | {tb:.2f} | {100 * tb / copy if copy else 0:.0f}% |")
    lines += ["",
              "FLOPs count valid work: attention 2·pairs·H·(192+128) (causal pairs), GEMMs 2·M·N·K. "
              "TB/s counts compulsory traffic (inputs read once, outputs written once).", ""]
    notes = [r for r in bench.rows if "note" in r]
    if notes:
        lines += ["Notes:", ""]
        lines += [f"- {r['what']} S {r.get('seq_len', '–')} H {r.get('num_heads', '–')}: {r['note']}" for r in notes]
        lines.append("")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", help="write the results as JSON to this file")
    p.add_argument("--md", help="write the markdown table to this file")
    p.add_argument("--quick", action="store_true", help="S 1024, H 128 only")
    p.add_argument("--repeats", type=int, default=30, help="timed calls per row (median reported)")
    p.add_argument("--warmup", type=int, default=5, help="untimed calls before timing")
    args = p.parse_args()
    if args.repeats < 1 or args.warmup < 0:
        p.error("--repeats must be >= 1 and --warmup >= 0")
    if not torch.cuda.is_available():
        print("torch_baselines.py: no CUDA device is visible to torch", file=sys.stderr)
        return 1

    env = environment()
    log(f"{env['gpu']}, torch {env['torch']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}")
    seq_lens = [1024] if args.quick else [128, 256, 512, 1024, 2048, 4096]
    heads = [128] if args.quick else [128, 16]

    bench = Bench(args)
    bench.ceilings()
    for h in heads:
        for s in seq_lens:
            bench.sdpa(s, h)
        for s in seq_lens:
            bench.dense_route(s, h)
        bench.up_projection(h)
        bench.absorption_bmm(h)
        bench.output_bmm(h)

    for r in bench.rows:
        if "tflops" in r and bench.gemm_tflops and not r["what"].startswith("ceiling"):
            r["frac_gemm_ceiling"] = r["tflops"] / bench.gemm_tflops
        if "tbps" in r and bench.copy_tbps and not r["what"].startswith("ceiling"):
            r["frac_copy_ceiling"] = r["tbps"] / bench.copy_tbps

    md = markdown(env, bench, args)
    print(md)
    if args.md:
        with open(args.md, "w") as f:
            f.write(md)
    if args.json:
        result = {
            "tool": "bench/torch_baselines.py",
            **env,
            "settings": {"repeats": args.repeats, "warmup": args.warmup, "quick": args.quick,
                         "tokens": TOKENS, "softmax_scale": softmax_scale(),
                         "statistic": "median of CUDA-event timings after warm-up"},
            "ceilings": {"gemm_bf16_tflops": bench.gemm_tflops, "device_copy_tbps": bench.copy_tbps},
            "rows": bench.rows,
        }
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    failed = [r for r in bench.rows if "error" in r]
    if failed:
        log(f"{len(failed)} row(s) failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
