"""Case files from Python: dsmla.run_case gives exactly the bytes `dsmla run`
writes; dsmla.load_case gives exactly the file's tensors; Attention.run on
NumPy arrays gives what the case runner gives; errors carry the CLI's message."""
import numpy as np
import pytest
import safetensors_np

import dsmla

# name -> `dsmla make-case` options: every path (decode, dense, sparse chunk,
# padding), every cache format, shuffled paged caches.
CASES = {
    "mixed_bf16": ["--seq-lens", "200,37,90,64", "--query-lens", "1,37,16,64", "--topk", "64"],
    "mixed_fp8_ds_mla": ["--seq-lens", "150,20,70", "--query-lens", "1,20,70", "--topk", "64",
                         "--cache-format", "fp8_ds_mla", "--block-size", "16", "--padding-tokens", "3"],
    "fp8_random_topk": ["--seq-lens", "96,33", "--query-lens", "2,33", "--topk", "32", "--heads", "32",
                        "--cache-format", "fp8", "--k-scale", "0.5", "--topk-fill", "random_subset", "--seed", "7"],
    # the lightning indexer picks the top-k: a decode and a prefill past topk, a short prompt routed dense
    "indexer_bf16": ["--seq-lens", "300,40,200", "--query-lens", "1,40,120", "--topk", "64", "--indexer",
                     "--index-heads", "32"],
}
INDEX_OUTPUTS = {"topk_indices", "index_cache"}


def cli_run(cli, case, out, *extra):
    cli("run", case, "-o", out, "--backend", "cpu", *extra)
    tensors, meta = safetensors_np.read(out)
    return tensors, meta


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("policy", [None, "force_sparse"])
def test_run_case_matches_cli_bytes(cli, make_case, tmp_path, name, policy):
    case = make_case(name, *CASES[name])
    tensors, meta = cli_run(cli, case, tmp_path / "out.safetensors", *(["--policy", policy] if policy else []))
    got = dsmla.run_case(str(case), backend="cpu", policy=policy)
    indexer = name.startswith("indexer")
    assert set(got) == {"out", "lse", "kv_cache"} | (INDEX_OUTPUTS if indexer else set())
    for key in INDEX_OUTPUTS if indexer else ():
        assert got[key].tobytes() == tensors[key][1].tobytes(), key
    assert got["out"].dtype == np.float32 and got["lse"].dtype == np.float32 and got["kv_cache"].dtype == np.uint8
    # bf16 -> float32 is exact, so the float32 out is compared bit for bit with the CLI's bf16.
    assert tensors["out"][0] == "BF16"
    want_out = dsmla.bf16_bits_to_float32(tensors["out"][1])
    assert got["out"].shape == want_out.shape
    assert got["out"].tobytes() == want_out.tobytes()
    assert got["lse"].tobytes() == tensors["lse"][1].tobytes()
    assert got["kv_cache"].tobytes() == tensors["kv_cache"][1].tobytes()
    # the run wrote something: every row has a finite lse or is a padding row (-inf)
    assert not np.isnan(got["out"]).any()


def test_load_case_matches_file(make_case):
    case = make_case("mixed_fp8_ds_mla", *CASES["mixed_fp8_ds_mla"])
    tensors, meta = safetensors_np.read(case)
    c = dsmla.load_case(str(case))
    for name, (dtype, a) in tensors.items():
        assert c[name].shape == a.shape, name
        assert c[name].tobytes() == a.tobytes(), name
    assert c["cache_format"] == "fp8_ds_mla" and c["block_size"] == 16 and c["topk"] == 64
    assert c["num_tokens"] == 1 + 20 + 70 + 3 and c["num_requests"] == 3
    assert c["num_cache_blocks"] == c["kv_cache"].shape[0]


@pytest.mark.parametrize("name", sorted(CASES))
def test_attention_run_on_numpy_matches_run_case(make_case, name):
    case = str(make_case(name, *CASES[name]))
    c = dsmla.load_case(case)
    att = dsmla.Attention(c["num_heads"], cache_format=c["cache_format"], topk=c["topk"], backend="cpu",
                          policy=c["policy"], decode_threshold=c["decode_threshold"], indexer=c["indexer"],
                          **({k: c[k] for k in ("index_num_heads", "index_head_dim")} if c["indexer"] else {}))
    plan = att.plan(c["query_start_loc"], c["seq_lens"], c["block_table"], c["slot_mapping"],
                    c["num_cache_blocks"], c["block_size"])
    assert plan.num_tokens == c["num_tokens"]
    T, H = c["num_tokens"], c["num_heads"]
    out = np.full((T, H * 128), 0x7FC0, dtype=np.uint16)  # NaN: a row left unwritten cannot pass
    lse = np.full((T, H), np.nan, dtype=np.float32)
    cache = c["kv_cache"].copy()
    index = {}
    if c["indexer"]:
        index = dict(index_q=c["index_q"], index_weights=c["index_weights"], index_k=c["index_k"],
                     index_cache=c["index_cache"].copy(), topk_indices_out=np.full((T, c["topk"]), 7, np.int32))
    att.run(c["q"], c["kv_c"], c["k_pe"], c["w_kv_b"], cache, c["block_table"], c["seq_lens"],
            c["query_start_loc"], c["slot_mapping"], c["topk_indices"], out, lse, c["softmax_scale"],
            k_scale=c["k_scale"], **index)
    want = dsmla.run_case(case, backend="cpu")
    for key in INDEX_OUTPUTS if c["indexer"] else ():
        assert index[key if key == "index_cache" else "topk_indices_out"].tobytes() == want[key].tobytes(), key
    assert dsmla.bf16_bits_to_float32(out).tobytes() == want["out"].tobytes()
    assert lse.tobytes() == want["lse"].tobytes()
    assert cache.tobytes() == want["kv_cache"].tobytes()
    assert not np.array_equal(cache, c["kv_cache"])  # the new tokens were written


def cli_error(cli, case, tmp_path, *extra):
    r = cli("run", case, "-o", tmp_path / "o.safetensors", "--backend", "cpu", *extra, check=False)
    assert r.returncode == 2, r.stderr
    prefix = "dsmla run: error: "
    line = [ln for ln in r.stderr.splitlines() if ln.startswith(prefix)]
    assert line, r.stderr
    return line[0][len(prefix):]


@pytest.mark.parametrize("tensor,index,value", [
    ("topk_indices", 5, 100000),          # a top-k index beyond the sequence
    ("slot_mapping", 0, 10 ** 9),         # a slot outside the cache
    ("seq_lens", 1, 2),                   # query_len > seq_len
    ("block_table", 0, -3),               # a block outside the cache
])
def test_bad_case_raises_cli_message(cli, make_case, tmp_path, tensor, index, value):
    src = make_case("mixed_bf16", *CASES["mixed_bf16"])
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(src.read_bytes())
    safetensors_np.patch(bad, tensor, index, value)
    message = cli_error(cli, bad, tmp_path)
    with pytest.raises(ValueError) as e:
        dsmla.run_case(str(bad))
    assert isinstance(e.value, dsmla.Error)
    assert str(e.value) == message


def test_unreadable_case_raises_cli_message(cli, tmp_path):
    bad = tmp_path / "truncated.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":")
    message = cli_error(cli, bad, tmp_path)
    with pytest.raises(dsmla.Error) as e:
        dsmla.load_case(str(bad))
    assert str(e.value) == message
    with pytest.raises(dsmla.Error) as e:
        dsmla.run_case(str(tmp_path / "missing.safetensors"))
    assert "missing.safetensors" in str(e.value)


def test_bad_policy_and_backend(make_case):
    case = str(make_case("mixed_bf16", *CASES["mixed_bf16"]))
    with pytest.raises(ValueError, match="sparsest"):
        dsmla.run_case(case, policy="sparsest")
    with pytest.raises(ValueError, match="backend 'tpu'"):
        dsmla.run_case(case, backend="tpu")


def test_make_case_writes_what_the_cli_writes(cli, make_case, tmp_path):
    ours = tmp_path / "ours.safetensors"
    dsmla.make_case(str(ours), [96, 33], [2, 33], num_heads=32, cache_format="fp8", block_size=64, topk=32,
                    k_scale=0.5, topk_fill="random_subset", seed=7)
    theirs = make_case("fp8_random_topk", *CASES["fp8_random_topk"])
    assert ours.read_bytes() == theirs.read_bytes()
    with pytest.raises(ValueError, match="query_len 5 > seq_len 4"):
        dsmla.make_case(str(tmp_path / "bad.safetensors"), [4], [5])


def test_indexer_argument_errors(make_case):
    c = dsmla.load_case(str(make_case("indexer_bf16", *CASES["indexer_bf16"])))
    att = dsmla.Attention(c["num_heads"], topk=c["topk"], backend="cpu", indexer=True, index_num_heads=32)
    att.plan(c["query_start_loc"], c["seq_lens"], c["block_table"], c["slot_mapping"], c["num_cache_blocks"],
             c["block_size"])
    T, H = c["num_tokens"], c["num_heads"]
    args = [c["q"], c["kv_c"], c["k_pe"], c["w_kv_b"], c["kv_cache"].copy(), c["block_table"], c["seq_lens"],
            c["query_start_loc"], c["slot_mapping"], None, np.zeros((T, H * 128), np.uint16),
            np.zeros((T, H), np.float32), c["softmax_scale"]]
    index = dict(index_q=c["index_q"], index_weights=c["index_weights"], index_k=c["index_k"],
                 index_cache=c["index_cache"].copy())
    with pytest.raises(ValueError, match="index_q: required when indexer=True"):
        att.run(*args, **{k: v for k, v in index.items() if k != "index_q"})
    with pytest.raises(ValueError, match="topk_indices: must be None"):
        att.run(*args[:9], np.zeros((T, c["topk"]), np.int32), *args[10:], **index)
    with pytest.raises(ValueError, match="index_weights"):
        att.run(*args, **dict(index, index_weights=c["index_weights"][:, :16].copy()))
    att.run(*args, **index)  # and the right arguments run
