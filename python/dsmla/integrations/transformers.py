"""dsmla under transformers' DeepSeek-V3.2 (``DeepseekV32ForCausalLM``, transformers 5.x).

    from dsmla.integrations import transformers as dsmla_hf
    state = dsmla_hf.enable(model, cache_format="fp8_ds_mla", max_seq_len=4096)
    logits = model(input_ids).logits              # prefill: the prompt of every row
    logits = model(next_ids[:, None]).logits      # decode steps: one token per row
    state.reset()                                 # new sequences
    dsmla_hf.disable(model)

``enable`` replaces the forward of every ``DeepseekV32Attention``: the layer's
own projections, norms and rotary embedding run as in transformers, and
attention is one ``torch.ops.dsmla.forward`` per layer over dsmla's paged
latent cache. The top-k comes from dsmla's lightning indexer (DESIGN §6): the
adapter computes the indexer's query, key and weights with the layer's own
indexer weights, as transformers' indexer does (``wq_b``, ``wk`` + ``k_norm``,
half-split rotary on the first ``qk_rope_head_dim`` dims, ``weights_proj``),
rotates query and key by the orthonormal Hadamard matrix and quantises the
query per (token, head) to e4m3 with scale amax / 448, folded into the
weights with ``index_head_dim^-0.5 · index_n_heads^-0.5`` (as DeepSeek's
reference inference does); dsmla stores the keys in its paged index cache and
selects. ``enable(model, indexer="transformers")`` instead runs transformers'
indexer module (bf16 / float32 scores, its own key cache) and passes its
top-k. The adapter owns the latent cache and the index cache (or the key cache
of transformers' indexer), so the model is called without a transformers
cache (``use_cache`` is forced off) and each call continues the sequences of
the previous one. Rows are requests; a call may
give them different lengths with a right-padded ``attention_mask`` (ones, then
zeros: a prefill of prompts of several lengths), and each row then continues
from its own length (one token per row per decode step, no mask needed).
Padded positions take no part and their logits are meaningless. Positions
are the adapter's, not ``position_ids``'.

``state.observer``, when set, is called after each layer's dsmla call as
``observer(layer_idx, step, tensors)``: ``tensors`` holds the ``kv_c`` and
``k_pe`` dsmla was given and the ``topk_indices`` it used ([T, topk] int32 in
dsmla's token order; with ``indexer="dsmla"`` rows of tokens routed dense are
all -1, with ``indexer="transformers"`` every row is transformers' selection),
and ``step.requests``
/ ``step.token_positions`` (NumPy) give each token's row and position.

Written against transformers' modeling_deepseek_v32.py of 2026 (attention
modules with q_a_proj / q_a_layernorm / q_b_proj / kv_a_proj_with_mqa /
kv_a_layernorm / kv_b_proj / o_proj, an ``indexer`` submodule with wq_b / wk /
k_norm / weights_proj returning top-k positions and storing its keys through
``update_indexer`` of the cache it is given as ``cache`` (transformers 5.24)
or ``past_key_values`` (earlier)).
"""
import inspect
import math
import sys

import numpy as np
import torch

from .. import bytes_per_token
from .. import torch as dsmla_torch

_DIMS = {"qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "kv_lora_rank": 512}


def _attention_modules(model):
    mods = [m for m in model.modules() if type(m).__name__ == "DeepseekV32Attention"]
    if not mods:
        raise ValueError(f"{type(model).__name__} has no DeepseekV32Attention module")
    return mods


def _base_model(model):
    base = getattr(model, "model", model)
    if not hasattr(base, "layers"):
        raise ValueError(f"{type(model).__name__}: expected a DeepseekV32ForCausalLM or DeepseekV32Model")
    return base


class _IndexerCache:
    """What the indexer sees as ``past_key_values``: its keys of every position so far."""

    def __init__(self, state):
        self.state = state

    def update_indexer(self, keys, layer_idx):
        st = self.state
        buf = st.index_keys.get(layer_idx)
        if buf is None or buf.dtype != keys.dtype:
            buf = keys.new_zeros((st.num_requests, st.max_seq_len, keys.shape[-1]))
            st.index_keys[layer_idx] = buf
        step = st.step
        if step.valid is None:  # every row has `length` new tokens at the same positions
            buf[:, step.ctx_max:step.ctx_max + keys.shape[1]] = keys
        else:  # the valid tokens only, each at its row's position
            buf.view(-1, keys.shape[-1])[step.key_rows] = keys.reshape(-1, keys.shape[-1])[step.valid]
        return buf[:, :step.keys]


class _Step:
    """The batch metadata of one model call, shared by every layer."""

    def tokens(self, x):
        """[B * S, ...] rows -> the valid tokens' rows, in dsmla's token order."""
        return x if self.valid is None else x[self.valid]

    def rows(self, x, total):
        """The inverse of tokens(): valid rows back in place, zeros at padding."""
        if self.valid is None:
            return x
        full = x.new_zeros((total,) + tuple(x.shape[1:]))
        full[self.valid] = x
        return full


class DsmlaState:
    """The paged latent cache of every layer, the indexer's key caches and the sequence lengths."""

    def __init__(self, model, cache_format, policy, block_size, max_seq_len, dense_cost_factor, indexer):
        cfg = model.config
        if indexer not in ("dsmla", "transformers"):
            raise ValueError(f"dsmla: indexer must be 'dsmla' or 'transformers', got {indexer!r}")
        self.indexer = indexer
        self.config = cfg
        self.device = next(model.parameters()).device
        self.cache_format = cache_format
        self.block_size = int(block_size)
        self.max_seq_len = int(max_seq_len)
        self.blocks_per_request = math.ceil(self.max_seq_len / self.block_size)
        self.attention = dsmla_torch.Attention(cfg.num_attention_heads, cache_format=cache_format,
                                               topk=cfg.index_topk, policy=policy, device=self.device,
                                               dense_cost_factor=dense_cost_factor,
                                               indexer=indexer == "dsmla", index_num_heads=cfg.index_n_heads,
                                               index_head_dim=cfg.index_head_dim)
        self.num_requests = 0
        self.kv_caches = {}
        self.index_caches = {}  # dsmla's index cache per layer (indexer "dsmla")
        self.index_keys = {}  # transformers' indexer keys per layer (indexer "transformers")
        self.observer = None
        self.lengths = np.zeros(0, dtype=np.int64)  # tokens so far, per row
        self.step = None
        self.last_plan = None

    @property
    def ctx(self):
        """Tokens so far of the longest row (of every row when all are equal)."""
        return int(self.lengths.max()) if self.lengths.size else 0

    def reset(self):
        """Forgets every sequence (the caches are kept and overwritten)."""
        self.lengths = np.zeros(0, dtype=np.int64)
        self.step = None
        self.index_keys.clear()

    def _allocate(self, num_requests):
        self.num_requests = num_requests
        blocks = num_requests * self.blocks_per_request
        self.num_blocks = blocks
        # Request r owns blocks [r * blocks_per_request, (r + 1) * blocks_per_request).
        self.block_table_host = np.arange(blocks, dtype=np.int32).reshape(num_requests, self.blocks_per_request)
        self.block_table = torch.from_numpy(self.block_table_host).to(self.device)
        self.kv_caches = {}
        self.index_caches = {}

    def kv_cache(self, layer_idx):
        c = self.kv_caches.get(layer_idx)
        if c is None:
            c = torch.zeros((self.num_blocks, self.block_size, bytes_per_token(self.cache_format)),
                            dtype=torch.uint8, device=self.device)
            self.kv_caches[layer_idx] = c
        return c

    def index_cache(self, layer_idx):
        """[blocks, block_size, index_head_dim + 4] uint8: the e4m3 keys then the fp32 scales of each block."""
        c = self.index_caches.get(layer_idx)
        if c is None:
            c = torch.zeros((self.num_blocks, self.block_size, self.config.index_head_dim + 4), dtype=torch.uint8,
                            device=self.device)
            self.index_caches[layer_idx] = c
        return c

    def begin(self, batch, length, mask=None):
        """Plans one model call of `batch` rows of `length` tokens; `mask` [batch,
        length] (right-padded 0/1, optional) gives each row's new tokens."""
        if self.lengths.size == 0:
            if batch != self.num_requests:
                self._allocate(batch)
            self.lengths = np.zeros(batch, dtype=np.int64)
        if batch != self.num_requests:
            raise ValueError(f"dsmla: the sequences have {self.num_requests} rows, this call {batch} (reset() first)")
        new = np.full(batch, length, dtype=np.int64)
        if mask is not None:
            m = mask.detach().to("cpu").numpy().astype(bool)
            new = m.sum(axis=1).astype(np.int64)
            if not np.array_equal(m, np.arange(length)[None, :] < new[:, None]):
                raise ValueError("dsmla: attention_mask must be right-padded (each row ones, then zeros)")
            if (new == 0).any():
                raise ValueError(f"dsmla: rows {np.flatnonzero(new == 0).tolist()} have no tokens in this call")
        ctx = self.lengths
        seq = ctx + new
        if seq.max() > self.max_seq_len:
            r = int(seq.argmax())
            raise ValueError(f"dsmla: row {r}: {int(ctx[r])} + {int(new[r])} tokens exceed max_seq_len {self.max_seq_len}")
        st = _Step()
        st.new, st.ctx_max = new, int(ctx.max())
        st.requests = np.repeat(np.arange(batch), new)  # each token's row, in dsmla's token order
        B, bs, dev = batch, self.block_size, self.device
        padded = bool((new != length).any() or (ctx != ctx[0]).any())
        # Row r's new tokens sit at positions ctx[r] .. ctx[r] + new[r] - 1.
        pos = [np.arange(ctx[r], seq[r]) for r in range(B)]
        st.token_positions = np.concatenate(pos)
        slots = np.concatenate([self.block_table_host[r, p // bs].astype(np.int64) * bs + p % bs
                                for r, p in enumerate(pos)])
        qsl = np.concatenate([[0], np.cumsum(new)]).astype(np.int32)
        seq_lens = seq.astype(np.int32)
        # The plan of the latest call (`.to_json()`: how each request was routed).
        self.last_plan = self.attention.plan(qsl, seq_lens, self.block_table_host, slots, self.num_blocks, bs)
        st.query_start_loc = torch.from_numpy(qsl).to(dev)
        st.seq_lens = torch.from_numpy(seq_lens).to(dev)
        st.slot_mapping = torch.from_numpy(slots).to(dev)
        ctx_t = torch.from_numpy(ctx).to(dev)
        st.positions = ctx_t[:, None] + torch.arange(length, device=dev)[None, :]  # [B, S]
        st.keys = int(seq.max())
        if self.indexer == "transformers":
            # Its additive mask over [B, S, keys]: a token sees its row's positions up to its own.
            keys = torch.arange(st.keys, device=dev)
            st.index_mask = torch.where(keys[None, None, :] <= st.positions[..., None], 0.0, float("-inf"))
        if padded:
            # Flat indices of the valid tokens in [B * S], and of their index-key rows in [B * max_seq_len].
            valid = (torch.arange(length, device=dev)[None, :] < torch.from_numpy(new).to(dev)[:, None]).reshape(-1)
            st.valid = valid.nonzero().squeeze(1)
            rows = torch.arange(B, device=dev)[:, None].expand(B, length).reshape(-1)[st.valid]
            st.key_rows = rows * self.max_seq_len + st.positions.reshape(-1)[st.valid]
        else:
            st.valid = None
        self.step = st
        return st

    def end(self):
        if self.step is not None:
            self.lengths = self.lengths + self.step.new
            self.step = None


def _modeling_function(attn, name):
    # A function of the model's own modeling module (the rotary embeddings).
    mod = sys.modules[type(attn).__module__]
    fn = getattr(mod, name, None)
    if fn is None:
        raise ValueError(f"{mod.__name__} has no {name}: unsupported transformers version")
    return fn


def _hadamard(n, device):
    """The orthonormal n x n Hadamard matrix (Sylvester's construction; n a power of two)."""
    h = torch.ones((1, 1), dtype=torch.float32)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / math.sqrt(n)).to(device)


_E4M3_MAX = 448.0


def _dsmla_index_inputs(attn, hidden_states, q_resid, position_embeddings, rope, hadamard):
    """The inputs of dsmla's lightning indexer for a [B, S] call, from the layer's own indexer weights.

    Query and key as transformers' DeepseekV32Indexer computes them (wq_b;
    wk then k_norm; the half-split rotary embedding on the first
    qk_rope_head_dim dims), then, as DeepSeek's reference inference does,
    both rotated by the Hadamard matrix (orthonormal: every q . k is kept)
    and the query quantised per (token, head) to e4m3 with scale
    max(amax / 448, FLT_MIN); the weights are weights_proj(x) ·
    index_n_heads^-0.5, times the query's scale and index_head_dim^-0.5.
    Returns index_q [B*S, Hi, Di] uint8 codes, index_weights [B*S, Hi]
    float32, index_k [B*S, Di] bf16 (dsmla quantises the keys it caches)."""
    ix = attn.indexer
    B, S, _ = hidden_states.shape
    Hi, Di, R = ix.n_heads, ix.head_dim, ix.qk_rope_head_dim
    cos, sin = position_embeddings
    q = ix.wq_b(q_resid).view(B, S, Hi, Di)
    q_rot, q_pass = torch.split(q, [R, Di - R], dim=-1)
    k = ix.k_norm(ix.wk(hidden_states)).unsqueeze(2)
    k_rot, k_pass = torch.split(k, [R, Di - R], dim=-1)
    q_rot, k_rot = rope(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
    q = torch.cat([q_rot, q_pass], dim=-1).reshape(B * S, Hi, Di).float()
    k = torch.cat([k_rot, k_pass], dim=-1).reshape(B * S, Di).float()
    if hadamard is not None:
        q, k = q @ hadamard, k @ hadamard
    scale = torch.clamp(q.abs().amax(-1) / _E4M3_MAX, min=torch.finfo(torch.float32).tiny)  # [B*S, Hi]
    codes = (q / scale[..., None]).to(torch.float8_e4m3fn).view(torch.uint8)
    weights = ix.weights_proj(hidden_states.to(ix.weights_proj.weight.dtype)).float().reshape(B * S, Hi)
    weights = weights * (Hi ** -0.5 * Di ** -0.5) * scale
    return codes, weights, k.to(torch.bfloat16)


def cache_argument(forward):
    """The name under which a forward of this transformers version takes the cache:
    `cache` (5.2x on) or `past_key_values` (earlier; later a deprecated alias)."""
    params = inspect.signature(forward).parameters
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    return None


def _indexer_call(indexer):
    name = cache_argument(indexer.forward)
    if name is None:
        raise ValueError("the DeepSeek-V3.2 indexer takes no cache argument: unsupported transformers version")
    return name, set(inspect.signature(indexer.forward).parameters)


def _make_forward(attn, state):
    rope = _modeling_function(attn, "apply_rotary_pos_emb_interleave")
    H, layer = attn.num_heads, attn.layer_idx
    topk = state.config.index_topk
    if state.indexer == "dsmla":
        index_rope = _modeling_function(attn, "apply_rotary_pos_emb")  # the indexer's half-split rotary
        Di = attn.indexer.head_dim
        if Di <= 0 or Di & (Di - 1) != 0:
            raise ValueError(f"layer {layer}: the indexer's head_dim {Di} is not a power of two; "
                             "its Hadamard rotation (DeepSeek's reference) needs one")
        hadamard = _hadamard(Di, state.device)
    else:
        indexer_cache_arg, indexer_params = _indexer_call(attn.indexer)
        index_cache = _IndexerCache(state)

    def indexer_topk(hidden_states, q_resid, position_embeddings, st):
        # transformers' indexer: the first four by position (their names vary between versions), the rest by name.
        kwargs = {indexer_cache_arg: index_cache}
        if "position_ids" in indexer_params:
            kwargs["position_ids"] = st.positions
        idx = attn.indexer(hidden_states, q_resid, position_embeddings, st.index_mask, **kwargs)
        # idx: [B, S, min(topk, ctx + S)] positions
        # Below top-k keys the indexer also returns masked (future) positions: drop them.
        idx = torch.where(idx <= st.positions[..., None], idx, -1)
        if idx.shape[-1] < topk:
            idx = torch.nn.functional.pad(idx, (0, topk - idx.shape[-1]), value=-1)
        return st.tokens(idx.reshape(-1, topk)).to(torch.int32).contiguous()

    def forward(hidden_states, position_embeddings=None, attention_mask=None, *args, position_ids=None, **kwargs):
        # transformers' cache (`cache` / `past_key_values`) is not used: the adapter is the cache.
        st = state.step
        if st is None:
            raise RuntimeError("dsmla: call the model, not one attention layer (the adapter plans per model call)")
        B, S, _ = hidden_states.shape
        bf16 = torch.bfloat16
        q_resid = attn.q_a_layernorm(attn.q_a_proj(hidden_states))
        q = attn.q_b_proj(q_resid).view(B, S, H, attn.qk_head_dim)
        q_nope, q_rot = torch.split(q, [attn.qk_nope_head_dim, attn.qk_rope_head_dim], dim=-1)
        kv_pass, k_rot = torch.split(attn.kv_a_proj_with_mqa(hidden_states),
                                     [attn.kv_lora_rank, attn.qk_rope_head_dim], dim=-1)
        kv_c = attn.kv_a_layernorm(kv_pass)
        cos, sin = position_embeddings
        q_rot, k_rot = rope(q_rot.transpose(1, 2), k_rot.view(B, 1, S, attn.qk_rope_head_dim), cos, sin)
        q_full = torch.cat([q_nope, q_rot.transpose(1, 2)], dim=-1).reshape(B * S, H, attn.qk_head_dim)
        kv_c = st.tokens(kv_c.reshape(B * S, -1)).to(bf16).contiguous()
        k_pe = st.tokens(k_rot.reshape(B * S, -1)).to(bf16).contiguous()
        if state.indexer == "dsmla":
            codes, weights, index_k = _dsmla_index_inputs(attn, hidden_states, q_resid, position_embeddings,
                                                          index_rope, hadamard)
            topk_indices = torch.empty((kv_c.shape[0], topk), dtype=torch.int32, device=kv_c.device)
            index = dict(index_q=st.tokens(codes).contiguous(), index_weights=st.tokens(weights).contiguous(),
                         index_k=st.tokens(index_k).contiguous(), index_cache=state.index_cache(layer),
                         topk_indices_out=topk_indices)
            given = None
        else:
            topk_indices = given = indexer_topk(hidden_states, q_resid, position_embeddings, st)
            index = {}
        out, _ = state.attention(
            st.tokens(q_full).to(bf16).contiguous(), kv_c, k_pe, attn._dsmla_w_kv_b, state.kv_cache(layer),
            state.block_table, st.seq_lens, st.query_start_loc, st.slot_mapping, given, attn.scaling, **index)
        if state.observer is not None:
            state.observer(layer, st, {"kv_c": kv_c, "k_pe": k_pe, "topk_indices": topk_indices})
        out = st.rows(out.view(-1, H * attn.v_head_dim), B * S)
        return attn.o_proj(out.view(B, S, H * attn.v_head_dim).to(hidden_states.dtype)), None

    return forward


def enable(model, cache_format="bf16", policy="per_request", block_size=64, max_seq_len=4096,
           dense_cost_factor=None, indexer="dsmla"):
    """Switches every attention layer of a DeepSeek-V3.2 model to dsmla; returns the adapter's state.

    indexer: "dsmla" (dsmla's lightning indexer over its own index cache,
    fed by the layer's indexer weights) or "transformers" (the model's
    indexer module chooses the top-k)."""
    base = _base_model(model)
    if getattr(model, "_dsmla_state", None) is not None:
        disable(model)
    mods = _attention_modules(model)
    for m in mods:
        for name, want in _DIMS.items():
            if getattr(m, name) != want:
                raise ValueError(f"dsmla supports {name} {want}, the model has {getattr(m, name)}")
        if m.q_a_proj is None:
            raise ValueError("dsmla: the model has no q_lora_rank (q_a_proj): unsupported")
    state = DsmlaState(model, cache_format, policy, block_size, max_seq_len, dense_cost_factor, indexer)
    for m in mods:
        # [H*256, 512] bf16: per head W_UK then W_UV, as kv_b_proj stores them.
        m._dsmla_w_kv_b = m.kv_b_proj.weight.detach().to(torch.bfloat16).contiguous()
        m.forward = _make_forward(m, state)

    def pre_hook(module, args, kwargs):
        x = kwargs.get("input_ids", args[0] if args else None)
        if x is None:
            x = kwargs["inputs_embeds"]
        mask = kwargs.pop("attention_mask", None)
        if mask is not None and bool(torch.all(mask != 0)):
            mask = None
        st = state.begin(x.shape[0], x.shape[1], mask)
        kwargs["position_ids"] = st.positions
        kwargs["use_cache"] = False
        kwargs.pop("past_key_values", None)
        kwargs.pop("cache", None)
        return args, kwargs

    def post_hook(module, args, output):
        state.end()

    state._hooks = [base.register_forward_pre_hook(pre_hook, with_kwargs=True),
                    base.register_forward_hook(post_hook)]
    state._modules = mods
    model._dsmla_state = state
    return state


def disable(model):
    """Restores transformers' attention (the dsmla caches are dropped)."""
    state = getattr(model, "_dsmla_state", None)
    if state is None:
        return
    for h in state._hooks:
        h.remove()
    for m in state._modules:
        del m.forward  # the class's forward again
        del m._dsmla_w_kv_b
    model._dsmla_state = None
