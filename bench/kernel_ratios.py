#!/usr/bin/env python3
"""Ratio tables of the sparse MLA and dense MHA kernel harnesses against the anchors of the same GPU call.

  bench/kernel_ratios.py HARNESS_LOG ANCHORS_JSON [--title TEXT] > table.md

HARNESS_LOG is the output of tools/bench/kernels/sparse_mla_kernel_bench.cu (its markdown rows
"| prefill bf16 H128 S1024 T16384 | us | TFLOP/s | ... | check |" and
"| decode fp8_ds_mla H128 B64 | ...") and of dense_mha_kernel_bench.cu ("causal S H ms
TFLOP/s ..." lines), ANCHORS_JSON the --json output of
../shared/anchors/anchors_bench.py from the same call. Prefill rows are matched to
FlashMLA's sparse prefill (bf16 latent, topk_length) at the same S and H; decode
rows to FlashMLA's fp8 sparse decode at the same batch and H. Rows without an
anchor (other head counts, other caches) get no ratio: FlashMLA does not run them.
Dense rows are matched to the faster of FlashAttention-3 and cuDNN at the same S and H.
"""
import json, re, sys


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    title = sys.argv[sys.argv.index("--title") + 1] if "--title" in sys.argv else None
    if len(args) < 2:
        sys.exit(__doc__)
    harness, anchors = open(args[0]).read(), json.load(open(args[1]))
    prefill = {(r["S"], r["H"]): r["time"] * 1e3 for r in anchors["rows"] if r["what"] == "flashmla_sparse_prefill"}
    decode = {(r["B"], r["H"]): r["time"] for r in anchors["rows"] if r["what"] == "flashmla_fp8_decode"}
    env = anchors["env"]
    out = []
    if title:
        out.append(f"## {title}\n")
    out.append(f"Anchors of the same call: {env['gpu']}, FlashMLA {env['flashmla']}, ceilings: bf16 GEMM "
               f"{env['ceilings']['gemm_bf16_tflops']:.0f} TFLOP/s, copy {env['ceilings']['copy_tbps']:.2f} TB/s.\n")
    out.append("| case | dsmla us | TFLOP/s | FlashMLA us (same call) | dsmla / FlashMLA | check |")
    out.append("|---|---|---|---|---|---|")
    row_re = re.compile(r"^\| (prefill|decode) (\S+) H(\d+) (?:S(\d+) T\d+|B(\d+)) \| ([\d.]+) \| ([\d.]+) \| [^|]* \| (\S+) \|")
    for line in harness.splitlines():
        m = row_re.match(line)
        if not m:
            continue
        kind, cache, h, s, b, us, tflops, check = m.groups()
        h = int(h)
        anchor = None
        if kind == "prefill" and cache == "bf16":
            anchor = prefill.get((int(s), h))
        elif kind == "decode" and cache == "fp8_ds_mla":
            anchor = decode.get((int(b), h))
        name = f"{kind} {cache} H{h} " + (f"S{s}" if s else f"B{b}")
        if anchor is None and h in (16, 32):
            # Issues 7 / 8: small heads against FlashMLA padded to 64 heads (its
            # smallest), bars 0.75x (prefill) and 0.4x (decode, batch >= 16).
            small = prefill.get((int(s), 64)) if kind == "prefill" and cache == "bf16" else (
                decode.get((int(b), 64)) if kind == "decode" and cache == "fp8_ds_mla" else None)
            if small:
                out.append(f"| {name} | {float(us):.1f} | {float(tflops):.0f} | {small:.1f} (H64) | "
                           f"{float(us) / small:.2f}x of H64 | {check} |")
                continue
        ratio = f"{float(us) / anchor:.2f}x" if anchor else "-"
        out.append(f"| {name} | {float(us):.1f} | {float(tflops):.0f} | {anchor:.1f} | {ratio} | {check} |"
                   if anchor else f"| {name} | {float(us):.1f} | {float(tflops):.0f} | - | - | {check} |")
    dense_anchor = {}
    for r in anchors["rows"]:
        if r["what"] in ("fa3_dense", "cudnn_dense") and "time" in r:
            key = (r["S"], r["H"])
            dense_anchor[key] = min(dense_anchor.get(key, float("inf")), r["time"])
    dense_re = re.compile(r"^causal\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)")
    dense_rows = [m.groups() for m in map(dense_re.match, harness.splitlines()) if m]
    if dense_rows:
        out.append("\n| dense case | dsmla ms | TFLOP/s | faster of FA3 / cuDNN ms (same call) | dsmla / anchor |")
        out.append("|---|---|---|---|---|")
        for s, h, ms, tflops in dense_rows:
            anchor = dense_anchor.get((int(s), int(h)))
            ratio = f"{float(ms) / anchor:.2f}x" if anchor else "-"
            out.append(f"| S{s} H{h} | {float(ms):.3f} | {float(tflops):.0f} | "
                       f"{f'{anchor:.3f}' if anchor else '-'} | {ratio} |")
    # The cached-prefix case against FlashAttention-3 on it (bench/fa3_prefix.py's
    # line in the same log); the last of each, the harness prints it once a round.
    ours = re.findall(r"^prefix8x1024\+3072\s+\d+\s+128\s+([\d.]+)\s+([\d.]+)", harness, re.M)
    fa3 = re.findall(r"^fa3 prefix 8x1024\+3072 H 128: ([\d.]+) ms, ([\d.]+) TFLOP/s", harness, re.M)
    if ours and fa3:
        (ms, tflops), (fa3_ms, fa3_tflops) = ours[-1], fa3[-1]
        out.append("\n| cached prefix 8 x 1024 over 3072, H 128 | dsmla ms | TFLOP/s | FA3 ms | FA3 TFLOP/s | dsmla / FA3 time |")
        out.append("|---|---|---|---|---|---|")
        out.append(f"| dense kernel | {float(ms):.3f} | {float(tflops):.0f} | {float(fa3_ms):.3f} | "
                   f"{float(fa3_tflops):.0f} | {float(ms) / float(fa3_ms):.2f}x |")
    print("\n".join(out))


if __name__ == "__main__":
    main()
