"""bench/paired.py without a GPU: its statistics, round order, the capture of
anchors_bench.py's timed calls, and the shim's argument errors (when the CUDA
build made build/libdsmla_kernel_shim.so)."""
import ctypes
import os
import pathlib
import sys
import types

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
import paired  # noqa: E402


def test_percentile_interpolates_between_order_statistics():
    assert paired.percentile([3, 1, 2], 0.5) == 2
    assert paired.percentile([1, 2, 3, 4], 0.5) == 2.5
    assert paired.percentile([10, 20], 0.1) == pytest.approx(11)
    assert paired.percentile([5], 0.9) == 5
    with pytest.raises(ValueError):
        paired.percentile([], 0.5)


def test_rounds_put_every_contender_in_every_position():
    names = ["a", "b", "c", "d"]
    orders = paired.round_orders(names, 2 * len(names))
    assert orders[:3] == [["a", "b", "c", "d"], ["b", "c", "d", "a"], ["c", "d", "a", "b"]]
    assert orders[4] == ["d", "c", "b", "a"]
    for order in orders:
        assert sorted(order) == names
    for pos in range(len(names)):
        assert sorted(o[pos] for o in orders) == sorted(names * 2)
    # Whatever runs right before a contender in some round also runs right after it in another.
    follows = {(o[i], o[i + 1]) for o in orders for i in range(len(o) - 1)}
    assert follows == {(y, x) for x, y in follows}
    assert paired.round_orders(["a", "b"], 4) == [["a", "b"], ["b", "a"], ["b", "a"], ["a", "b"]]
    assert paired.round_orders(["a"], 2) == [["a"], ["a"]]


def test_ratios_are_taken_round_by_round():
    # The clock halves in rounds 2-3: both contenders slow down together, the
    # per-round ratio stays 0.9 while the medians' ratio does not.
    samples = {"anchor": [1.0, 1.0, 2.0, 2.0, 2.0], "ours": [0.9, 0.9, 1.8, 1.8, 1.8]}
    medians, ratios = paired.summarize(samples, [("ours", "ours", ["anchor"])])
    assert medians == {"anchor": 2.0, "ours": 1.8}
    assert ratios["ours"]["median"] == pytest.approx(0.9)
    assert ratios["ours"]["p10"] == pytest.approx(0.9) and ratios["ours"]["p90"] == pytest.approx(0.9)
    # A clock state that hits one side only shows in the spread, not the median.
    samples = {"anchor": [1.0] * 5, "ours": [0.9, 0.9, 0.9, 1.8, 0.9]}
    _, ratios = paired.summarize(samples, [("ours", "ours", ["anchor"])])
    assert ratios["ours"]["median"] == pytest.approx(0.9)
    assert ratios["ours"]["p90"] > 1.0


def test_a_ratio_against_several_anchors_takes_the_fastest_of_each_round():
    samples = {"fa3": [1.0, 2.0], "cudnn": [2.0, 1.0], "ours": [1.5, 1.5]}
    _, ratios = paired.summarize(samples, [("ours", "ours", ["fa3", "cudnn"])])
    assert ratios["ours"]["median"] == pytest.approx(1.5)


def test_unequal_sample_counts_are_an_error():
    with pytest.raises(ValueError, match="different sample counts"):
        paired.summarize({"a": [1.0], "b": [1.0, 2.0]}, [])


def test_variants_are_paired_with_the_first_shim_row_by_row():
    shims = [types.SimpleNamespace(label="main"), types.SimpleNamespace(label="exp")]
    pairs = [("main", "prefill", "FlashMLA"), ("main H16", "prefill_small", "FlashMLA"),
             ("exp", "prefill", "FlashMLA"), ("exp H16", "prefill_small", "FlashMLA")]
    assert paired.variant_pairs(pairs, shims) == [("exp / main", "exp", ["main"]),
                                                  ("exp H16 / main H16", "exp H16", ["main H16"])]
    assert paired.variant_pairs(pairs[:2], shims[:1]) == []


def fake_anchors():
    """A stand-in for anchors_bench.py: a workload function that builds its
    inputs and times one call over them."""
    ab = types.ModuleType("anchors_bench")
    ab.timeit = lambda fn: 1.0

    def workload(n):
        q, kv = list(range(n)), "cache"
        return ab.timeit(lambda: (len(q), kv))
    ab.workload = workload
    ab.untimed = lambda: None
    return ab


def test_the_anchors_timed_call_is_captured_with_its_inputs():
    ab = fake_anchors()
    timer = ab.timeit
    call = paired.captured_call(ab, "workload", 3)
    assert ab.timeit is timer  # restored
    assert call() == (3, "cache")
    q, kv = paired.tensors_of(call, "q", "kv")
    assert q == [0, 1, 2] and kv == "cache"
    with pytest.raises(RuntimeError, match=r"has no \['idx'\]"):
        paired.tensors_of(call, "q", "idx")
    with pytest.raises(RuntimeError, match="timed 0 calls"):
        paired.captured_call(ab, "untimed")


def shim_path():
    cli = os.environ.get("DSMLA_CLI")
    build = pathlib.Path(cli).parent if cli else REPO / "build"
    p = build / "libdsmla_kernel_shim.so"
    return p if p.exists() else None


@pytest.mark.skipif(shim_path() is None, reason="no CUDA build (build/libdsmla_kernel_shim.so)")
def test_the_shim_names_bad_arguments():
    shim = paired.Shim(str(shim_path()), "dsmla")
    lib = shim.lib
    # The same library under another label (another switch) gets its own copy and state.
    assert paired.Shim(str(shim_path()), "again").lib._handle != lib._handle
    assert lib.dsmla_shim_sparse_mla(None, None, 0, 7, 1.0, None, None, 1, 128, 2048, 0.1, None, None, None,
                                     None) == b"sparse_mla: format 7 is not 0, 1 or 2"
    message = lib.dsmla_shim_sparse_mla(None, None, 0, 0, 1.0, None, None, 1, 128, 2048, 0.1, None, None, None, None)
    assert b"must not be null" in message
    assert lib.dsmla_shim_dense_mha(None, None) == b"dense_mha: null dense batch handle"
    handle = ctypes.c_void_p()
    q_lens, ctx_lens = (ctypes.c_int32 * 1)(4), (ctypes.c_int32 * 1)(0)
    message = lib.dsmla_shim_dense_mha_create(q_lens, ctx_lens, 0, 128, 0.1, None, None, None, None, None,
                                              ctypes.byref(handle))
    assert message == b"dense_mha_create: num_requests 0 < 1" and handle.value is None
    with pytest.raises(RuntimeError, match="format 7"):
        paired.Shim._check(lib.dsmla_shim_sparse_mla(None, None, 0, 7, 1.0, None, None, 1, 128, 2048, 0.1, None,
                                                     None, None, None))


def fake_torch(clock):
    """torch.cuda's events and synchronisation over a fake clock: an event
    records the clock's time; contenders advance it."""
    class Event:
        def __init__(self, enable_timing):
            assert enable_timing
        def record(self):
            self.t = clock[0]
        def elapsed_time(self, end):
            return end.t - self.t
    cuda = types.SimpleNamespace(Event=Event, synchronize=lambda: None)
    return types.SimpleNamespace(cuda=cuda)


def test_every_contender_is_timed_once_a_round_in_changing_order():
    clock, calls = [0.0], []

    def contender(name, ms):
        def run():
            calls.append(name)
            clock[0] += ms
        return run
    contenders = {"anchor": contender("anchor", 2.0), "ours": contender("ours", 1.5)}
    samples, clocks = paired.time_rounds(fake_torch(clock), contenders, rounds=3, warmup=2, clock=lambda: 1980,
                                         cover=lambda: calls.append("cover"))
    assert calls[:4] == ["anchor", "anchor", "ours", "ours"]  # warm-ups, no cover
    assert calls[4:] == ["cover", "anchor", "cover", "ours", "cover", "ours", "cover", "anchor", "cover", "ours",
                         "cover", "anchor"]
    assert samples == {"anchor": [2.0] * 3, "ours": [1.5] * 3}
    assert clocks == [1980] * 3


def test_the_table_shows_ratios_bars_checks_and_failures():
    env = dict(gpu="GPU", torch="2", date="d", tree="abc", rounds=3, warmup=1)
    samples = {"FlashMLA": [2.0, 2.0, 2.0], "dsmla": [1.8, 1.9, 2.2], "dsmla H16": [1.0, 1.0, 1.0]}
    pairs = [("dsmla", "dsmla", ["FlashMLA"]), ("dsmla H16", "dsmla H16", ["FlashMLA"])]
    medians, ratios = paired.summarize(samples, pairs)
    rows = [dict(workload="prefill S1024 H64", medians_ms=medians, ratios=ratios,
                 checks={"dsmla": 3e-3, "dsmla H16": 0.5}, bars={"dsmla": 1.0, "dsmla H16": 0.75},
                 sm_clock_mhz=[1980, 1530, None]),
            dict(workload="decode B64 H128", error="RuntimeError('x')")]
    text = paired.markdown(env, rows)
    assert "| prefill S1024 H64 | dsmla | 1.900 ms | FlashMLA 2.000 | 0.950x (0.910-1.070) | 0.950x | yes (<= 1.0) " \
           "| ok 3.0e-03 |" in text
    assert "| dsmla H16 | 1.000 ms | FlashMLA 2.000 | 0.500x (0.500-0.500) | 0.500x | yes (<= 0.75) | **MISMATCH** " \
           "5.0e-01 |" in text
    assert "SM clock over the rounds | 1530-1980 MHz" in text
    assert "| decode B64 H128 | failed: RuntimeError('x') |" in text


def test_a_workload_row_from_build_to_ratios(monkeypatch):
    import contextlib
    clock = [0.0]
    torch = fake_torch(clock)
    attention = types.ModuleType("torch.nn.attention")
    attention.sdpa_kernel = lambda backends: contextlib.nullcontext()
    attention.SDPBackend = types.SimpleNamespace(CUDNN_ATTENTION="cudnn")
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    monkeypatch.setitem(sys.modules, "torch.nn", types.ModuleType("torch.nn"))
    monkeypatch.setitem(sys.modules, "torch.nn.attention", attention)
    closed = []
    shims = [types.SimpleNamespace(label=label, close_batches=lambda label=label: closed.append(label))
             for label in ("main", "exp")]

    def contender(ms):
        def run():
            clock[0] += ms
        return run

    def build(torch_, ab, shims_, S, H):
        assert (S, H) == (1024, 128)
        return ({"FlashMLA": contender(2.0), "main": contender(2.0), "exp": contender(1.0)},
                [("main", "prefill", "FlashMLA"), ("exp", "prefill", "FlashMLA")], {"main": 1e-3, "exp": 2e-3})
    row = paired.measure(torch, None, shims, "prefill", build, dict(S=1024, H=128), rounds=4, warmup=1,
                         clock=lambda: None)
    assert row["workload"] == "prefill S1024 H128"
    assert {k: v["median"] for k, v in row["ratios"].items()} == {"main": 1.0, "exp": 0.5, "exp / main": 0.5}
    assert row["bars"] == {"main": 1.0, "exp": 1.0} and closed == ["main", "exp"]

    def broken(torch_, ab, shims_, S, H):
        raise RuntimeError("no such anchor")
    row = paired.measure(torch, None, shims, "prefill", broken, dict(S=1024, H=128), 4, 1, lambda: None)
    assert row == dict(workload="prefill S1024 H128", kind="prefill", S=1024, H=128,
                       error="RuntimeError('no such anchor')")
    assert closed == ["main", "exp", "main", "exp"]  # a failed workload frees its dense batches too


def test_shim_specs_carry_a_label_and_environment_settings():
    assert paired.parse_shim("b/lib.so", 0) == ("b/lib.so", "dsmla", {})
    assert paired.parse_shim("b/lib.so", 2) == ("b/lib.so", "dsmla2", {})
    assert paired.parse_shim("b/lib.so=halves,DSMLA_SPARSE_KEY_ROWS=2,X=", 1) == \
        ("b/lib.so", "halves", {"DSMLA_SPARSE_KEY_ROWS": "2", "X": ""})
    with pytest.raises(ValueError, match="'oops' is not NAME=VALUE"):
        paired.parse_shim("b/lib.so=a,oops", 0)
    with pytest.raises(ValueError, match="settings come after a label"):
        paired.parse_shim("b/lib.so=DSMLA_SPARSE_KEY_ROWS=2", 0)
    with pytest.raises(ValueError, match="names an anchor"):
        paired.parse_shim("b/lib.so=FlashMLA", 0)


def test_a_contenders_environment_is_in_force_around_its_calls_only(monkeypatch):
    monkeypatch.delenv("DSMLA_PAIRED_TEST", raising=False)
    monkeypatch.setenv("DSMLA_PAIRED_KEPT", "before")
    clock, seen = [0.0], []

    def contender(name, env):
        def run():
            seen.append((name, os.environ.get("DSMLA_PAIRED_TEST"), os.environ.get("DSMLA_PAIRED_KEPT")))
            clock[0] += 1.0
        run.env = env
        return run
    contenders = {"plain": contender("plain", {}),
                  "switched": contender("switched", {"DSMLA_PAIRED_TEST": "2", "DSMLA_PAIRED_KEPT": "inside"})}
    paired.time_rounds(fake_torch(clock), contenders, rounds=2, warmup=1, clock=lambda: None)
    assert set(seen) == {("plain", None, "before"), ("switched", "2", "inside")}
    assert "DSMLA_PAIRED_TEST" not in os.environ and os.environ["DSMLA_PAIRED_KEPT"] == "before"
