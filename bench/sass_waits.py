#!/usr/bin/env python3
"""Scoreboard reading of one kernel's SASS: which instructions wait on which
dependency scoreboards, and which loads set them (sm_90 control bits).

ptxas tracks a variable-latency result (a global load, a shared load, a
constant load) with one of six scoreboards; an instruction that needs it
carries a wait mask and stalls until every operation on the masked
scoreboards has completed, not only the one it reads. When ptxas puts all
of a warp's global loads on one scoreboard, a load prefetched into
registers hides latency only if the first wait after it comes late enough
(src/cuda/sparse_mla/NOTES.md, "The unpaired roles round, a loop over
blocks").

  cuobjdump -sass build/.../head_rows.cu.o > k.sass
  bench/sass_waits.py k.sass KERNEL_SUBSTRING [--from 0x13a00 --to 0x18400] [--loads] [--loops]

Default: every wait on a scoreboard with global loads in flight (in
address order), with how many it waits for. --loads: also every load
with its scoreboard. --loops: every backward branch and the first waits
after its target (what a loop head waits for).

cuobjdump and nvdisasm come with the CUDA toolkit, or from PyPI
(nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm).
"""
import argparse
import re
import sys

INSTR = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);\s+/\* (0x[0-9a-f]+) \*/")
WORD = re.compile(r"/\* (0x[0-9a-f]+) \*/")


def parse(path, kernel):
    """(address, text, wait mask, write scoreboard or None) of the first kernel whose name contains `kernel`."""
    lines = open(path).read().split("\n")
    out, on, seen = [], False, False
    for i, line in enumerate(lines):
        m = re.match(r"\s+Function : (\S+)", line)
        if m:
            if seen and on:
                break
            on = kernel in m.group(1)
            seen = seen or on
            continue
        m = INSTR.match(line) if on else None
        if not m:
            continue
        high = int(WORD.search(lines[i + 1]).group(1), 16)
        control = high >> 41  # stall 4 bits, yield 1, write barrier 3, read barrier 3, wait mask 6, reuse 4
        write = (control >> 5) & 7
        out.append((int(m.group(1), 16), m.group(2).strip(), (control >> 11) & 0x3F, None if write == 7 else write))
    if not seen:
        sys.exit(f"sass_waits: no kernel containing '{kernel}' in {path}")
    return out


def is_global_load(text):
    op = re.sub(r"^@!?U?P\w+\s+", "", text).split()[0]
    return op.startswith("LDG") and not op.startswith("LDGSTS") and not op.startswith("LDGDEPBAR")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sass")
    ap.add_argument("kernel")
    ap.add_argument("--from", dest="lo", type=lambda s: int(s, 16), default=0)
    ap.add_argument("--to", dest="hi", type=lambda s: int(s, 16), default=1 << 40)
    ap.add_argument("--loads", action="store_true")
    ap.add_argument("--loops", action="store_true")
    a = ap.parse_args()
    code = parse(a.sass, a.kernel)
    load_boards = {w for _, t, _, w in code if w is not None and is_global_load(t)}
    load_mask = sum(1 << b for b in load_boards)
    print(f"{len(code)} instructions; global loads write scoreboard(s) {sorted(load_boards)}")
    # Global loads issued (in address order) and not yet waited for, per scoreboard: a wait
    # on a board that has none (a constant or shared load shares it) is not printed.
    pending = [0] * 6
    # (Address order: what a loop carries round its back edge is not counted at
    # its head; --loops shows the head's waits.)
    for addr, text, wait, write in code:
        shown = a.lo <= addr <= a.hi
        covered = [b for b in range(6) if wait >> b & 1 and pending[b]]
        if covered:
            n = sum(pending[b] for b in covered)
            if shown:
                print(f"{addr:#07x}  waits SB{','.join(map(str, covered))} for {n} global loads  {text[:60]}")
            for b in covered:
                pending[b] = 0
        if write is not None and is_global_load(text):
            pending[write] += 1
            if a.loads and shown:
                print(f"  {addr:#07x}  load -> SB{write}  {text[:70]}")
    if a.loops:
        index = {addr: k for k, (addr, _, _, _) in enumerate(code)}
        for k, (addr, text, _, _) in enumerate(code):
            m = re.search(r"BRA (?:`\(\.L_x_\d+\) )?0x([0-9a-f]+)", text)
            if not m or not a.lo <= addr <= a.hi:
                continue
            target = int(m.group(1), 16)
            if target >= addr or target not in index:
                continue
            j = index[target]
            waits = [f"{code[x][0]:#x} {bin(code[x][2])[2:]} {code[x][1][:40]}"
                     for x in range(j, min(j + 40, len(code))) if code[x][2] & load_mask][:2]
            print(f"loop {target:#x}..{addr:#x} ({k - j} instructions): head waits {waits or 'none on loads'}")


if __name__ == "__main__":
    main()
