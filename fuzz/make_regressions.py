#!/usr/bin/env python3
"""Writes fuzz/regressions/<target>/: the inputs of issue 6 (a hostile-user
audit of `dsmla run`), one file per item. scripts/fuzz.sh runs every file
through every fuzz target; tests/cli/cli_robustness_test.cpp checks the CLI's
answer to each. Run from anywhere: python3 fuzz/make_regressions.py"""
import json
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "regressions")


def safetensors(header: bytes, data: bytes = b"", pad: bool = True) -> bytes:
    if pad:
        header += b" " * ((8 - len(header) % 8) % 8)
    return struct.pack("<Q", len(header)) + header + data


SIZES = {"BF16": 2, "U8": 1, "I32": 4, "I64": 8}


def case_file(tensors, metadata, extra_header=b"", raw_metadata=None):
    """tensors: [(name, dtype, shape, bytes)]; metadata: dict of strings."""
    header, data, offset = {}, b"", 0
    for name, dtype, shape, blob in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        data += blob
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":"))
    meta = raw_metadata if raw_metadata is not None else json.dumps(metadata, separators=(",", ":"))
    text = '{"__metadata__":' + meta + "," + text[1:]
    return safetensors(text.encode() + extra_header, data)


def i32(values):
    return struct.pack("<%di" % len(values), *values)


def i64(values):
    return struct.pack("<%dq" % len(values), *values)


def tiny_case(seq_lens=(6, 6), query_lens=(2, 2), block_table=None, slots=None, heads=16, block=4,
              bpt=1152, q_value=0x3F80, topk=8, cache_blocks=None, metadata=None):
    """A small valid case without w_kv_b (fuzz_case adds a zero one); request r owns
    blocks 2r, 2r+1 unless block_table is given."""
    R = len(seq_lens)
    T = sum(query_lens)
    M = max((s + block - 1) // block for s in seq_lens)
    if block_table is None:
        block_table = [r * M + j for r in range(R) for j in range(M)]
    n_blocks = cache_blocks if cache_blocks is not None else max(block_table) + 1
    qsl = [0]
    for q in query_lens:
        qsl.append(qsl[-1] + q)
    if slots is None:
        slots = []
        for r in range(R):
            ctx = seq_lens[r] - query_lens[r]
            for i in range(query_lens[r]):
                p = ctx + i
                slots.append(block_table[r * M + p // block] * block + p % block)
    topk_rows = []
    for r in range(R):
        ctx = seq_lens[r] - query_lens[r]
        for i in range(query_lens[r]):
            row = list(range(min(ctx + i + 1, topk)))
            topk_rows += row + [-1] * (topk - len(row))
    meta = {"topk": str(topk)}
    meta.update(metadata or {})
    tensors = [
        ("q", "BF16", [T, heads, 192], struct.pack("<H", q_value) * (T * heads * 192)),
        ("kv_c", "BF16", [T, 512], struct.pack("<H", 0x3F80) * (T * 512)),
        ("k_pe", "BF16", [T, 64], struct.pack("<H", 0x3F80) * (T * 64)),
        ("kv_cache", "U8", [n_blocks, block, bpt], bytes(n_blocks * block * bpt)),
        ("block_table", "I32", [R, M], i32(block_table)),
        ("seq_lens", "I32", [R], i32(seq_lens)),
        ("query_start_loc", "I32", [R + 1], i32(qsl)),
        ("slot_mapping", "I64", [T], i64(slots)),
        ("topk_indices", "I32", [T, topk], i32(topk_rows)),
    ]
    return tensors, meta


def write(target, name, blob):
    os.makedirs(os.path.join(ROOT, target), exist_ok=True)
    with open(os.path.join(ROOT, target, name), "wb") as f:
        f.write(blob)


def planner_input(heads_sel, fmt, policy, threshold, topk, block, max_blocks, T, n_blocks, qsl, seq, bt, slots,
                  topk_indices=()):
    out = struct.pack("<BBBBiiiiq", heads_sel, fmt, policy, threshold, topk, block, max_blocks, T, n_blocks)
    for arr, code in ((qsl, "i"), (seq, "i"), (bt, "i"), (slots, "q")):
        out += struct.pack("<H", len(arr)) + struct.pack("<%d%s" % (len(arr), code), *arr)
    return out + i32(list(topk_indices))


def main():
    good_tensors, good_meta = tiny_case()
    good = case_file(good_tensors, good_meta)
    write("case", "valid_tiny_case", good)

    # 1. header nesting 55,000 levels deep (110 KB): stack overflow in json::dump.
    write("safetensors", "item01_deep_nesting", safetensors(b'{"q":' + b"[" * 55000 + b"]" * 55000 + b"}"))
    # 2. q [0, 2^62, 192] with w_kv_b [0, 512]: signed overflow of H * 256.
    write("case", "item02_extent_overflow",
          case_file([("q", "BF16", [0, 1 << 62, 192], b""), ("w_kv_b", "BF16", [0, 512], b"")], {}))
    # 3. two tokens write one slot (request 1 lists request 0's second block).
    t, m = tiny_case(block_table=[0, 1, 2, 1])
    write("case", "item03_two_tokens_one_slot", case_file(t, m))
    #    a new token's slot holds another request's cached prefix position.
    t, m = tiny_case(query_lens=(1, 2), block_table=[0, 1, 2, 1])
    write("case", "item03_overwrites_prefix", case_file(t, m))
    write("planner", "item03_two_tokens_one_slot",
          planner_input(0, 0, 0, 1, 8, 4, 2, 4, 4, [0, 2, 4], [6, 6], [0, 1, 2, 1], [4, 5, 4, 5]))
    # 4. bytes after the header object; a UTF-8 byte order mark before it.
    header_len = struct.unpack("<Q", good[:8])[0]
    header, data = good[8:8 + header_len].rstrip(b" "), good[8 + header_len:]
    write("safetensors", "item04_garbage_after_header", safetensors(header + b"\0GARBAGE", data))
    write("safetensors", "item04_nul_then_brace", safetensors(header + b"\0}", data))
    write("safetensors", "item04_byte_order_mark", safetensors(b"\xef\xbb\xbf" + header, data))
    # 5. duplicate keys: "q" twice at the top level, "topk" twice in __metadata__.
    dup_q = header[:1] + b'"q":{"dtype":"BF16","shape":[0,16,192],"data_offsets":[0,0]},' + header[1:]
    write("safetensors", "item05_duplicate_tensor", safetensors(dup_q, data))
    prefix = b'{"__metadata__":{'
    assert header.startswith(prefix)
    write("safetensors", "item05_duplicate_metadata", safetensors(prefix + b'"topk":"4",' + header[len(prefix):], data))
    # 6. finite inputs that overflow.
    t, m = tiny_case(metadata={"scale": "1e38"})
    write("case", "item06_scale_1e38", case_file(t, m))
    t, m = tiny_case(bpt=576, metadata={"cache_format": "fp8", "k_scale": "3e38"})
    write("case", "item06_k_scale_3e38", case_file(t, m))
    t, m = tiny_case(q_value=0x7F7F)  # 3.39e38, the largest finite bf16
    write("case", "item06_bf16_max_q", case_file(t, m))
    # 7. a NUL inside a metadata value; a 300,000-element JSON value.
    t, m = tiny_case(metadata={"policy": "fast\0est"})
    write("safetensors", "item07_nul_in_metadata", case_file(t, m))
    t, m = tiny_case()
    big = "[" + ",".join(["0"] * 300000) + "]"
    write("safetensors", "item07_huge_value",
          case_file(t, m, raw_metadata=json.dumps(m, separators=(",", ":"))[:-1] + ',"zz_big":' + big + "}"))
    # 8 / 9 are about output paths (-o /dev/full, -o CASE): CLI tests only.
    # 10. the undocumented cache_format aliases.
    t, m = tiny_case(metadata={"cache_format": "auto"})
    write("case", "item10_cache_format_auto", case_file(t, m))
    t, m = tiny_case(bpt=576, metadata={"cache_format": "fp8_e4m3"})
    write("case", "item10_cache_format_fp8_e4m3", case_file(t, m))
    # 11. one block repeated 16,384 times: seq_len 262,144 over a one-block cache.
    for topk in (262144, 2048):
        tensors = [
            ("q", "BF16", [1, 16, 192], struct.pack("<H", 0x3F80) * (16 * 192)),
            ("kv_c", "BF16", [1, 512], struct.pack("<H", 0x3F80) * 512),
            ("k_pe", "BF16", [1, 64], struct.pack("<H", 0x3F80) * 64),
            ("kv_cache", "U8", [1, 16, 1152], bytes(16 * 1152)),
            ("block_table", "I32", [1, 16384], i32([0] * 16384)),
            ("seq_lens", "I32", [1], i32([262144])),
            ("query_start_loc", "I32", [2], i32([0, 1])),
            ("slot_mapping", "I64", [1], i64([15])),
        ]
        write("case", "item11_repeated_block_topk%d" % topk, case_file(tensors, {"topk": str(topk)}))
        write("planner", "item11_repeated_block_topk%d" % topk,
              planner_input(0, 0, 1, 1, topk, 16, 16384, 1, 1, [0, 1], [262144], [0] * 16384, [15]))
    # A valid mixed batch (decode, sparse prefill, dense prefill, one padding row) with its top-k rows: a seed.
    seq, ql, block, M, topk = [6, 9, 4], [1, 2, 4], 4, 3, 8
    bt = [0, 1, 0, 2, 3, 4, 5, 0, 0]
    qsl, slots, rows = [0, 1, 3, 7], [], []
    for r in range(3):
        ctx = seq[r] - ql[r]
        for i in range(ql[r]):
            p = ctx + i
            slots.append(bt[r * M + p // block] * block + p % block)
            row = list(range(min(p + 1, topk)))
            rows += row + [-1] * (topk - len(row))
    slots.append(-1)
    rows += [-1] * topk
    write("planner", "valid_mixed_batch", planner_input(0, 0, 0, 1, topk, block, M, 8, 6, qsl, seq, bt, slots, rows))
    write("planner", "overflowing_cache_extent",
          planner_input(7, 2, 2, 0, -1, 1 << 30, 1 << 30, 1 << 30, 1 << 62, [0], [], [], []))


if __name__ == "__main__":
    main()
