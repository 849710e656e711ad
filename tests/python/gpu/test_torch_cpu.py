"""dsmla.torch on the cpu backend (torch CPU tensors): the op gives exactly
what the case runner gives, eager and under torch.compile. Needs torch only."""
import pytest

torch = pytest.importorskip("torch")

import dsmla  # noqa: E402
import dsmla.torch  # noqa: E402,F401
from gpu_cases import as_numpy, attention_for, call, torch_inputs, write  # noqa: E402


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
    assert "Tensor q," in schema  # inputs are not written


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
