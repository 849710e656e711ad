"""Attention.run's argument checks (no copies: wrong dtype, shape, layout or
device is an error naming the argument), the bf16 helpers, and that importing
dsmla does not import torch."""
import subprocess
import sys

import numpy as np
import pytest

import dsmla

H, TOPK, B = 16, 32, 16


def small_batch():
    """Two requests: a decode over 40 cached tokens, a 6-token prompt."""
    att = dsmla.Attention(H, topk=TOPK, backend="cpu")
    table = np.array([[0, 1, 2], [3, 0, 0]], np.int32)
    qsl, sl = np.array([0, 1, 7], np.int32), np.array([41, 6], np.int32)
    slots = np.array([2 * B + 8] + [3 * B + i for i in range(6)], np.int64)
    att.plan(qsl, sl, table, slots, 4, B)
    rng = np.random.default_rng(0)
    bits = lambda *shape: dsmla.float32_to_bf16_bits(rng.standard_normal(shape, dtype=np.float32) * 0.5)
    T = 7
    topk = np.full((T, TOPK), -1, np.int32)
    topk[0, :32] = np.arange(9, 41)
    args = dict(q=bits(T, H, 192), kv_c=bits(T, 512), k_pe=bits(T, 64), w_kv_b=bits(H * 256, 512),
                kv_cache=np.zeros((4, B, 1152), np.uint8), block_table=table, seq_lens=sl, query_start_loc=qsl,
                slot_mapping=slots, topk_indices=topk, out=np.zeros((T, H * 128), np.uint16),
                lse=np.zeros((T, H), np.float32), softmax_scale=dsmla.default_softmax_scale())
    return att, args


def test_run_writes_every_row():
    att, a = small_batch()
    att.run(**a)
    out = dsmla.bf16_bits_to_float32(a["out"])
    assert np.isfinite(out).all() and np.isfinite(a["lse"]).all()
    assert (np.abs(out).reshape(7, -1).max(axis=1) > 0).all()
    # the new tokens' slots of the cache were written, nothing else
    written = a["kv_cache"].reshape(-1, 1152).any(axis=1)
    assert sorted(np.flatnonzero(written)) == sorted(a["slot_mapping"].tolist())


@pytest.mark.parametrize("name,bad,message", [
    ("q", lambda a: a["q"][:, :, :128].copy(), "q: expected shape [7, 16, 192], got [7, 16, 128]"),
    ("q", lambda a: a["q"].astype(np.float32), "q: expected dtype bfloat16"),
    ("kv_c", lambda a: np.asfortranarray(a["kv_c"]), "kv_c: must be C-contiguous"),
    ("slot_mapping", lambda a: a["slot_mapping"].astype(np.int32), "slot_mapping: expected dtype int64, got int32"),
    ("lse", lambda a: np.zeros((7, 16), np.float64), "lse: expected dtype float32, got float64"),
    ("kv_cache", lambda a: np.zeros((4, B, 1151), np.uint8), "kv_cache: expected shape [4, 16, 1152]"),
    ("kv_cache", lambda a: np.zeros((4, B, 289), np.float32), "kv_cache: expected shape [4, 16, 288]"),
    ("topk_indices", lambda a: None, "1 tokens take the sparse path (policy per_request) but topk_indices is None"),
    ("topk_indices", lambda a: a["topk_indices"][:, :16].copy(), "topk_indices: expected shape [7, 32]"),
    ("workspace", lambda a: np.zeros(16, np.uint8), None),
])
def test_bad_arguments_raise_value_error(name, bad, message):
    att, a = small_batch()
    a[name] = bad(a)
    if name == "workspace" and att.workspace_bytes <= 16:
        pytest.skip("the cpu backend needs no workspace for this batch")
    with pytest.raises(ValueError) as e:
        att.run(**a)
    if message is not None:
        assert str(e.value).startswith(message), str(e.value)


def test_kv_cache_viewed_as_bf16_is_accepted():
    att, a = small_batch()
    want = dict(a, kv_cache=a["kv_cache"].copy(), out=a["out"].copy(), lse=a["lse"].copy())
    att.run(**want)
    a["kv_cache"] = a["kv_cache"].view(np.uint16)  # [4, 16, 576] bf16 elements
    att.run(**a)
    assert a["out"].tobytes() == want["out"].tobytes()
    assert a["kv_cache"].tobytes() == want["kv_cache"].tobytes()


def test_bad_topk_index_raises_with_token_and_column():
    att, a = small_batch()
    a["topk_indices"][0, 3] = 41
    with pytest.raises(ValueError, match=r"topk_indices\[0\]\[3\] = 41"):
        att.run(**a)


def test_scale_out_of_range_raises():
    att, a = small_batch()
    a["softmax_scale"] = 0.0
    with pytest.raises(ValueError, match="softmax_scale"):
        att.run(**a)


def test_run_without_plan_raises():
    att = dsmla.Attention(H, topk=TOPK, backend="cpu")
    with pytest.raises((ValueError, RuntimeError)):
        att.run(*[np.zeros(1)] * 12, 0.1)


def test_bf16_helpers_round_trip():
    x = np.array([1.0, -2.5, 3.140625, 1e-3, np.inf, -np.inf], np.float32)
    bits = dsmla.float32_to_bf16_bits(x)
    assert bits.dtype == np.uint16 and bits[0] == 0x3F80
    back = dsmla.bf16_bits_to_float32(bits)
    assert np.array_equal(back[[0, 1, 2, 4, 5]], x[[0, 1, 2, 4, 5]])
    assert abs(back[3] - 1e-3) < 1e-5
    assert np.isnan(dsmla.bf16_bits_to_float32(dsmla.float32_to_bf16_bits(np.float32(np.nan))))
    # round to nearest even: 1 + 2^-8 lies halfway between two bf16 values
    assert dsmla.float32_to_bf16_bits(np.float32(1 + 2 ** -8)) == 0x3F80


def test_import_does_not_import_torch():
    code = "import sys, dsmla; dsmla.Attention(16, backend='cpu'); print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "False"


def test_torch_modules_compile_and_need_torch_only_when_imported():
    # dsmla.torch and the transformers adapter run only on the GPU machine:
    # here at least their source must compile, and importing them without
    # torch must fail with torch's own ImportError, not something else.
    import importlib
    import pathlib
    import py_compile
    pkg = pathlib.Path(dsmla.__file__).parent
    for f in ["torch.py", "integrations/__init__.py", "integrations/transformers.py"]:
        py_compile.compile(str(pkg / f), doraise=True)
    try:
        import torch  # noqa: F401
    except ImportError:
        for name in ("dsmla.torch", "dsmla.integrations.transformers"):
            with pytest.raises(ImportError, match="torch"):
                importlib.import_module(name)
