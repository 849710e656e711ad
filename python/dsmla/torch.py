"""dsmla.torch: dsmla as the torch.library custom op ``dsmla::forward``.

The op declares what it writes (kv_cache, out, lse, the scratch workspace,
and with the lightning indexer index_cache and topk_indices_out) and has a
fake implementation, so ``torch.compile`` traces it
without a graph break; on CUDA it runs on torch's current stream without
allocating or synchronising, so it can be captured in a CUDA graph.

``Attention`` owns the plan, the workspace and the op's handle:

    att = dsmla.torch.Attention(num_heads=16, topk=2048, device="cuda")
    att.plan(query_start_loc, seq_lens, block_table, slot_mapping, num_blocks, block_size)  # host metadata
    out, lse = att(q, kv_c, k_pe, w_kv_b, kv_cache, block_table, seq_lens, query_start_loc,
                   slot_mapping, topk_indices, softmax_scale)                            # device tensors

With ``indexer=True`` dsmla's lightning indexer (DESIGN §6) chooses the top-k:
topk_indices is None and the index inputs come as keywords (index_q,
index_weights, index_k, index_cache; topk_indices_out receives the selection).

Importing this module imports torch; ``import dsmla`` alone does not.
"""
import contextlib
import itertools
import weakref
from typing import Optional

import numpy as np
import torch
import torch.utils.dlpack

from . import _attention

# The op takes an integer handle: custom ops accept tensors and scalars only,
# and the handle stays a constant of a compiled graph.
_live = weakref.WeakValueDictionary()
_handles = itertools.count(1)


@torch.library.custom_op("dsmla::forward",
                         mutates_args=("kv_cache", "out", "lse", "workspace", "index_cache", "topk_indices_out"))
def forward(handle: int, q: torch.Tensor, kv_c: torch.Tensor, k_pe: torch.Tensor, w_kv_b: torch.Tensor,
            kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
            query_start_loc: torch.Tensor, slot_mapping: torch.Tensor, topk_indices: Optional[torch.Tensor],
            out: torch.Tensor, lse: torch.Tensor, workspace: torch.Tensor, softmax_scale: float,
            k_scale: float, q_scale: float, index_q: Optional[torch.Tensor], index_weights: Optional[torch.Tensor],
            index_k: Optional[torch.Tensor], index_cache: Optional[torch.Tensor],
            topk_indices_out: Optional[torch.Tensor]) -> None:
    """One planned forward of the Attention registered under `handle` (see Attention.forward).
    The index arguments are None unless the Attention has indexer=True (no
    defaults: torch 2.11 bumps the versions of the mutated arguments by
    position, and an omitted trailing one is then out of range)."""
    att = _live.get(handle)
    if att is None:
        raise RuntimeError(f"dsmla::forward: no live dsmla.torch.Attention has handle {handle}")
    stream = torch.cuda.current_stream(q.device).cuda_stream if q.is_cuda else 0
    # DLPack capsules, not the tensors: Tensor.__dlpack__() without a stream
    # makes the legacy default stream wait for the current one (an event),
    # which is extra work here and illegal while a CUDA graph is captured.
    c = _capsule
    att._native.run(c(q), c(kv_c), c(k_pe), c(w_kv_b), c(kv_cache), c(block_table), c(seq_lens),
                    c(query_start_loc), c(slot_mapping), c(topk_indices), c(out), c(lse), softmax_scale, k_scale,
                    workspace=c(workspace), stream=stream, q_scale=q_scale, index_q=c(index_q),
                    index_weights=c(index_weights), index_k=c(index_k), index_cache=c(index_cache),
                    topk_indices_out=c(topk_indices_out))


@forward.register_fake
def _forward_fake(handle, q, kv_c, k_pe, w_kv_b, kv_cache, block_table, seq_lens, query_start_loc, slot_mapping,
                  topk_indices, out, lse, workspace, softmax_scale, k_scale, q_scale, index_q, index_weights, index_k,
                  index_cache, topk_indices_out):
    # Writes only into its arguments: nothing to allocate, nothing returned.
    return None


def _capsule(x):
    return None if x is None else torch.utils.dlpack.to_dlpack(x)


def _host(x, dtype):
    # plan() reads host memory: a CUDA tensor is copied down (a sync; plan is not captured).
    if isinstance(x, torch.Tensor):
        x = x.detach().to("cpu").numpy()
    return np.ascontiguousarray(x, dtype=dtype)


class Attention:
    """dsmla.Attention for torch tensors: plan on the host, run through ``torch.ops.dsmla.forward``.

    device: where the tensors live ("cuda", "cuda:1", "cpu"); the backend follows it.
    indexer: dsmla's lightning indexer chooses the top-k (index_num_heads x
    index_head_dim queries; forward() then takes the index inputs).
    """

    def __init__(self, num_heads, cache_format="bf16", topk=2048, policy="per_request", decode_threshold=1,
                 dense_cost_factor=None, device=None, *, cost_factors=None, indexer=False, index_num_heads=64,
                 index_head_dim=128):
        self.device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self._native = _attention.Attention(num_heads, cache_format=cache_format, topk=topk,
                                            backend="cuda" if self.device.type == "cuda" else "cpu",
                                            policy=policy, decode_threshold=decode_threshold,
                                            dense_cost_factor=dense_cost_factor, cost_factors=cost_factors,
                                            indexer=indexer, index_num_heads=index_num_heads,
                                            index_head_dim=index_head_dim)
        self.indexer = bool(indexer)
        self.num_heads = int(num_heads)
        self.topk = int(topk)
        self.cache_format = str(cache_format)
        self.workspace = torch.empty(0, dtype=torch.uint8, device=self.device)
        self.handle = next(_handles)
        _live[self.handle] = self

    @property
    def workspace_bytes(self):
        return self._native.workspace_bytes

    def plan(self, query_start_loc, seq_lens, block_table, slot_mapping, num_cache_blocks, block_size):
        """Plans from host metadata (tensors are copied to the host) and grows the workspace."""
        with torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext():
            plan = self._native.plan(_host(query_start_loc, np.int32), _host(seq_lens, np.int32),
                                     _host(block_table, np.int32), _host(slot_mapping, np.int64),
                                     int(num_cache_blocks), int(block_size))
        if self.workspace.numel() < self._native.workspace_bytes:
            self.workspace = torch.empty(self._native.workspace_bytes, dtype=torch.uint8, device=self.device)
        return plan

    def forward(self, q, kv_c, k_pe, w_kv_b, kv_cache, block_table, seq_lens, query_start_loc, slot_mapping,
                topk_indices, softmax_scale, k_scale=1.0, q_scale=1.0, out=None, lse=None, *, index_q=None,
                index_weights=None, index_k=None, index_cache=None, topk_indices_out=None):
        """Runs the planned batch on torch's current stream; returns (out, lse).

        Shapes and dtypes as in docs/api.md: q [T, H, 192] bf16, kv_c [T, 512],
        k_pe [T, 64], w_kv_b [H*256, 512] bf16, kv_cache [blocks, block_size,
        bytes_per_token] (uint8, or any dtype tiling a token), int32 metadata,
        slot_mapping int64, topk_indices [T, topk] int32 or None. out [T, H*128]
        bf16 and lse [T, H] float32 are allocated unless given.
        With indexer=True: topk_indices None, index_q [T, Hi, Di] uint8 (e4m3
        codes), index_weights [T, Hi] float32, index_k [T, Di] bf16,
        index_cache [blocks, block_size, Di + 4] uint8 (written), and
        optionally topk_indices_out [T, topk] int32 (receives the selection;
        rows of dense-routed and padding tokens all -1).
        """
        T = q.shape[0]
        if out is None:
            out = torch.empty((T, self.num_heads * 128), dtype=torch.bfloat16, device=q.device)
        if lse is None:
            lse = torch.empty((T, self.num_heads), dtype=torch.float32, device=q.device)
        torch.ops.dsmla.forward(self.handle, q, kv_c, k_pe, w_kv_b, kv_cache, block_table, seq_lens,
                                query_start_loc, slot_mapping, topk_indices, out, lse, self.workspace,
                                float(softmax_scale), float(k_scale), float(q_scale), index_q, index_weights, index_k,
                                index_cache, topk_indices_out)
        return out, lse

    __call__ = forward

