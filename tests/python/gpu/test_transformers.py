"""dsmla under transformers' DeepSeek-V3.2 against transformers' own eager
attention: a random-weight model with the real head dims (q/k 192, v 128,
latent 512 + 64), 16 heads, 3 layers, index top-k 128; prompts of 40 and
300 tokens, then 32 teacher-forced decode steps; logits within rel-L2 1e-2
at every step, for the bf16 and fp8_ds_mla caches and the per_request and
force_sparse policies. The prefill times of both go to the report."""
import json
import os
import time

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import dsmla  # noqa: E402

if not (torch.cuda.is_available() and dsmla.cuda_available()):
    pytest.skip("needs a CUDA GPU and a CUDA build of dsmla", allow_module_level=True)
try:
    from transformers import DeepseekV32Config, DeepseekV32ForCausalLM
except ImportError:
    pytest.skip(f"transformers {transformers.__version__} has no DeepSeek-V3.2", allow_module_level=True)

from dsmla.integrations import transformers as dsmla_hf  # noqa: E402

DECODE_STEPS = 32
TOL = 1e-2
TIMINGS = {}


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = DeepseekV32Config(
        vocab_size=2048, hidden_size=1024, intermediate_size=2048, moe_intermediate_size=256,
        num_hidden_layers=3, first_k_dense_replace=1, num_attention_heads=16, num_key_value_heads=16,
        n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
        q_lora_rank=384, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
        index_topk=128, index_n_heads=16, index_head_dim=128, max_position_embeddings=4096)
    cfg._attn_implementation = "eager"
    m = DeepseekV32ForCausalLM(cfg)
    if hasattr(m, "set_attn_implementation"):
        m.set_attn_implementation("eager")
    return m.to(device="cuda", dtype=torch.bfloat16).eval()


def tokens(batch, length, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2048, (batch, length), generator=g).cuda()


@torch.no_grad()
def hf_logits(model, prompt, cont):
    out = model(input_ids=prompt, use_cache=True)
    logits, cache = [out.logits.float()], out.past_key_values
    for i in range(cont.shape[1]):
        out = model(input_ids=cont[:, i:i + 1], past_key_values=cache, use_cache=True)
        logits.append(out.logits.float())
    return logits


@torch.no_grad()
def dsmla_logits(model, prompt, cont, **options):
    state = dsmla_hf.enable(model, max_seq_len=prompt.shape[1] + cont.shape[1] + 8, **options)
    try:
        logits = [model(input_ids=prompt).logits.float()]
        for i in range(cont.shape[1]):
            logits.append(model(input_ids=cont[:, i:i + 1]).logits.float())
        assert state.ctx == prompt.shape[1] + cont.shape[1]
    finally:
        dsmla_hf.disable(model)
    return logits


def prefill_ms(model, prompt, use_dsmla, **options):
    if use_dsmla:
        state = dsmla_hf.enable(model, max_seq_len=prompt.shape[1], **options)
    try:
        times = []
        with torch.no_grad():
            for _ in range(6):
                if use_dsmla:
                    state.reset()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                model(input_ids=prompt, use_cache=not use_dsmla)
                torch.cuda.synchronize()
                times.append((time.perf_counter() - t0) * 1e3)
        return sorted(times[1:])[len(times[1:]) // 2]
    finally:
        if use_dsmla:
            dsmla_hf.disable(model)


_reference = {}


def reference(model, batch, length):
    key = (batch, length)
    if key not in _reference:
        prompt, cont = tokens(batch, length, 1), tokens(batch, DECODE_STEPS, 2)
        _reference[key] = prompt, cont, hf_logits(model, prompt, cont)
    return _reference[key]


def rel_l2(a, b):
    return (torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b)).item()


@pytest.mark.parametrize("batch,length", [(2, 40), (1, 300)])
@pytest.mark.parametrize("cache_format", ["bf16", "fp8_ds_mla"])
@pytest.mark.parametrize("policy", ["per_request", "force_sparse"])
def test_logits_match_hf_eager(model, batch, length, cache_format, policy):
    prompt, cont, want = reference(model, batch, length)
    got = dsmla_logits(model, prompt, cont, cache_format=cache_format, policy=policy)
    errors = [rel_l2(g, w) for g, w in zip(got, want)]
    print(f"\n{batch}x{length} {cache_format} {policy}: rel-L2 prefill {errors[0]:.2e}, "
          f"decode max {max(errors[1:]):.2e}")
    TIMINGS.setdefault("rel_l2", {})[f"{batch}x{length} {cache_format} {policy}"] = {
        "prefill": errors[0], "decode_max": max(errors[1:])}
    bad = [(i, e) for i, e in enumerate(errors) if not e <= TOL]
    assert not bad, f"steps over rel-L2 {TOL} (0 = prefill): {bad[:5]}"


def test_prefill_time_vs_hf(model, report_dir):
    prompt = tokens(1, 300, 3)
    hf = prefill_ms(model, prompt, False)
    ours = {f"{fmt} {pol}": prefill_ms(model, prompt, True, cache_format=fmt, policy=pol)
            for fmt in ("bf16", "fp8_ds_mla") for pol in ("per_request", "force_sparse")}
    TIMINGS["prefill_ms_300_tokens"] = {"hf_eager": hf, **{f"dsmla {k}": v for k, v in ours.items()}}
    print("\nprefill of 300 tokens, whole model (ms):", json.dumps(TIMINGS["prefill_ms_300_tokens"], indent=1))
    if report_dir:
        with open(os.path.join(report_dir, "transformers.json"), "w") as f:
            json.dump(TIMINGS, f, indent=1)
    assert all(v > 0 for v in ours.values())
