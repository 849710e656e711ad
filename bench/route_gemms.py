#!/usr/bin/env python3
"""The decode route's two per-head GEMMs through cuBLAS, against the weight-streaming floor, on the GPU machine.

The sparse route (DESIGN §2) runs, per step, two batched GEMMs over the heads of w_kv_b [H * 256, 512] bf16:

  absorption  q_lat[h] (512 x n) = W_UK(h)^T (512 x 128) q_nope[h] (128 x n)     W_UK: rows 0-127 of head h
  output      out[h]   (128 x n) = W_UV(h)   (128 x 512) o_lat[h] (512 x n)       W_UV: rows 128-255 of head h

each reading 16.8 MB of weights at H 128. The backend calls cublasGemmStridedBatchedEx in the column-major
form above (src/cuda/backend/cuda_backend.cu, run_sparse); backend/NOTES.md measured them at 52-60 % of the
copy ceiling under ncu. This script asks whether cuBLAS has a faster way for these shapes: it times each
GEMM in several equivalent torch formulations (each a cuBLAS batched GEMM with other operand orders, so
cuBLAS's heuristics may pick other kernels) and, as its floor, a sum reading as many bytes as the GEMM must
move. Every timed call reads weights L2 has not seen (copies cycled past twice the L2, torch_baselines.py's
copies_for, as a model's layers each have their own), so the figures are those of a decode step, not of a warm
loop.

  python3 bench/route_gemms.py [--heads 128] [--batches 16,64,128] [--json FILE] [--md FILE]

Each figure is a median over 20 replays of a CUDA graph holding K calls in a row (K at least 16, and a whole pass
over the cold copies), divided by K: a graph replays without the host's launch path, which event pairs around
single torch calls measure instead (about 25 us a call on the H100 of session 49, whatever the GEMM: that
version's figures are withdrawn, backend/NOTES.md).
"""
import argparse, json, statistics

import torch

from torch_baselines import copies_for, time_ms  # the same cold-input timing as the torch baselines

LATENT, NOPE, V_DIM = 512, 128, 128


def median_us(fn, l2_bytes, footprint, make):
    """Median us of one fn(x), x cycling over copies of make() so that a pass over them exceeds 2 x L2 (cold data):
    K calls captured in one CUDA graph, its replays timed, the median divided by K."""
    copies = [make() for _ in range(copies_for(footprint, l2_bytes))]
    calls = max(16, len(copies))
    side = torch.cuda.Stream()  # cuBLAS picks its kernels and workspace before the capture, as torch's docs ask
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(3):
            fn(copies[i % len(copies)])
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(copies[i % len(copies)])
    us = statistics.median(time_ms(lambda i: graph.replay(), 3, 20)) * 1e3 / calls
    del graph
    return us


def gemm_bytes(kind, heads, n):
    """DRAM bytes one GEMM must move: its weights, its activation input and its output, each once."""
    weights = heads * NOPE * LATENT * 2
    if kind == "absorption": return weights + n * heads * (NOPE + LATENT) * 2  # q_nope in, q_lat out
    return weights + n * heads * (LATENT + V_DIM) * 2  # o_lat in, out out


def formulations(heads, n):
    """name -> (kind, fn, footprint, make): fn(x) runs one GEMM on weights x (or reads x for a floor), where x is
    one of the cold copies of make(). torch.bmm of row-major [H, m, k] x [H, k, n] calls cuBLAS on the column-major
    transposes, so the rows that put the tokens on C's rows are the backend's own calls (cuBLAS m = 512 resp. 128,
    the weights as A)."""
    dev = torch.device("cuda")
    q_nope = torch.randn(n, heads, NOPE, device=dev, dtype=torch.bfloat16)
    o_lat = torch.randn(n, heads, LATENT, device=dev, dtype=torch.bfloat16)
    weights = (heads * 2 * NOPE * LATENT * 2,
               lambda: torch.randn(heads, 2 * NOPE, LATENT, device=dev, dtype=torch.bfloat16))
    w_uk = lambda w: w[:, :NOPE, :]  # [H, 128, 512]
    w_uv = lambda w: w[:, NOPE:, :]  # [H, 128, 512]

    def floor(kind):
        size = gemm_bytes(kind, heads, n)
        return (kind + " floor", lambda x: x.sum(), size,
                lambda: torch.empty(size // 2, device=dev, dtype=torch.bfloat16))

    return {
        "absorption, C = q W, tokens as rows (the backend's call)":
            ("absorption", lambda w: torch.bmm(q_nope.transpose(0, 1), w_uk(w)), *weights),
        "absorption, C = W^T q, tokens as columns":
            ("absorption", lambda w: torch.bmm(w_uk(w).transpose(1, 2), q_nope.permute(1, 2, 0)), *weights),
        "absorption floor: a read of its bytes": floor("absorption"),
        "output, C = o W^T, tokens as rows (the backend's call)":
            ("output", lambda w: torch.bmm(o_lat.transpose(0, 1), w_uv(w).transpose(1, 2)), *weights),
        "output, C = W o, tokens as columns":
            ("output", lambda w: torch.bmm(w_uv(w), o_lat.permute(1, 2, 0)), *weights),
        "output floor: a read of its bytes": floor("output"),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", type=int, default=128)
    ap.add_argument("--batches", default="16,64,128")
    ap.add_argument("--json"); ap.add_argument("--md")
    args = ap.parse_args()
    props = torch.cuda.get_device_properties(0)
    l2_bytes = getattr(props, "L2_cache_size", 60 << 20) or (60 << 20)
    rows = []
    for n in [int(b) for b in args.batches.split(",")]:
        for name, (kind, fn, footprint, make) in formulations(args.heads, n).items():
            us = median_us(fn, l2_bytes, footprint, make)
            rows.append({"batch": n, "heads": args.heads, "formulation": name, "kind": kind, "us": us})
            torch.cuda.empty_cache()
    for r in rows:
        kind = r["kind"].removesuffix(" floor")
        r["bytes"] = gemm_bytes(kind, args.heads, r["batch"])
        floor = next(x["us"] for x in rows if x["batch"] == r["batch"] and x["kind"] == kind + " floor")
        r["x_floor"] = r["us"] / floor
    title = (f"Route GEMMs (bench/route_gemms.py): {torch.cuda.get_device_name()}, torch {torch.__version__}, "
             f"H {args.heads}; us of one call on cold weights (median of CUDA-graph replays of K calls, / K); "
             f"x floor = time / a sum reading as many bytes as the GEMM moves (weights, input, output once each)")
    lines = [title, "", "| batch | formulation | MB | us | x floor |", "|---|---|---|---|---|"]
    lines += [f"| {r['batch']} | {r['formulation']} | {r['bytes'] / 1e6:.1f} | {r['us']:.1f} | {r['x_floor']:.2f} |"
              for r in rows]
    print("\n".join(lines))
    if args.md: open(args.md, "w").write("\n".join(lines) + "\n")
    if args.json: json.dump({"title": title, "rows": rows}, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
