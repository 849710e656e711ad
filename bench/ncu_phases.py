#!/usr/bin/env python3
"""Where a kernel's time goes, from Nsight Compute's per-instruction stall sampling.

  bench/ncu_phases.py SOURCE_CSV [--top N]

SOURCE_CSV is `ncu -i REPORT --page source --csv --print-source sass` of a report
taken with `--set full` (scripts/gpu-profile.sh writes it). Prints:
  * the warp-stall reasons over the whole kernel (share of samples);
  * the kernel cut into phases at every block or cluster barrier (BAR.SYNC,
    UCGABAR_WAIT) and at EXIT, each with its share of the samples and its executed
    warp instructions (phases under 1 % of the samples are left out);
  * the samples at each mbarrier wait, grouped by the barrier's shared-memory
    offset (the immediate of the try-wait's address: a kernel's barriers sit at
    fixed offsets, so the offset names the barrier whichever register holds the
    base), each try-wait counted with the branch that retries it;
  * warp-specialised kernels: the stretches between setmaxnreg instructions (the
    warpgroups' roles), each with its samples, executed warp instructions, stall
    reasons and most executed opcodes;
  * the N instructions with the most samples (default 20), with their executed count.
A phase is a stretch of the SASS between barriers in address order, so a loop's
body and its barrier land in one phase; in warp-specialised kernels (mbarrier
waits, no block barrier in the main loop) the whole main loop is one phase and the
top instructions and the mbarrier waits say more. Used for the indexer top-k
(src/cuda/indexer/NOTES.md, "Top-k v3") and the sparse prefill round
(src/cuda/sparse_mla/NOTES.md, "Profile of the round after the cuts").
"""
import collections
import csv
import re
import sys

# SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR10+0x386a8], R3: the barrier's offset is the last immediate of the address.
TRY_WAIT = re.compile(r"TRYWAIT\b.*\[[^\]]*?(0x[0-9a-fA-F]+)\]")


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if not args:
        sys.exit(__doc__)
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 20
    rows = list(csv.reader(open(args[0], newline="")))
    header_at = next((i for i, r in enumerate(rows) if "Address" in r and "Source" in r), None)
    if header_at is None:
        sys.exit(f"{args[0]}: no 'Address' / 'Source' header: not an ncu --page source --csv file")
    header = rows[header_at]
    col = {name: i for i, name in enumerate(header)}
    for needed in ("# Samples", "Instructions Executed"):
        if needed not in col:
            sys.exit(f"{args[0]}: no '{needed}' column (was the report taken with --set full?)")
    stall_cols = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    data = [r for r in rows[header_at + 1:] if len(r) == len(header)]

    def num(r, name):
        value = r[col[name]].replace(",", "")
        return int(float(value)) if value not in ("", "-") else 0

    total = sum(num(r, "# Samples") for r in data)
    if total == 0:
        sys.exit(f"{args[0]}: no stall samples")
    stalls = collections.Counter()
    for r in data:
        for h in stall_cols:
            stalls[h] += num(r, h)
    print(f"{len(data)} SASS instructions, {total} samples, "
          f"{sum(num(r, 'Instructions Executed') for r in data)} warp instructions executed")
    print("stalls: " + ", ".join(f"{k[len('stall_'):]} {100 * v / total:.0f} %" for k, v in stalls.most_common(8)))

    print("\nphases (cut at barriers, address order):")
    print("| from | to | ends with | samples % | warp instructions |")
    print("|---|---|---|---:|---:|")
    start, samples, executed = None, 0, 0
    for r in data:
        source = r[col["Source"]].strip()
        start = start or r[col["Address"]]
        samples += num(r, "# Samples")
        executed += num(r, "Instructions Executed")
        if source.startswith("BAR.SYNC") or "UCGABAR_WAIT" in source or source.startswith("EXIT"):
            if 100 * samples / total >= 1:
                print(f"| {start[-5:]} | {r[col['Address']][-5:]} | {source.split(' ;')[0][:24]} | "
                      f"{100 * samples / total:.1f} | {executed} |")
            start, samples, executed = None, 0, 0

    # Warp-specialised kernels: each warpgroup's code starts at its setmaxnreg
    # (USETMAXREG), so the stretches between them are the roles.
    cuts = [i for i, r in enumerate(data) if "USETMAXREG" in r[col["Source"]]]
    if cuts:
        print("\nroles (cut at each setmaxnreg, address order): samples, executed warp instructions, "
              "their stall reasons, the most executed opcodes")
        print("| from | samples % | warp instructions | stalls | opcodes |")
        print("|---|---:|---:|---|---|")
        for lo, hi in zip([0] + cuts, cuts + [len(data)]):
            part = data[lo:hi]
            samples = sum(num(r, "# Samples") for r in part)
            reasons = collections.Counter()
            ops = collections.Counter()
            for r in part:
                for h in stall_cols:
                    reasons[h[len("stall_"):]] += num(r, h)
                words = [w for w in r[col["Source"]].split() if not w.startswith("@")]
                if words:
                    ops[words[0].split(".")[0]] += num(r, "Instructions Executed")
            n = sum(reasons.values()) or 1
            print(f"| {part[0][col['Address']][-5:]} | {100 * samples / total:.1f} | "
                  f"{sum(ops.values())} | " + ", ".join(f"{k} {100 * v / n:.0f} %" for k, v in reasons.most_common(5)) +
                  " | " + ", ".join(f"{k} {v}" for k, v in ops.most_common(8)) + " |")

    waits = collections.Counter()
    sites = collections.Counter()
    for i, r in enumerate(data):
        m = TRY_WAIT.search(r[col["Source"]])
        if m:
            retry = data[i + 1] if i + 1 < len(data) and "BRA" in data[i + 1][col["Source"]] else None
            waits[m.group(1)] += num(r, "# Samples") + (num(retry, "# Samples") if retry else 0)
            sites[m.group(1)] += 1
    if waits:
        print("\nmbarrier waits (try-wait + its retry branch), by barrier offset:")
        print("| barrier offset | wait sites | samples % |")
        print("|---|---:|---:|")
        for offset, samples in waits.most_common():
            if 100 * samples / total >= 0.1:
                print(f"| {offset} | {sites[offset]} | {100 * samples / total:.1f} |")

    print(f"\ntop {top} instructions by samples:")
    print("| address | samples % | executed | instruction |")
    print("|---|---:|---:|---|")
    for r in sorted(data, key=lambda r: -num(r, "# Samples"))[:top]:
        print(f"| {r[col['Address']][-5:]} | {100 * num(r, '# Samples') / total:.1f} | "
              f"{num(r, 'Instructions Executed')} | {r[col['Source']].strip()[:70]} |")


if __name__ == "__main__":
    main()
