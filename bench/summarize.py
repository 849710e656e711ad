#!/usr/bin/env python3
"""Same-run comparison of `dsmla bench` against bench/torch_baselines.py.

Both JSON files must come from the same scripts/gpu-check.sh call (same GPU,
same minute).  Prints a markdown table: each dsmla time next to the baseline
that does the same work, and the ratio baseline / dsmla (> 1: dsmla faster).

  python3 bench/summarize.py BENCH.json TORCH.json
"""
import json
import sys


def main(bench_path, torch_path):
    bench = json.load(open(bench_path))
    torch = json.load(open(torch_path))

    def ours(what, s, h):
        for r in bench["rows"]:
            if r["what"] == what and r["seq_len"] == s and r["num_heads"] == h:
                return r["median_ms"]
        return None

    def theirs(what, s, h):
        for r in torch["rows"]:
            if r["what"] == what and r.get("num_heads") == h and (s is None or r.get("seq_len") == s):
                return r["median_ms"]
        return None

    ceil = {r["what"]: r for r in torch["rows"] if r["what"].startswith("ceiling")}
    gpu = bench['gpu']['name'] if isinstance(bench['gpu'], dict) else bench['gpu']
    print(f"Same run: {gpu}, {bench['date']}, commit {bench['commit']}. "
          f"Ceilings: cuBLAS bf16 GEMM {ceil['ceiling_gemm_bf16']['tflops']:.0f} TFLOP/s, "
          f"device copy {ceil['ceiling_device_copy']['tbps']:.2f} TB/s.\n")
    print("| S | H | dsmla dense kernel ms | cuDNN SDPA ms | cuDNN / dsmla "
          "| dsmla dense route ms | cuDNN + cuBLAS up-proj ms | ratio | torch-composed route ms | ratio "
          "| dsmla sparse route ms | sparse / dense route |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for h in (128, 16):
        up = theirs("cublas_up_projection", None, h)
        for s in (128, 256, 512, 1024, 2048, 4096):
            dk, dr, sr = ours("dense_kernel", s, h), ours("dense_route", s, h), ours("sparse_route", s, h)
            cu, tr = theirs("cudnn_sdpa", s, h), theirs("torch_dense_route", s, h)
            if None in (dk, dr, sr, cu, tr, up):
                continue
            print(f"| {s} | {h} | {dk:.3f} | {cu:.3f} | {cu / dk:.2f}x | {dr:.3f} | {cu + up:.3f} | "
                  f"{(cu + up) / dr:.2f}x | {tr:.3f} | {tr / dr:.2f}x | {sr:.3f} | {sr / dr:.2f}x |")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
