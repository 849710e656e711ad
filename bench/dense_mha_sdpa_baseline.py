#!/usr/bin/env python3
"""cuDNN SDPA baseline for the dense MHA kernel, same shapes as
tools/bench/kernels/dense_mha_kernel_bench.cu (build/dense_mha_kernel_bench): 16384 query tokens in causal sequences of S
(B = 16384 / S), q/k head dim 192, v head dim 128, bf16, random data.
Median of 30 CUDA-event timings after 5 warm-ups.

Usage: python3 bench/dense_mha_sdpa_baseline.py [label=ours.txt ...]
Each ours.txt holds "S H ms" lines written by the kernel bench; with them the
script also prints each one's time and its ratio to cuDNN per shape.
"""
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

TOKENS = 16384


def time_cudnn(seq, heads):
    b = TOKENS // seq
    q = torch.randn(b, heads, seq, 192, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, heads, seq, 192, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, heads, seq, 128, device="cuda", dtype=torch.bfloat16)
    times = []
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        for _ in range(5):
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
        for _ in range(30):
            e0 = torch.cuda.Event(enable_timing=True)
            e1 = torch.cuda.Event(enable_timing=True)
            e0.record()
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
            e1.record()
            e1.synchronize()
            times.append(e0.elapsed_time(e1))
    return statistics.median(times)


def tflops(seq, heads, ms):
    pairs = (TOKENS // seq) * seq * (seq + 1) / 2
    return 2 * pairs * heads * (192 + 128) / (ms * 1e-3) / 1e12


def main():
    ours = {}  # label -> {(S, H): ms}
    for arg in sys.argv[1:]:
        label, _, path = arg.rpartition("=")
        table = ours.setdefault(label or path, {})
        with open(path) as f:
            for line in f:
                s, h, ms = line.split()
                table[(int(s), int(h))] = float(ms)
    header = f"{'S':>5} {'H':>4} {'cudnn ms':>9} {'TFLOP/s':>8}"
    for label in ours:
        header += f" | {label + ' ms':>12} {'TFLOP/s':>8} {'/cudnn':>6}"
    print(header)
    for heads in (128, 16):
        for seq in (512, 1024, 2048):
            ms = time_cudnn(seq, heads)
            line = f"{seq:5d} {heads:4d} {ms:9.3f} {tflops(seq, heads, ms):8.1f}"
            for table in ours.values():
                o = table.get((seq, heads))
                line += f" | {o:12.3f} {tflops(seq, heads, o):8.1f} {o / ms:6.2f}" if o else " | " + " " * 28
            print(line, flush=True)


if __name__ == "__main__":
    main()
