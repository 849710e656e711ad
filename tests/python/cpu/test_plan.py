"""Attention.plan from Python: Plan.to_dict() equals `dsmla plan`'s JSON for
the same batch; plans are reused for an identical batch; bad batches raise
dsmla.Error with the planner's message."""
import json

import numpy as np
import pytest

import dsmla


def trivial_batch(seq_lens, query_lens, block_size):
    """The batch `dsmla plan` builds (make_batch): request r owns the next
    ceil(seq_len / B) blocks in order; new tokens go to their positions' slots."""
    need = [-(-s // block_size) for s in seq_lens]
    cols = max(max(need, default=0), 1)
    table = np.zeros((len(seq_lens), cols), dtype=np.int32)
    slots, qsl, nxt = [], [0], 0
    for r, (s, q) in enumerate(zip(seq_lens, query_lens)):
        table[r, :need[r]] = np.arange(nxt, nxt + need[r])
        nxt += need[r]
        slots += [int(table[r, p // block_size]) * block_size + p % block_size for p in range(s - q, s)]
        qsl.append(qsl[-1] + q)
    return qsl, list(seq_lens), table, slots, max(nxt, 1)


BATCHES = [
    # seq_lens, query_lens, options
    ([32, 40, 1024, 2016], [1, 8, 1024, 16], {}),
    ([300, 5000, 3000, 70], [1, 1, 200, 70], {"topk": 256, "heads": 64, "block_size": 16}),
    ([100, 100, 2000], [100, 50, 2000], {"policy": "per_batch", "cache_format": "fp8_ds_mla"}),
    ([100, 100], [100, 3], {"policy": "force_sparse", "decode_threshold": 4, "dense_cost_factor": 2.5}),
    ([0, 17], [0, 17], {"cache_format": "fp8", "heads": 16}),
    ([600, 500, 64], [600, 490, 64], {"policy": "split_at_topk", "topk": 256, "heads": 16}),  # both long prompts cut at topk
]


@pytest.mark.parametrize("seq_lens,query_lens,opt", BATCHES)
def test_plan_dict_matches_cli(cli, seq_lens, query_lens, opt):
    block_size = opt.get("block_size", 64)
    args = ["plan", "--seq-lens", ",".join(map(str, seq_lens)), "--query-lens", ",".join(map(str, query_lens)),
            "--block-size", block_size]
    for k in ("topk", "heads", "policy", "cache_format", "decode_threshold", "dense_cost_factor"):
        if k in opt:
            args += ["--" + k.replace("_", "-"), opt[k]]
    want = json.loads(cli(*args).stdout)
    att = dsmla.Attention(opt.get("heads", 128), cache_format=opt.get("cache_format", "bf16"),
                          topk=opt.get("topk", 2048), backend="cpu", policy=opt.get("policy", "per_request"),
                          decode_threshold=opt.get("decode_threshold", 1),
                          dense_cost_factor=opt.get("dense_cost_factor"))
    qsl, sl, table, slots, blocks = trivial_batch(seq_lens, query_lens, block_size)
    plan = att.plan(qsl, sl, table, slots, blocks, block_size)
    assert plan.to_dict() == want
    # Plan.workspace_bytes is the CUDA backend's layout (in the JSON too); the
    # cpu backend's run() needs what Attention.workspace_bytes says.
    assert plan.workspace_bytes == plan.to_dict()["workspace"]["bytes"]


def test_split_at_topk_cuts_the_prompts_that_cross_topk(cli):
    """Two prompts crossing topk 256 are cut there; the short one goes dense whole."""
    seq_lens, query_lens = [600, 500, 64], [600, 490, 64]
    att = dsmla.Attention(16, topk=256, backend="cpu", policy="split_at_topk")
    qsl, sl, table, slots, blocks = trivial_batch(seq_lens, query_lens, 64)
    d = att.plan(qsl, sl, table, slots, blocks, 64).to_dict()
    assert [r["path"] for r in d["routes"]] == ["dense+sparse", "dense+sparse", "dense"]
    assert [r["dense_q_len"] for r in d["routes"]] == [256, 246, 64]
    assert d["counts"]["split_requests"] == 2 and d["counts"]["dense_requests"] == 1
    assert d["counts"]["dense_tokens"] == 256 + 246 + 64


def test_plan_is_reused_for_an_identical_batch():
    att = dsmla.Attention(16, topk=64, backend="cpu")
    batch = trivial_batch([70, 10], [1, 10], 64)
    first = att.plan(*batch, 64)
    again = att.plan(*batch, 64)
    assert again.id == first.id
    other = att.plan(*trivial_batch([71, 10], [1, 10], 64), 64)
    assert other.id != first.id
    assert first.to_dict()["num_tokens"] == 11  # a plan object is a copy: later plans leave it alone


def test_numpy_inputs_of_any_int_dtype_are_accepted():
    att = dsmla.Attention(16, topk=64, backend="cpu")
    qsl, sl, table, slots, blocks = trivial_batch([70, 10], [1, 10], 64)
    plan = att.plan(np.array(qsl, np.int64), np.array(sl, np.int16), table.astype(np.int64),
                    np.array(slots, np.int32), blocks, 64)
    assert plan.num_tokens == 11 and plan.num_requests == 2 and plan.num_sparse_tokens == 1


@pytest.mark.parametrize("change,message", [
    (lambda b: b[1].__setitem__(0, 0), "request 0: query_len 1 > seq_len 0"),
    (lambda b: b[3].__setitem__(0, 10 ** 6), "token 0: slot_mapping[0] = 1000000 outside [-1, num_cache_slots 192)"),
    (lambda b: b[2].__setitem__((1, 0), 9), "request 1: block_table[1][0] = 9 outside [0, num_cache_blocks 3)"),
])
def test_bad_batch_raises_planner_message(change, message):
    att = dsmla.Attention(16, topk=64, backend="cpu")
    qsl, sl, table, slots, blocks = trivial_batch([70, 10], [1, 10], 64)
    batch = [qsl, sl, table, slots]
    change(batch)
    with pytest.raises(ValueError) as e:
        att.plan(*batch, blocks, 64)
    assert str(e.value) == message


def test_bad_options_raise():
    with pytest.raises(ValueError, match="num_heads"):
        dsmla.Attention(17, backend="cpu").plan([0, 1], [1], [[0]], [0], 1, 64)
    with pytest.raises(ValueError, match="auto"):
        dsmla.Attention(16, cache_format="auto")
    with pytest.raises(ValueError, match="sparsest"):
        dsmla.Attention(16, policy="sparsest")
    with pytest.raises(ValueError, match="backend 'gpu'"):
        dsmla.Attention(16, backend="gpu")
    if not dsmla.cuda_available():
        with pytest.raises(ValueError):
            dsmla.Attention(16, backend="cuda")


def test_cost_factors_file_routes_like_its_factor(tmp_path):
    """A `dsmla bench --calibrate` file: the factor of the nearest head count
    decides the routing; a bad file raises with the loader's message."""
    path = tmp_path / "factors.json"
    path.write_text(json.dumps({"format": "dsmla-cost-factors", "version": 1, "device": "test",
                                "factors": [{"num_heads": 16, "dense_cost_factor": 1.0},
                                            {"num_heads": 128, "dense_cost_factor": 20.0}]}))
    assert dsmla.cost_factor_for(str(path), 112) == 20.0
    assert dsmla.cost_factor_for(str(path), 32) == 1.0
    batch = trivial_batch([1024], [1024], 64)

    def path_of(att):
        return att.plan(*batch[:4], batch[4], 64).to_dict()["routes"][0]["path"]

    assert path_of(dsmla.Attention(128, backend="cpu")) == "dense"
    assert path_of(dsmla.Attention(128, backend="cpu", cost_factors=path)) == "sparse"
    assert path_of(dsmla.Attention(16, backend="cpu", cost_factors=path)) == "dense"
    with pytest.raises(ValueError, match="exclude each other"):
        dsmla.Attention(128, backend="cpu", dense_cost_factor=2.0, cost_factors=path)
    with pytest.raises(ValueError, match="missing.json': cannot be opened"):
        dsmla.Attention(128, backend="cpu", cost_factors=tmp_path / "missing.json")
