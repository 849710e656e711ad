#!/usr/bin/env python3
"""FlashAttention-3 on the dense kernel harness's cached-prefix case, for issue 9's
bar "cached prefix: at least FlashAttention-3's TFLOP/s, same call".

The case of tools/bench/kernels/dense_mha_kernel_bench.cu (row "prefix8x1024+3072"):
8 requests of 1024 new tokens over 3072 cached positions (4096 keys each), H 128,
q/k head dim 192, v head dim 128, bf16, causal aligned bottom-right (new token i of
a request sees keys 0 .. 3072 + i), random normal data. FA3 runs it as varlen with
cu_seqlens_q != cu_seqlens_k. FLOPs are counted as the harness counts them:
2 * (visible query-key pairs) * H * (192 + 128).

The anchor wheels of ../shared/anchors carry flash_attn_interface; on the GPU machine:
  pip install --no-index --no-deps --target "$A" .anchors/*.whl
  PYTHONPATH=$A python3 bench/fa3_prefix.py [--json OUT.json]
Median of 30 CUDA-event timings after 5 warm-ups.
"""
import argparse
import json
import statistics

import torch

REQUESTS, NEW, CACHED, HEADS = 8, 1024, 3072, 128


def visible_pairs():
    # new token i sees CACHED + i + 1 keys
    return REQUESTS * (NEW * CACHED + NEW * (NEW + 1) // 2)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the result here as well")
    args = parser.parse_args()
    from flash_attn_interface import flash_attn_varlen_func

    dev = "cuda"
    keys = CACHED + NEW
    q = torch.randn(REQUESTS * NEW, HEADS, 192, device=dev, dtype=torch.bfloat16)
    k = torch.randn(REQUESTS * keys, HEADS, 192, device=dev, dtype=torch.bfloat16)
    v = torch.randn(REQUESTS * keys, HEADS, 128, device=dev, dtype=torch.bfloat16)
    cu_q = torch.arange(0, REQUESTS + 1, device=dev, dtype=torch.int32) * NEW
    cu_k = torch.arange(0, REQUESTS + 1, device=dev, dtype=torch.int32) * keys

    def run():
        return flash_attn_varlen_func(q, k, v, cu_q, cu_k, NEW, keys, causal=True)

    for _ in range(5):
        run()
    times = []
    for _ in range(30):
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        run()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    ms = statistics.median(times)
    tflops = 2.0 * visible_pairs() * HEADS * (192 + 128) / (ms * 1e-3) / 1e12
    result = {
        "what": "fa3_prefix",
        "case": f"{REQUESTS}x{NEW}+{CACHED}",
        "H": HEADS,
        "ms": ms,
        "tflops": tflops,
        "gpu": torch.cuda.get_device_name(),
    }
    print(f"fa3 prefix {result['case']} H {HEADS}: {ms:.3f} ms, {tflops:.1f} TFLOP/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
