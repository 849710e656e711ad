#!/usr/bin/env python3
"""Where a dense MHA block's time goes, from a traced build's stamps.

Input: the CSV that `dense_mha_kernel_bench --trace FILE` appends (rows
case,block,slot,value; a build with -DDSMLA_TRACE=ON; slots as
src/cuda/dense_mha/dense_mha_kernel.cuh's trace_slot says: per unit of a
block, consumer 0's stamps when it received the unit, when the unit's Q had
landed, when its last P V was done and when its epilogue was, the unit's key
tiles, and the producer's stamp when it issued the Q).

Output (markdown, per case), in SM clock cycles (the stamps' unit) over the
traced units of every block:
- the share of the traced span in each phase: waiting for the unit's Q
  (received -> Q landed), the main loop (Q landed -> last P V done), the
  epilogue, and the gap to the next unit (epilogue done -> next received);
- cycles per key tile in the main loop, by the unit's key tiles, against the
  tensor work of a tile (2 x 128 x 128 x 320 FLOP at 4096 dense bf16 FLOP a
  cycle and SM: 2560 cycles);
- how long before the consumer wanted it the producer issued each Q.

Usage: bench/dense_trace.py TRACE.csv [--case TEXT]
"""
import argparse
import collections
import statistics

from trace_timeline import cta_clock_ghz, load, pct  # the same CSV rows, clock and percentiles

UNIT0, PER_UNIT, UNITS = 16, 6, 88
RECEIVED, Q_LANDED, LAST_PV, EPILOGUE, KEY_TILES, Q_ISSUED = range(6)
TILE_CYCLES = 2 * 128 * 128 * 320 / 4096


def units_of(stamps):
    """The block's traced units as dicts of their stamps (complete ones only)."""
    out = []
    for n in range(UNITS):
        u = {k: stamps.get(UNIT0 + PER_UNIT * n + k) for k in range(PER_UNIT)}
        if any(v is None for v in u.values()):
            break
        out.append(u)
    return out


def summarise(name, blocks):
    phases = collections.Counter()
    per_tile = collections.defaultdict(list)
    q_lead, ghz = [], []
    for stamps in blocks.values():
        if (block_ghz := cta_clock_ghz(stamps)) is not None:
            ghz.append(block_ghz)
        us = units_of(stamps)
        for i, u in enumerate(us):
            phases["waiting for Q"] += u[Q_LANDED] - u[RECEIVED]
            phases["main loop"] += u[LAST_PV] - u[Q_LANDED]
            phases["epilogue"] += u[EPILOGUE] - u[LAST_PV]
            if i + 1 < len(us):
                phases["to the next unit"] += us[i + 1][RECEIVED] - u[EPILOGUE]
            per_tile[u[KEY_TILES]].append((u[LAST_PV] - u[Q_LANDED]) / u[KEY_TILES])
            q_lead.append(u[Q_LANDED] - u[Q_ISSUED])
    total = sum(phases.values())
    print(f"## {name}\n")
    if not total:
        print("no complete units traced\n")
        return
    clock = f"{statistics.median(ghz):.3f} GHz" if ghz else "unknown"
    count = sum(len(v) for v in per_tile.values())
    print(f"{len(blocks)} blocks; SM clock (median over blocks) {clock}; {count} units traced\n")
    print("| phase | share of the traced span | cycles a unit (mean) |\n|---|---|---|")
    for k in ("waiting for Q", "main loop", "epilogue", "to the next unit"):
        print(f"| {k} | {100 * phases[k] / total:.1f} % | {phases[k] / count:.0f} |")
    print(f"\n| key tiles of the unit | units | cycles a tile p10 / p50 / p90 | p50 / {TILE_CYCLES:.0f} |\n|---|---|---|---|")
    for k in sorted(per_tile):
        v = per_tile[k]
        print(f"| {k} | {len(v)} | {pct(v, .1):.0f} / {pct(v, .5):.0f} / {pct(v, .9):.0f} | "
              f"{pct(v, .5) / TILE_CYCLES:.2f} |")
    print(f"\nQ issued to Q landed (cycles): p10 {pct(q_lead, .1):.0f}, p50 {pct(q_lead, .5):.0f}, "
          f"p90 {pct(q_lead, .9):.0f}\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--case")
    a = ap.parse_args()
    for name, blocks in load(a.trace).items():
        if a.case is None or a.case in name:
            summarise(name, blocks)


if __name__ == "__main__":
    main()
