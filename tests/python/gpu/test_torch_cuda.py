"""dsmla.torch on the CUDA backend: the op equals the C++ CUDA backend (the
case runner of `dsmla run`), compiles without graph breaks, and replays in a
CUDA graph with new inputs."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import dsmla  # noqa: E402

if not (torch.cuda.is_available() and dsmla.cuda_available()):
    pytest.skip("needs a CUDA GPU and a CUDA build of dsmla", allow_module_level=True)

import dsmla.torch  # noqa: E402,F401
from gpu_cases import CASES, as_numpy, attention_for, call, index_inputs, torch_inputs, write  # noqa: E402


def assert_same(got, want, what):
    # The same kernels on the same inputs: bit-identical unless a kernel
    # reduces in a run-dependent order, which would show here.
    out, lse, cache = got
    assert cache.tobytes() == want["kv_cache"].tobytes(), f"{what}: kv_cache differs"
    if out.tobytes() != want["out"].tobytes() or lse.tobytes() != want["lse"].tobytes():
        rel = np.linalg.norm(out - want["out"]) / max(np.linalg.norm(want["out"]), 1e-30)
        pytest.fail(f"{what}: out / lse not bit-identical to the C++ CUDA backend (out rel-L2 {rel:.2e})")


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("policy", [None, "force_sparse"])
def test_op_matches_cuda_case_runner(tmp_path, name, policy):
    path = write(tmp_path, name)
    c = dsmla.load_case(path)
    t = torch_inputs(c, "cuda")
    att = attention_for(c, "cuda", policy)
    stream = torch.cuda.Stream()  # a non-default stream: the op must run on torch's current stream
    with torch.cuda.stream(stream):
        out, lse = call(att, t, c)
    stream.synchronize()
    assert_same(as_numpy(out, lse, t["kv_cache"]), dsmla.run_case(path, backend="cuda", policy=policy), name)


def test_compiled_matches_eager(tmp_path):
    path = write(tmp_path, "mixed_fp8_ds_mla")
    c = dsmla.load_case(path)
    att = attention_for(c, "cuda")
    eager_t, comp_t = torch_inputs(c, "cuda"), torch_inputs(c, "cuda")
    out, lse = call(att, eager_t, c)
    want = (out.float() * 3).cpu(), lse.cpu()

    @torch.compile(fullgraph=True)  # fullgraph: a graph break is an error
    def step(t):
        out, lse = call(att, t, c)
        return out.float() * 3, lse

    got = step(comp_t)
    torch.testing.assert_close(got[0].cpu(), want[0], rtol=0, atol=0)
    torch.testing.assert_close(got[1].cpu(), want[1], rtol=0, atol=0)
    assert torch.equal(comp_t["kv_cache"], eager_t["kv_cache"])


def test_cuda_graph_replays_with_new_inputs(tmp_path):
    path = write(tmp_path, "decode_h128")
    c = dsmla.load_case(path)
    att = attention_for(c, "cuda")
    static = torch_inputs(c, "cuda")
    cache0 = static["kv_cache"].clone()
    T, H = c["num_tokens"], c["num_heads"]
    out = torch.empty((T, H * 128), dtype=torch.bfloat16, device="cuda")
    lse = torch.empty((T, H), dtype=torch.float32, device="cuda")

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture
        call(att, static, c, out=out, lse=lse)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(att, static, c, out=out, lse=lse)

    for seed in (1, 2):
        g = torch.Generator(device="cuda").manual_seed(seed)
        q_new = (torch.randn(static["q"].shape, generator=g, device="cuda") * 0.5).to(torch.bfloat16)
        static["q"].copy_(q_new)
        static["kv_cache"].copy_(cache0)
        graph.replay()
        torch.cuda.synchronize()
        fresh = dict(static, q=q_new.clone(), kv_cache=cache0.clone())
        want_out, want_lse = call(att, fresh, c)
        torch.cuda.synchronize()
        assert torch.equal(out, want_out), f"replay {seed}: out differs from an eager run"
        assert torch.equal(lse, want_lse)
        assert torch.equal(static["kv_cache"], fresh["kv_cache"])


def test_wrong_device_raises_value_error(tmp_path):
    path = write(tmp_path, "mixed_bf16")
    c = dsmla.load_case(path)
    t = torch_inputs(c, "cuda")
    t["q"] = t["q"].cpu()
    att = attention_for(c, "cuda")
    with pytest.raises(ValueError, match="q: expected a CUDA device array"):
        call(att, t, c)


@pytest.mark.parametrize("compiled", [False, True])
def test_op_passes_index_inputs(tmp_path, compiled):
    """dsmla's lightning indexer through the op (on a non-default stream,
    eager and compiled) against the bindings' run() on the same CUDA tensors:
    the same out, lse, caches, and the same selection per row (a row's
    order is unspecified)."""
    path = write(tmp_path, "mixed_bf16")
    c = dsmla.load_case(path)
    t, index = torch_inputs(c, "cuda"), index_inputs(c, "cuda")
    ref_t = {k: None if v is None else v.clone() for k, v in t.items()}
    ref_index = {k: v.clone() for k, v in index.items()}
    native = dsmla.Attention(c["num_heads"], cache_format=c["cache_format"], topk=c["topk"], backend="cuda",
                             policy=c["policy"], indexer=True, index_num_heads=16)
    native.plan(c["query_start_loc"], c["seq_lens"], c["block_table"], c["slot_mapping"], c["num_cache_blocks"],
                c["block_size"])
    T, H = c["num_tokens"], c["num_heads"]
    want_out = torch.empty((T, H * 128), dtype=torch.bfloat16, device="cuda")
    want_lse = torch.empty((T, H), dtype=torch.float32, device="cuda")
    native.run(ref_t["q"], ref_t["kv_c"], ref_t["k_pe"], ref_t["w_kv_b"], ref_t["kv_cache"], ref_t["block_table"],
               ref_t["seq_lens"], ref_t["query_start_loc"], ref_t["slot_mapping"], None, want_out, want_lse,
               c["softmax_scale"], k_scale=c["k_scale"], **ref_index)
    torch.cuda.synchronize()
    att = attention_for(c, "cuda", indexer=True, index_num_heads=16)

    def step(t, index):
        return call(att, t, c, index)

    if compiled:
        step = torch.compile(step, fullgraph=True)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        out, lse = step(t, index)
    stream.synchronize()
    assert torch.equal(t["kv_cache"], ref_t["kv_cache"])
    assert torch.equal(index["index_cache"], ref_index["index_cache"])
    sel, want_sel = index["topk_indices_out"], ref_index["topk_indices_out"]
    assert torch.equal(sel.sort(1).values, want_sel.sort(1).values)
    assert (sel[:1] >= 0).sum() == c["topk"] and (sel[1:38] == -1).all()  # a decode selected, a dense prompt not
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
