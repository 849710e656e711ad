#!/usr/bin/env python3
"""One call of an anchor kernel inside a cudaProfilerStart/Stop range, for Nsight Compute on the GPU machine:

  ncu --profile-from-start off -c 3 --set full -o REPORT python3 bench/profile_anchor.py flashmla|fa3|cudnn S H
  ncu --profile-from-start off -c 2 --set full -o REPORT python3 bench/profile_anchor.py flashmla_decode B H

with the anchor wheels on PYTHONPATH and ../shared/anchors/anchors_bench.py copied to .anchors/ (its workload
definitions are imported from there, so ours and the anchor's profiles are of the same work). flashmla: sparse
prefill (bf16 latent, topk_length); flashmla_decode: its fp8 sparse decode at batch B (the call anchors_bench.py
times, taken by bench/paired.py's captured_call: its split-KV kernel and the combine); fa3, cudnn: dense causal 192/128. Three warm-up calls run first, outside the
range. Used for bench/results/h200_2026-12-03_profiles_descriptors.md."""
import importlib.util, sys
import torch
spec = importlib.util.spec_from_file_location("ab", ".anchors/anchors_bench.py")
ab = importlib.util.module_from_spec(spec); spec.loader.exec_module(ab)
what, S, H = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if what == "flashmla":
    from flash_mla import flash_mla_sparse_fwd
    idx, length = ab.prefill_indices(S)
    q = torch.randn(ab.TOKENS, H, 576, device=ab.dev, dtype=torch.bfloat16)
    kv = torch.randn(ab.TOKENS, 1, 576, device=ab.dev, dtype=torch.bfloat16)
    f = lambda: flash_mla_sparse_fwd(q, kv, idx[:, None, :], 576 ** -0.5, 512, None, length)
elif what == "flashmla_decode":
    sys.path.insert(0, "bench")
    import paired
    f = paired.captured_call(ab, "flashmla_decode", S, H)
elif what == "fa3":
    from flash_attn_interface import flash_attn_varlen_func
    q, k, v, cu, _ = ab.dense_inputs(S, H)
    f = lambda: flash_attn_varlen_func(q, k, v, cu, cu, S, S, causal=True)
else:
    from torch.nn.attention import sdpa_kernel, SDPBackend
    R = ab.TOKENS // S
    q = torch.randn(R, H, S, 192, device=ab.dev, dtype=torch.bfloat16)
    k = torch.randn(R, H, S, 192, device=ab.dev, dtype=torch.bfloat16)
    v = torch.randn(R, H, S, 128, device=ab.dev, dtype=torch.bfloat16)
    def f():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
for _ in range(3): f()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
f(); torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
print(what, S, H, "done")
