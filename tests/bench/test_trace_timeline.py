"""bench/trace_timeline.py without a GPU: stamps of two made-up CTAs, whose
phases and per-block intervals are known, read back as microseconds."""
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
import trace_timeline as tt  # noqa: E402

GHZ = 2  # clocks per ns


def cta_rows(name, cta, start_ns, blocks, block_us):
    """A CTA that starts at start_ns, stores each block's halves, computes S_k
    every block_us and ends 1 us after its last block."""
    clk0 = 1_000_000 * (cta + 1)  # SM clocks differ between CTAs
    at = lambda us: clk0 + int(us * 1e3 * GHZ)  # noqa: E731
    rows = {tt.BEGIN_NS: start_ns, tt.BEGIN_CLK: clk0, tt.SMID: cta, tt.INIT_DONE: at(0.5)}
    for k in range(blocks):
        rows[tt.EMPTY_DONE + 2 * k] = at(1 + k * block_us)
        rows[tt.STORED + 2 * k] = at(1.25 + k * block_us)
        rows[tt.EMPTY_DONE + 2 * k + 1] = at(1.25 + k * block_us)
        rows[tt.STORED + 2 * k + 1] = at(1.5 + k * block_us)
        rows[tt.WG0 + 2 * k] = at(2 + k * block_us)
        rows[tt.WG0 + 2 * k + 1] = at(2.5 + k * block_us)
        rows[tt.WG1 + 2 * k] = at(2.6 + k * block_us)
        rows[tt.WG1 + 2 * k + 1] = at(3 + k * block_us)
    end_us = 3 + blocks * block_us
    rows[tt.END_CLK] = at(end_us)
    rows[tt.END_NS] = start_ns + int(end_us * 1e3)
    return [f"{name},{cta},{slot},{value}" for slot, value in rows.items()]


def test_timeline_of_two_ctas(tmp_path):
    path = tmp_path / "trace.csv"
    lines = cta_rows("decode X", 0, 5_000, 4, 3.0) + cta_rows("decode X", 1, 7_000, 4, 3.0)
    path.write_text("\n".join(lines) + "\n")
    cases = tt.load(path)
    assert list(cases) == ["decode X"]
    us, ghz = tt.cta_timeline(cases["decode X"][1])
    assert abs(ghz - GHZ) < 1e-3
    assert abs(us[tt.WG0 + 2] - 5.0) < 1e-3  # S_1 done at 2 + 3 us
    out = subprocess.run([sys.executable, str(REPO / "bench/trace_timeline.py"), str(path)],
                         capture_output=True, text=True, check=True).stdout
    assert "kernel span (first start to last end, globaltimer) 17.00 us" in out  # 2 us later start + 15 us
    assert "| wg0: S_k done to S_k+1 done | 3.00 | 3.00 | 3.00 | 3.00 | 6 |" in out
    assert "| wg0: longest S_k to S_k+1 | 3.00 | 3.00 | 3.00 | 3.00 | 2 |" in out
    assert "| producer: lo convert + store | 0.25 | 0.25 | 0.25 | 0.25 | 8 |" in out
    assert "| start after the first CTA | 0.00 | 0.00 | 2.00 | 2.00 | 2 |" in out  # p50 of two: the lower


def test_cta_without_end_is_skipped():
    assert tt.cta_timeline({tt.BEGIN_NS: 1, tt.BEGIN_CLK: 2}) is None
