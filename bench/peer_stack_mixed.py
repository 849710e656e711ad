#!/usr/bin/env python3
"""The peer stack on dsmla's mixed serving batch (issue 7's last row), on the GPU machine.

What an engine runs today for the batch of `dsmla bench`'s mixed rows (tools/bench/workloads.cpp,
mixed_batches: one 4096-token prompt, prompts of 300 / 500 / 700 / 900 / 1200 / 1500 / 1800 / 2000 tokens,
32 decodes over 3000 + 137 i positions, topk 2048, H 128 and 64), composed from the anchor kernels of
../shared/anchors with per-batch routing. The batch holds a prompt longer than topk, so per-batch routing
sends every prefill to the sparse (absorbed) path:

  q absorption   torch.bmm  q_nope [H, T, 128] x W_UK [H, 128, 512], then torch.cat with q_pe -> [T, H, 576]
  prefills       FlashMLA flash_mla_sparse_fwd with topk_length, over a bf16 latent of the prompts
  decodes        FlashMLA flash_mla_with_kvcache, fp8_ds_mla paged cache (656 B/token, block 64)
  output         torch.cat of both outputs, torch.bmm o_lat [H, T, 512] x W_UV [H, 512, 128]

Selections as dsmla bench draws them: position p of a request selects all of 0..p while p < topk, else one
position from each of topk equal strata of 0..p. Not timed (so the comparison favours the peer stack): the
cache write of the new tokens, and the fp8 -> bf16 dequantisation of the prompts' latent an engine does before
FlashMLA's sparse prefill (FlashMLA's prefill cannot read fp8 caches). Timing: median of 30 CUDA-event samples
of the whole stack after 5 warm-up runs, every input built once; each part is also timed alone.

  A=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --target $A .anchors/*.whl
  PYTHONPATH=$A python3 bench/peer_stack_mixed.py [--dsmla BENCH_JSON] [--json FILE] [--md FILE]

--dsmla takes the --json of `dsmla bench` from the same call and adds dsmla's per_request forward time and the
ratio dsmla / peer (the bar of issue 7: at most 0.8x).
"""
import argparse, json, math
import torch

dev = torch.device("cuda")
TOPK, BLOCK, D_QK, D_V, D_NOPE, D_ROPE = 2048, 64, 576, 512, 128, 64
PROMPTS = [4096, 300, 500, 700, 900, 1200, 1500, 1800, 2000]
DECODES = [3000 + 137 * i for i in range(32)]
SCALE = 1.0 / math.sqrt(D_NOPE + D_ROPE)  # 192^-0.5 (DESIGN §1 without mscale; timing does not depend on it)


def timeit(fn, iters=30, warmup=5):
    for _ in range(warmup): fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    ts.sort()
    return ts[len(ts) // 2]


def strata_positions(pos, gen):
    """[len(pos), TOPK] request-local selections of positions pos (see the module docstring)"""
    j = torch.arange(TOPK, device=dev)[None, :]
    full = torch.where(j <= pos[:, None], j, torch.full_like(j, -1))
    u = torch.rand(pos.numel(), TOPK, device=dev, generator=gen)
    strata = ((j + u) * (pos[:, None] + 1) / TOPK).floor().long().clamp(max=pos[:, None])
    return torch.where((pos < TOPK)[:, None], full, strata)


def prefill_inputs(gen):
    """Global indices [Tp, TOPK] into the prompts' latent rows, and topk_length [Tp]"""
    idx, length = [], []
    base = 0
    for S in PROMPTS:
        pos = torch.arange(S, device=dev)
        local = strata_positions(pos, gen)
        idx.append(torch.where(local >= 0, local + base, local))
        length.append(torch.clamp(pos + 1, max=TOPK))
        base += S
    return torch.cat(idx).to(torch.int32), torch.cat(length).to(torch.int32)


def decode_inputs(gen):
    """The fp8_ds_mla paged cache of the decodes and their selected slots [B, TOPK]"""
    blocks = [(L + BLOCK - 1) // BLOCK for L in DECODES]
    nb = sum(blocks)
    cache = torch.randint(0, 256, (nb, BLOCK, 1, 656), dtype=torch.uint8, device=dev, generator=gen)
    cache[..., :512] &= 0x77                                                    # finite e4m3 codes
    cache[..., 512:528] = torch.full((4,), 0.01).view(torch.uint8).to(dev)       # tile scales
    cache[..., 528:] = torch.randn(64).to(torch.bfloat16).view(torch.uint8).to(dev)
    perm = torch.randperm(nb, device=dev, generator=gen)
    slots, first = [], 0
    for L, n in zip(DECODES, blocks):
        table = perm[first:first + n]; first += n
        pos = strata_positions(torch.tensor([L - 1], device=dev), gen)[0]       # the new token at position L - 1
        slots.append(table[pos // BLOCK] * BLOCK + pos % BLOCK)
    return cache, torch.stack(slots).to(torch.int32)


def peer_stack(H, gen):
    from flash_mla import flash_mla_sparse_fwd, flash_mla_with_kvcache, get_mla_metadata
    Tp, B = sum(PROMPTS), len(DECODES)
    T = Tp + B
    q = torch.randn(T, H, D_NOPE + D_ROPE, device=dev, dtype=torch.bfloat16, generator=gen)
    w_uk = torch.randn(H, D_NOPE, D_V, device=dev, dtype=torch.bfloat16, generator=gen) / math.sqrt(D_V)
    w_uv = torch.randn(H, D_V, D_NOPE, device=dev, dtype=torch.bfloat16, generator=gen) / math.sqrt(D_V)
    latent = torch.randn(Tp, 1, D_QK, device=dev, dtype=torch.bfloat16, generator=gen)
    idx_pre, len_pre = prefill_inputs(gen)
    cache, slots = decode_inputs(gen)
    cache8 = cache.view(torch.float8_e4m3fn)
    meta, _ = get_mla_metadata()

    def absorb():
        q_lat = torch.bmm(q[:, :, :D_NOPE].transpose(0, 1), w_uk)             # [H, T, 512]
        return torch.cat([q_lat.transpose(0, 1), q[:, :, D_NOPE:]], dim=-1)   # [T, H, 576]

    q_full = absorb()

    def prefill(qf):
        return flash_mla_sparse_fwd(qf[:Tp], latent, idx_pre[:, None, :], SCALE, D_V, None, len_pre)[0]

    def decode(qf):
        return flash_mla_with_kvcache(qf[Tp:].unsqueeze(1), cache8, None, None, D_V, meta, None,
                                      softmax_scale=SCALE, is_fp8_kvcache=True, indices=slots[:, None, :])[0]

    o_pre, o_dec = prefill(q_full), decode(q_full)

    def output(op, od):
        o_lat = torch.cat([op, od.reshape(B, H, D_V)], 0)                     # [T, H, 512]
        return torch.bmm(o_lat.transpose(0, 1), w_uv)                         # [H, T, 128]

    def whole():
        qf = absorb()
        return output(prefill(qf), decode(qf))

    row = dict(H=H, tokens=T, prefill_tokens=Tp, decodes=B)
    row["peer_ms"] = timeit(whole)
    row["absorb_ms"] = timeit(absorb)
    row["prefill_ms"] = timeit(lambda: prefill(q_full))
    row["decode_ms"] = timeit(lambda: decode(q_full))
    row["output_ms"] = timeit(lambda: output(o_pre, o_dec))
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsmla", help="dsmla bench --json of the same call"); ap.add_argument("--json"); ap.add_argument("--md")
    a = ap.parse_args()
    gen = torch.Generator(device=dev); gen.manual_seed(7)
    dsmla = {}
    if a.dsmla:
        for m in json.load(open(a.dsmla)).get("mixed", []):
            if "forward_ms" in m and m.get("cache") == "fp8_ds_mla":
                dsmla[m["heads"]] = (m["forward_ms"], m.get("split_ms"))
    rows = []
    for H in (128, 64):
        try:
            r = peer_stack(H, gen)
            if H in dsmla:
                forward, split = dsmla[H]
                r["dsmla_forward_ms"] = forward; r["dsmla_over_peer"] = forward / r["peer_ms"]
                if split:
                    r["dsmla_split_ms"] = split; r["dsmla_split_over_peer"] = split / r["peer_ms"]
        except Exception as e:  # one failing head count must not hide the other
            r = dict(H=H, error=repr(e)[:300])
        rows.append(r); print(r, flush=True)
    env = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda,
               prompts=PROMPTS, decodes=DECODES, topk=TOPK)
    if a.json:
        json.dump(dict(env=env, rows=rows), open(a.json, "w"), indent=1)
    if a.md:
        with open(a.md, "w") as f:
            f.write(f"Peer stack on the mixed batch, {env['gpu']}, torch {env['torch']} (per-batch routing: all prefills "
                    "sparse; cache write and fp8 -> bf16 dequantisation not timed)\n\n"
                    "| H | peer ms | absorb | FlashMLA prefill | FlashMLA fp8 decode | output | dsmla forward ms | dsmla / peer "
                    "| dsmla split_at_topk ms | split / peer |\n"
                    "|---|---|---|---|---|---|---|---|---|---|\n")
            for r in rows:
                if "error" in r:
                    f.write(f"| {r['H']} | failed: {r['error']} |||||||||\n"); continue
                d = f"{r['dsmla_forward_ms']:.3f} | {r['dsmla_over_peer']:.2f}x" if "dsmla_forward_ms" in r else "– | –"
                d += f" | {r['dsmla_split_ms']:.3f} | {r['dsmla_split_over_peer']:.2f}x" if "dsmla_split_ms" in r else " | – | –"
                f.write(f"| {r['H']} | {r['peer_ms']:.3f} | {r['absorb_ms']:.3f} | {r['prefill_ms']:.3f} | "
                        f"{r['decode_ms']:.3f} | {r['output_ms']:.3f} | {d} |\n")


if __name__ == "__main__":
    main()
