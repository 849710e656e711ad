"""dsmla.Attention: the plan / run API of include/dsmla/attention.hpp."""
from __future__ import annotations

import json
import os

import numpy as np

from . import _dsmla


def _host(x, dtype, name):
    # The planner reads host copies of the batch metadata; lists, NumPy
    # arrays and CPU tensors all go through NumPy (no copy when already right).
    try:
        return np.ascontiguousarray(x, dtype=dtype)
    except (TypeError, ValueError, RuntimeError) as e:
        raise _dsmla.Error(f"{name}: expected a host array of {np.dtype(dtype).name} "
                           f"(plan() reads host memory): {e}") from None


def _stream_handle(stream):
    # cudaStream_t as an integer: None (the legacy default stream), an int,
    # or a stream object of torch (.cuda_stream) or CuPy (.ptr).
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    raise _dsmla.Error(f"stream: expected None, an int (cudaStream_t) or a stream object, got {type(stream).__name__}")


class Attention:
    """One layer's DeepSeek-V3.2 attention forward (DESIGN §2), plan once, run many.

    backend: "cpu", "cuda" or "auto" (cuda when a GPU is usable).
    policy: "per_request", "per_batch", "force_sparse" or "split_at_topk" (docs/api.md, Routing).
    dense_cost_factor: multiplies the dense side of the cost model (None: 1.0).
    cost_factors: instead, the path of a `dsmla bench --calibrate` file (the
    factor measured for the nearest head count).
    indexer: the lightning indexer (DESIGN §6) chooses each sparse token's
    top-k; run() then takes the index inputs instead of topk_indices.
    """

    def __init__(self, num_heads, cache_format="bf16", topk=2048, backend="auto", policy="per_request",
                 decode_threshold=1, dense_cost_factor=None, *, cost_factors=None, indexer=False,
                 index_num_heads=64, index_head_dim=128):
        if cost_factors is not None:
            if dense_cost_factor is not None:
                raise _dsmla.Error("dense_cost_factor and cost_factors exclude each other")
            dense_cost_factor = _dsmla.cost_factor_for(os.fspath(cost_factors), int(num_heads))
        self._native = _dsmla.Attention(int(num_heads), str(cache_format), int(topk), str(backend), str(policy),
                                        int(decode_threshold),
                                        1.0 if dense_cost_factor is None else float(dense_cost_factor),
                                        bool(indexer), int(index_num_heads), int(index_head_dim))
        self.indexer = bool(indexer)
        self.num_heads = int(num_heads)
        self.cache_format = str(cache_format)
        self.topk = int(topk)
        self.policy = str(policy)
        self._plan = None

    @property
    def backend(self):
        """"cpu" or "cuda" (what "auto" chose)."""
        return self._native.backend

    @property
    def workspace_bytes(self):
        """Bytes of workspace run() needs for the current plan (device memory on cuda)."""
        return self._native.workspace_bytes

    @property
    def current_plan(self):
        return self._plan

    def plan(self, query_start_loc, seq_lens, block_table, slot_mapping, num_cache_blocks, block_size):
        """Plans a batch from host metadata (int32, slot_mapping int64; lists are fine).

        block_table is [R, max_blocks_per_request]; the number of token rows T
        is len(slot_mapping). Planning an identical batch again reuses the plan.
        """
        bt = _host(block_table, np.int32, "block_table")
        if bt.ndim == 1 and bt.size == 0:
            bt = bt.reshape(0, 0)
        plan = self._native.plan(_host(query_start_loc, np.int32, "query_start_loc"),
                                 _host(seq_lens, np.int32, "seq_lens"), bt,
                                 _host(slot_mapping, np.int64, "slot_mapping"), int(num_cache_blocks),
                                 int(block_size))
        self._plan = Plan(plan)
        return self._plan

    def run(self, q, kv_c, k_pe, w_kv_b, kv_cache, block_table, seq_lens, query_start_loc, slot_mapping,
            topk_indices, out, lse, softmax_scale, k_scale=1.0, workspace=None, stream=None, *, q_scale=1.0,
            index_q=None, index_weights=None, index_k=None, index_cache=None, topk_indices_out=None):
        """Runs the planned batch: writes the new tokens into kv_cache, out and lse.

        Arrays: host arrays on the cpu backend, CUDA tensors on the cuda
        backend, C-contiguous, in the dtypes and shapes of docs/api.md (bf16
        as bfloat16 or as uint16 bits). topk_indices may be None when no token
        is sparse. workspace=None uses a buffer this object owns (allocated
        when a plan needs more: pass one to capture run() in a CUDA graph).
        stream: None, an int cudaStream_t, or a torch / CuPy stream.
        The cpu backend checks every top-k index; the cuda backend never
        allocates or synchronises.
        With indexer=True: topk_indices must be None, and index_q [T, Hi, Di]
        e4m3 codes (uint8), index_weights [T, Hi] float32, index_k [T, Di]
        bf16 and index_cache [num_blocks, block_size, Di + 4] uint8 (updated
        in place) are required; topk_indices_out [T, topk] int32, if given,
        receives the positions used (-1 rows for dense-routed tokens).
        """
        self._native.run(q, kv_c, k_pe, w_kv_b, kv_cache, block_table, seq_lens, query_start_loc, slot_mapping,
                         topk_indices, out, lse, float(softmax_scale), float(k_scale), float(q_scale), workspace,
                         _stream_handle(stream), index_q, index_weights, index_k, index_cache, topk_indices_out)


class Plan:
    """The routing of a planned batch (a copy: later plans do not change it)."""

    def __init__(self, native):
        self._native = native

    @property
    def workspace_bytes(self):
        return self._native.workspace_bytes

    @property
    def num_tokens(self):
        return self._native.num_tokens

    @property
    def num_requests(self):
        return self._native.num_requests

    @property
    def num_sparse_tokens(self):
        return self._native.num_sparse_tokens

    @property
    def id(self):
        """Distinct for every plan computed; the same when a plan was reused."""
        return self._native.id

    def to_json(self):
        return self._native.to_json()

    def to_dict(self):
        """The plan as `dsmla plan` prints it, parsed."""
        return json.loads(self._native.to_json())

    def __repr__(self):
        return f"<dsmla.Plan {self.num_tokens} tokens, {self.num_requests} requests, id {self.id}>"


def bf16_bits_to_float32(bits):
    """uint16 bf16 bits (NumPy) -> float32 values (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def float32_to_bf16_bits(x):
    """float32 -> uint16 bf16 bits, rounding to nearest even (NaN stays NaN)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where((u & 0x7FFFFFFF) > 0x7F800000, ((u >> 16) | 0x40).astype(np.uint16), rounded)
