"""dsmla.torch on the cpu backend (torch CPU tensors): the op gives exactly
what the case runner gives, eager and under torch.compile. Needs torch only."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import dsmla  # noqa: E402
import dsmla.torch  # noqa: E402,F401
from gpu_cases import as_numpy, attention_for, call, index_inputs, torch_inputs, write  # noqa: E402


@pytest.mark.parametrize("name", ["mixed_bf16", "fp8_random_topk"])
def test_op_on_cpu_tensors_matches_run_case(tmp_path, name):
    path = write(tmp_path, name)
    c = dsmla.load_case(path)
    t = torch_inputs(c, "cpu")
    att = attention_for(c, "cpu")
    out, lse = call(att, t, c)
    got = as_numpy(out, lse, t["kv_cache"])
    want = dsmla.run_case(path, backend="cpu")
    assert got[0].tobytes() == want["out"].tobytes()
    assert got[1].tobytes() == want["lse"].tobytes()
    assert got[2].tobytes() == want["kv_cache"].tobytes()


def test_op_schema_declares_its_writes():
    schema = str(torch.ops.dsmla.forward.default._schema)
    for name in ("kv_cache", "out", "lse", "workspace"):
        assert f"Tensor(" in schema and f"!) {name}" in schema, schema
    for name in ("index_cache", "topk_indices_out"):  # the indexer's writes (optional tensors)
        assert f"!)? {name}" in schema, schema
    assert "Tensor q," in schema and "Tensor? index_q" in schema  # inputs are not written


def test_compiled_cpu_matches_eager(tmp_path):
    path = write(tmp_path, "mixed_bf16")
    c = dsmla.load_case(path)
    att = attention_for(c, "cpu")
    eager_t, comp_t = torch_inputs(c, "cpu"), torch_inputs(c, "cpu")
    want = as_numpy(*call(att, eager_t, c), eager_t["kv_cache"])

    @torch.compile(fullgraph=True, backend="aot_eager")  # no inductor: no C++ toolchain needed
    def step(t):
        out, lse = call(att, t, c)
        return out.float() * 2, lse

    out2, lse = step(comp_t)
    got = ((out2 / 2).numpy(), lse.numpy(), comp_t["kv_cache"].numpy())
    for g, w in zip(got, want):
        assert g.tobytes() == w.tobytes()


def native_run(c, t, index):
    """dsmla.Attention.run (the bindings, no torch op) on NumPy copies: what the op must reproduce."""
    att = dsmla.Attention(c["num_heads"], cache_format=c["cache_format"], topk=c["topk"], backend="cpu",
                          policy=c["policy"], indexer=True, index_num_heads=index["index_q"].shape[1])
    att.plan(c["query_start_loc"], c["seq_lens"], c["block_table"], c["slot_mapping"], c["num_cache_blocks"],
             c["block_size"])
    bits = {torch.bfloat16: torch.uint16}  # NumPy has no bf16: its bits
    n = {k: v.clone().view(bits.get(v.dtype, v.dtype)).numpy()
         for k, v in {**t, **index}.items() if v is not None and k != "topk_indices"}
    T, H = c["num_tokens"], c["num_heads"]
    out, lse = np.zeros((T, H * 128), np.uint16), np.zeros((T, H), np.float32)
    att.run(n["q"], n["kv_c"], n["k_pe"], n["w_kv_b"], n["kv_cache"], n["block_table"], n["seq_lens"],
            n["query_start_loc"], n["slot_mapping"], None, out, lse, c["softmax_scale"], k_scale=c["k_scale"],
            index_q=n["index_q"], index_weights=n["index_weights"], index_k=n["index_k"],
            index_cache=n["index_cache"], topk_indices_out=n["topk_indices_out"])
    return {"out": dsmla.bf16_bits_to_float32(out), "lse": lse, "kv_cache": n["kv_cache"],
            "index_cache": n["index_cache"], "topk_indices_out": n["topk_indices_out"]}


def assert_same_as_native(out, lse, t, index, want):
    got = {"out": out.float().numpy(), "lse": lse.numpy(), "kv_cache": t["kv_cache"].numpy(),
           "index_cache": index["index_cache"].numpy(), "topk_indices_out": index["topk_indices_out"].numpy()}
    for k, w in want.items():
        assert got[k].tobytes() == w.tobytes(), k


@pytest.mark.parametrize("compiled", [False, True])
def test_op_passes_index_inputs(tmp_path, compiled):
    """With dsmla's indexer the op passes index_q / index_weights / index_k
    through, writes index_cache and topk_indices_out, and equals the bindings'
    run() byte for byte, eager and under torch.compile(fullgraph=True)."""
    path = write(tmp_path, "mixed_bf16")  # a decode past top-k, prompts dense and sparse
    c = dsmla.load_case(path)
    t, index = torch_inputs(c, "cpu"), index_inputs(c, "cpu")
    want = native_run(c, t, index)
    att = attention_for(c, "cpu", indexer=True, index_num_heads=16)
    before = index["index_cache"].clone()

    def step(t, index):
        out, lse = call(att, t, c, index)
        return out.float() * 2, lse

    if compiled:
        step = torch.compile(step, fullgraph=True, backend="aot_eager")
    out2, lse = step(t, index)
    assert_same_as_native(out2 / 2, lse, t, index, want)
    assert not torch.equal(index["index_cache"], before)  # the new keys were written
    sel = index["topk_indices_out"]
    assert (sel[:1] >= 0).sum() == c["topk"]  # the decode of 200 tokens selected top-k 64 of them
    assert (sel[1:38] == -1).all()  # the 37-token prompt went dense: no selection
