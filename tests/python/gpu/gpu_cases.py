"""Case files for the GPU tests (written by dsmla.make_case, no CLI needed)
and their tensors as torch tensors."""
import numpy as np
import torch

import dsmla

CASES = {
    "mixed_bf16": dict(seq_lens=[200, 37, 90, 64], query_lens=[1, 37, 16, 64], num_heads=16, topk=64),
    "mixed_fp8_ds_mla": dict(seq_lens=[150, 20, 700], query_lens=[1, 20, 70], num_heads=64, topk=128,
                             cache_format="fp8_ds_mla", block_size=16, padding_tokens=3),
    "fp8_random_topk": dict(seq_lens=[96, 33], query_lens=[2, 33], num_heads=32, topk=32, cache_format="fp8",
                            k_scale=0.5, topk_fill="random_subset", seed=7),
    "decode_h128": dict(seq_lens=[300, 129, 64, 1000], query_lens=[1, 1, 1, 1], num_heads=128, topk=128),
}

TENSORS = ["q", "kv_c", "k_pe", "w_kv_b", "kv_cache", "block_table", "seq_lens", "query_start_loc",
           "slot_mapping", "topk_indices"]
BF16 = {"q", "kv_c", "k_pe", "w_kv_b"}


def write(tmp_path, name):
    path = str(tmp_path / f"{name}.safetensors")
    dsmla.make_case(path, **CASES[name])
    return path


def torch_inputs(c, device):
    """The case's tensors on `device` (bf16 ones as torch.bfloat16)."""
    t = {}
    for k in TENSORS:
        a = c[k]
        if a is None:
            t[k] = None
            continue
        x = torch.from_numpy(np.ascontiguousarray(a))
        t[k] = (x.view(torch.bfloat16) if k in BF16 else x).to(device)
    return t


def index_inputs(c, device, num_heads=16, head_dim=128, seed=5):
    """Random inputs of dsmla's lightning indexer for case `c` (DESIGN §6):
    e4m3 query codes, weights, new keys and a filled index cache (codes of
    every cached position, then the block's positive fp32 scales)."""
    g = torch.Generator().manual_seed(seed)
    T, N, B = c["num_tokens"], c["num_cache_blocks"], c["block_size"]
    e4m3 = torch.float8_e4m3fn
    codes = (torch.randn(N, B * head_dim, generator=g) * 64).to(e4m3).view(torch.uint8)
    scales = (torch.rand(N, B, generator=g) * 0.02 + 1e-3).view(torch.uint8).reshape(N, B * 4)
    return {
        "index_q": (torch.randn(T, num_heads, head_dim, generator=g) * 64).to(e4m3).view(torch.uint8).to(device),
        "index_weights": (torch.randn(T, num_heads, generator=g) * 0.01).to(device),
        "index_k": torch.randn(T, head_dim, generator=g).to(torch.bfloat16).to(device),
        "index_cache": torch.cat([codes, scales], 1).reshape(N, B, head_dim + 4).contiguous().to(device),
        "topk_indices_out": torch.full((T, c["topk"]), 7, dtype=torch.int32, device=device),
    }


def attention_for(c, device, policy=None, **options):
    import dsmla.torch as dt
    att = dt.Attention(c["num_heads"], cache_format=c["cache_format"], topk=c["topk"],
                       policy=policy or c["policy"], decode_threshold=c["decode_threshold"], device=device,
                       **options)
    att.plan(c["query_start_loc"], c["seq_lens"], c["block_table"], c["slot_mapping"], c["num_cache_blocks"],
             c["block_size"])
    return att


def call(att, t, c, index=None, **kw):
    """att's forward on the case's tensors; index: the indexer's inputs (index_inputs)."""
    return att(t["q"], t["kv_c"], t["k_pe"], t["w_kv_b"], t["kv_cache"], t["block_table"], t["seq_lens"],
               t["query_start_loc"], t["slot_mapping"], None if index else t["topk_indices"], c["softmax_scale"],
               k_scale=c["k_scale"], **(index or {}), **kw)


def as_numpy(out, lse, cache):
    return out.float().cpu().numpy(), lse.cpu().numpy(), cache.cpu().numpy()
