#!/usr/bin/env python3
"""Timelines of the sparse MLA kernel's CTAs from a traced build's stamps.

Input: the CSV that `sparse_mla_kernel_bench --trace FILE` appends (rows
case,cta,slot,value; a build with -DDSMLA_TRACE=ON; slots as
src/cuda/sparse_mla/head_rows_work.cuh's trace_slot and
src/cuda/common/trace.cuh say). Each CTA's clock64 stamps become microseconds
after that CTA's start, at the SM clock its own globaltimer stamps give; the
CTAs' starts are placed on one axis by globaltimer.

Output (markdown, per case): the kernel's span, the CTAs' phases (percentiles
over CTAs): start after the first CTA, barriers initialised, first slots and
query issued, query landed, first half stored, S_0 done, the blocks, the last
P V, the epilogue, the end; then per block the steady-state intervals of
each role (producer: wait for an empty buffer, convert + store a half;
warpgroup 0: S_k to S_k+1, S_k to P_k handed over; warpgroup 1: P_k received
to its P_k V_k done).

Usage: bench/trace_timeline.py TRACE.csv [--case TEXT]
"""
import argparse
import collections
import csv
import statistics
import sys

BEGIN_NS, BEGIN_CLK, SMID, END_NS, END_CLK = 0, 1, 2, 3, 15
INIT_DONE, SLOTS_ISSUED, QUERY_ISSUED = 4, 6, 7
ITEM_START, BEFORE_EPILOGUE, AFTER_EPILOGUE, QUERY_LANDED = 8, 9, 10, 11
BLOCKS, STORED, EMPTY_DONE, WG0, WG1 = 64, 16, 144, 272, 400
# (the kernel's side: trace::kBegin / kEnd / kEndClock in src/cuda/common/trace.cuh,
# trace_slot in src/cuda/sparse_mla/head_rows_work.cuh)


def pct(values, q):
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))]


def load(path):
    cases = collections.OrderedDict()
    with open(path, newline="") as f:
        for name, cta, slot, value in csv.reader(f):
            cases.setdefault(name, collections.defaultdict(dict))[int(cta)][int(slot)] = int(value)
    return cases


def cta_clock_ghz(stamps):
    """The CTA's SM clock in GHz (clock64 ticks over globaltimer ns from its start to its end), or None."""
    if not all(k in stamps for k in (BEGIN_NS, BEGIN_CLK, END_NS, END_CLK)):
        return None
    ns = stamps[END_NS] - stamps[BEGIN_NS]
    clk = stamps[END_CLK] - stamps[BEGIN_CLK]
    return clk / ns if ns > 0 and clk > 0 else None


def cta_timeline(stamps):
    """Microseconds after the CTA's start for every clock slot, and its clock in GHz."""
    ghz = cta_clock_ghz(stamps)
    if ghz is None:
        return None
    us = {s: (v - stamps[BEGIN_CLK]) / ghz / 1e3 for s, v in stamps.items()
          if s not in (BEGIN_NS, BEGIN_CLK, SMID, END_NS)}
    return us, ghz


def row(label, values):
    if not values:
        return f"| {label} | - | - | - | - | 0 |"
    return (f"| {label} | {pct(values, 0.1):.2f} | {pct(values, 0.5):.2f} | {pct(values, 0.9):.2f} | "
            f"{max(values):.2f} | {len(values)} |")


def report(name, ctas):
    starts = {c: s[BEGIN_NS] for c, s in ctas.items() if BEGIN_NS in s}
    ends = {c: s[END_NS] for c, s in ctas.items() if END_NS in s}
    if not starts or not ends:
        print(f"## {name}\n\nno complete CTA rows\n")
        return
    t0 = min(starts.values())
    print(f"## {name}\n")
    print(f"{len(ctas)} CTAs; kernel span (first start to last end, globaltimer) "
          f"{(max(ends.values()) - t0) / 1e3:.2f} us\n")
    phases = collections.defaultdict(list)
    per_block = collections.defaultdict(list)
    clocks = []
    for c, stamps in ctas.items():
        t = cta_timeline(stamps)
        if t is None:
            continue
        us, ghz = t
        clocks.append(ghz)
        phases["start after the first CTA"].append((stamps[BEGIN_NS] - t0) / 1e3)
        for label, slot in (("barriers initialised", INIT_DONE), ("producer: first slots issued", SLOTS_ISSUED),
                            ("producer: query issued", QUERY_ISSUED), ("wg0: query landed", QUERY_LANDED),
                            ("producer: block 0 lo stored", STORED), ("producer: block 0 hi stored", STORED + 1),
                            ("wg0: S_0 done", WG0), ("wg0: last item started", ITEM_START),
                            ("wg0: epilogue starts", BEFORE_EPILOGUE), ("wg0: epilogue ends", AFTER_EPILOGUE),
                            ("wg1: epilogue starts", BEFORE_EPILOGUE + 4),
                            ("wg1: epilogue ends", AFTER_EPILOGUE + 4), ("end", END_CLK)):
            if slot in us:
                phases[label].append(us[slot])
        blocks = [k for k in range(BLOCKS) if WG0 + 2 * k in us]
        if blocks:
            last = blocks[-1]
            phases["blocks (wg0)"].append(len(blocks))
            if WG1 + 2 * last + 1 in us:
                phases["wg1: last P V done"].append(us[WG1 + 2 * last + 1])
            if WG0 in us and WG0 + 2 * last in us and last > 0:
                phases["wg0: mean S_k to S_k+1"].append((us[WG0 + 2 * last] - us[WG0]) / last)
                # The longest step and where it is (an item switch shows as one per item).
                gaps = [(us[WG0 + 2 * (k + 1)] - us[WG0 + 2 * k], k) for k in blocks[:-1]]
                longest, at = max(gaps)
                phases["wg0: longest S_k to S_k+1"].append(longest)
                phases["wg0: ... at block k"].append(at)
        for k in range(BLOCKS):
            s, p = us.get(WG0 + 2 * k), us.get(WG0 + 2 * k + 1)
            s_next = us.get(WG0 + 2 * (k + 1))
            if s is not None and s_next is not None:
                per_block["wg0: S_k done to S_k+1 done"].append(s_next - s)
            if s is not None and p is not None:
                per_block["wg0: S_k done to P_k handed over"].append(p - s)
            r, d = us.get(WG1 + 2 * k), us.get(WG1 + 2 * k + 1)
            if r is not None and d is not None:
                per_block["wg1: P_k received to P_k V_k done"].append(d - r)
            if p is not None and r is not None:
                per_block["wg0 P_k handed over to wg1 received"].append(r - p)
            for half, hname in ((0, "lo"), (1, "hi")):
                e, st = us.get(EMPTY_DONE + 2 * k + half), us.get(STORED + 2 * k + half)
                if e is not None and st is not None:
                    per_block[f"producer: {hname} convert + store"].append(st - e)
                # The half stored before this one (none before block 0's lo half).
                prev = us.get(STORED + 2 * k + half - 1) if 2 * k + half > 0 else None
                if e is not None and prev is not None:
                    per_block[f"producer: stored before to {hname} buffer free"].append(e - prev)
            st_hi = us.get(STORED + 2 * k + 1)
            if st_hi is not None and s is not None:
                per_block["wg0: S_k done after its hi half stored"].append(s - st_hi)
    print(f"SM clock from the stamps: {pct(clocks, 0.5):.3f} GHz (p10 {pct(clocks, 0.1):.3f}, "
          f"p90 {pct(clocks, 0.9):.3f})\n")
    print("| phase (us after the CTA's start) | p10 | p50 | p90 | max | CTAs |\n|---|---|---|---|---|---|")
    for label, values in phases.items():
        print(row(label, values))
    print("\n| per block (us) | p10 | p50 | p90 | max | samples |\n|---|---|---|---|---|---|")
    for label, values in per_block.items():
        print(row(label, values))
    print()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--case", default="")
    args = ap.parse_args()
    cases = load(args.trace)
    if not cases:
        sys.exit(f"{args.trace}: no stamps")
    for name, ctas in cases.items():
        if args.case in name:
            report(name, ctas)


if __name__ == "__main__":
    main()
