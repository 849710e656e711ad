#!/usr/bin/env python3
"""dsmla's kernels and the anchors timed in one process, sample by sample, on the same tensors.

  python3 bench/paired.py [--shim build-gpu/libdsmla_kernel_shim.so[=LABEL[,NAME=VALUE...]]]...
                          [--anchors .anchors/anchors_bench.py]
                          [--only prefill,decode,dense] [--quick] [--batches 1,16] [--sizes 1024,4096] [--rounds 30] [--warmup 5] [--json F] [--md F]

Why: the SM clock of the GPU machine moves between levels up to ~20 % apart within one device call
(src/cuda/dense_mha/NOTES.md), in steps of 0.1-0.5 s. The kernel harnesses and anchors_bench.py run one after the
other, each row's 30 samples back to back, so a ratio of two medians can compare two clock levels. Here every round
times each contender once (dsmla through the C ABI of tools/bench/kernels/kernel_shim.cpp, the anchors through their
Python packages), in an order that changes every round (round_orders), and each round gives its own ratio; the table reports
the median of those ratios with their 10th-90th percentile spread. Several --shim libraries (built from different
trees) make a clock-robust A/B of dsmla variants as well: every variant after the first also gets its ratio to the
first, round by round; NAME=VALUE settings after a label (DSMLA_* switches such as DSMLA_SPARSE_KEY_ROWS=2) are in
force around that shim's calls, so one build can also be compared with itself under another switch.

Workloads are anchors_bench.py's own: its prefill / decode / dense functions are called with their timer replaced,
and the call they would have timed, with its tensors, is what both sides get (nothing is rebuilt here). dsmla's
sparse kernel reads the anchors' tensors as they are (FlashMLA's bf16 latent [T, 1, 576] and fp8 cache [blocks, 64,
1, 656] are dsmla's bf16 and fp8_ds_mla formats; the index rows hold the valid entries first, -1 after them). The
16- and 32-head rows run dsmla on the first 16 / 32 heads of the 64-head workload, against FlashMLA at 64 heads
(the padded alternative; issues 7 and 8). dsmla's dense kernel shares k_pe between heads (MLA), so it gets the
anchors' q, k_nope and v with a standard normal latent; the output check runs FlashAttention-3 once more with that
k_pe in every head. Each workload first compares dsmla's output with the anchor's (relative L2 error), then times.
A sample is one call between two CUDA events with a synchronisation after it, as anchors_bench.py times, except
that a ~200 us spin kernel is queued before the start event: the GPU is still busy while the host enqueues the call,
so the events time its GPU work, not its host launch path (FlashMLA's Python wrapper, dsmla's ctypes call), which
would otherwise weigh on the microsecond decode rows; --host-inclusive times from an idle GPU as anchors_bench.py.
"""
import argparse, contextlib, ctypes, inspect, json, os, shutil, statistics, subprocess, sys, tempfile, time

TOKENS, TOPK = 16384, 2048  # checked against anchors_bench.py's at load
SMALL_HEADS = (16, 32)
# Issue bars: the largest dsmla / anchor ratio each kind of row may show.
BARS = {"prefill": 1.0, "prefill_small": 0.75, "decode": 1.0, "decode_small": 0.4, "dense": 0.95}
ANCHORS = ("FlashMLA", "FA3", "cuDNN")  # contender names of the anchors
CHECK_TOLERANCE = 2e-2  # relative L2 error of dsmla's output against the anchor's (bf16 outputs)


# ---------------------------------------------------------------- statistics (no torch)

def percentile(values, q):
    """The q-quantile (0..1) of values, linear between order statistics."""
    s = sorted(values)
    if not s:
        raise ValueError("percentile of no values")
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def round_orders(names, rounds):
    """The contenders' order in each round: rotated by one place a round, and reversed in every other cycle of
    len(names) rounds, so that over 2 x len(names) rounds every contender runs in every position, with its neighbours
    before and after it. A position effect then spreads over all contenders instead of favouring one. (With the
    order only reversed every other round, a contender always at the ends read up to 4 % faster than one always in
    the middle running the same code, its place the likely cause: src/cuda/sparse_mla/NOTES.md, "Session 39".)"""
    n = len(names)
    orders = []
    for r in range(rounds):
        k = r % n
        order = list(names[k:]) + list(names[:k])
        if (r // n) % 2 == 1:
            order.reverse()
        orders.append(order)
    return orders


def summarize(samples, pairs):
    """samples: {name: [time per round]}; pairs: [(label, numerator, [denominators])], a denominator list meaning
    the fastest of those contenders in the same round. Returns {name: median} and, per pair, the median per-round
    ratio with its 10th and 90th percentiles."""
    counts = {len(v) for v in samples.values()}
    if len(counts) != 1:
        raise ValueError(f"contenders have different sample counts: {sorted(counts)}")
    n = counts.pop()
    medians = {k: statistics.median(v) for k, v in samples.items()}
    ratios = {}
    for label, num, dens in pairs:
        per_round = [samples[num][i] / min(samples[d][i] for d in dens) for i in range(n)]
        ratios[label] = dict(median=statistics.median(per_round), p10=percentile(per_round, 0.1),
                             p90=percentile(per_round, 0.9), of_medians=medians[num] / min(medians[d] for d in dens))
    return medians, ratios


# ---------------------------------------------------------------- the shim (dsmla's launchers through ctypes)

@contextlib.contextmanager
def environment(settings):
    """os.environ with `settings` (NAME: VALUE) for the duration, restored after."""
    saved = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def parse_shim(text, index):
    """PATH[=LABEL[,NAME=VALUE...]] -> (path, label, {NAME: VALUE}): the environment settings (DSMLA_*
    switches) are in force around every call of that shim, its first included."""
    path, _, rest = text.partition("=")
    label, *settings = rest.split(",") if rest else [""]
    if "=" in label:
        raise ValueError(f"--shim {text}: settings come after a label (PATH=LABEL,NAME=VALUE)")
    if label in ANCHORS:
        raise ValueError(f"--shim {text}: '{label}' names an anchor")
    env = {}
    for item in settings:
        name, eq, value = item.partition("=")
        if not eq or not name:
            raise ValueError(f"--shim {text}: '{item}' is not NAME=VALUE")
        env[name] = value
    return path, label or ("dsmla" if index == 0 else f"dsmla{index}"), env


class Shim:
    """build/libdsmla_kernel_shim.so of one tree: launch_sparse_mla and launch_dense_mha on raw device pointers.
    `env`: environment settings in force around each of its calls. The library reads some DSMLA_* switches once
    per process (at its first launch), so a path already loaded by another Shim is loaded from a copy: each
    Shim has its own library state."""

    loaded = set()

    def __init__(self, path, label, env=None):
        self.path, self.label, self.env = path, label, dict(env or {})
        self.open_batches = []  # dense batch handles, freed by close_batches()
        real = os.path.realpath(path)
        if real in Shim.loaded:
            # Next to the original (a /tmp mounted noexec could not be loaded from); removed once loaded.
            with tempfile.NamedTemporaryFile(suffix=".so", dir=os.path.dirname(real)) as copy:
                shutil.copyfile(real, copy.name)
                self.lib = ctypes.CDLL(copy.name)
        else:
            Shim.loaded.add(real)
            self.lib = ctypes.CDLL(real)  # RTLD_LOCAL: two trees' shims do not see each other
        c = ctypes
        self.lib.dsmla_shim_sparse_mla_workspace_bytes.argtypes = [c.c_int, c.c_int, c.c_int, c.POINTER(c.c_uint64)]
        self.lib.dsmla_shim_sparse_mla.argtypes = [c.c_void_p, c.c_void_p, c.c_int64, c.c_int, c.c_float, c.c_void_p,
                                                   c.c_void_p, c.c_int, c.c_int, c.c_int, c.c_float, c.c_void_p,
                                                   c.c_void_p, c.c_void_p, c.c_void_p]
        self.lib.dsmla_shim_dense_mha_create.argtypes = [c.c_void_p, c.c_void_p, c.c_int, c.c_int, c.c_float,
                                                         c.c_void_p, c.c_void_p, c.c_void_p, c.c_void_p, c.c_void_p,
                                                         c.POINTER(c.c_void_p)]
        self.lib.dsmla_shim_dense_mha.argtypes = [c.c_void_p, c.c_void_p]
        self.lib.dsmla_shim_dense_mha_destroy.argtypes = [c.c_void_p]
        self.lib.dsmla_shim_dense_mha_destroy.restype = None
        for f in ("dsmla_shim_sparse_mla_workspace_bytes", "dsmla_shim_sparse_mla", "dsmla_shim_dense_mha_create",
                  "dsmla_shim_dense_mha"):
            getattr(self.lib, f).restype = c.c_char_p

    @staticmethod
    def _check(message):
        if message is not None:
            raise RuntimeError(message.decode())

    def sparse(self, torch, q, kv_cache, fmt, slots, valid, topk, scale):
        """A callable launching dsmla's sparse kernel on these tensors, and its output o_lat."""
        tokens, heads = q.shape[0], q.shape[1]
        size = ctypes.c_uint64()
        with environment(self.env):  # the split choice (DSMLA_SPARSE_SPLIT) sizes the workspace
            self._check(self.lib.dsmla_shim_sparse_mla_workspace_bytes(tokens, heads, topk, ctypes.byref(size)))
        ws = torch.empty(max(int(size.value), 1), dtype=torch.uint8, device=q.device)
        o = torch.empty(tokens, heads, 512, dtype=torch.bfloat16, device=q.device)
        lse = torch.empty(tokens, heads, dtype=torch.float32, device=q.device)
        row_bytes = {0: 1152, 1: 656, 2: 576}[fmt]
        num_slots = kv_cache.numel() * kv_cache.element_size() // row_bytes
        for t, name in ((q, "q"), (kv_cache, "kv_cache"), (slots, "slots"), (valid, "valid")):
            if not t.is_contiguous():
                raise ValueError(f"{name} must be contiguous")
        args = (q.data_ptr(), kv_cache.data_ptr(), num_slots, fmt, 1.0, slots.data_ptr(), valid.data_ptr(), tokens,
                heads, topk, scale, o.data_ptr(), lse.data_ptr(), ws.data_ptr())

        def run():
            self._check(self.lib.dsmla_shim_sparse_mla(*args, torch.cuda.current_stream().cuda_stream))
        # Every tensor the kernel reads or writes lives as long as the callable: a freed one could be handed to an
        # anchor's output while the rounds run, and the kernel would then read that (a valid count of 0 skips work).
        run.keep, run.env = (q, kv_cache, slots, valid, ws, o, lse), self.env
        return run, o

    def dense(self, torch, q, kv_up, latent, q_lens, scale):
        """A callable launching dsmla's dense kernel (requests of q_lens new tokens, no prefix), and its output."""
        rows, heads = q.shape[0], q.shape[1]
        out = torch.empty(rows, heads * 128, dtype=torch.bfloat16, device=q.device)
        lse = torch.empty(rows, heads, dtype=torch.float32, device=q.device)
        ql = (ctypes.c_int32 * len(q_lens))(*q_lens)
        ctx = (ctypes.c_int32 * len(q_lens))()
        handle = ctypes.c_void_p()
        with environment(self.env):
            self._check(self.lib.dsmla_shim_dense_mha_create(ql, ctx, len(q_lens), heads, scale, q.data_ptr(),
                                                             kv_up.data_ptr(), latent.data_ptr(), out.data_ptr(),
                                                             lse.data_ptr(), ctypes.byref(handle)))

        def run():
            self._check(self.lib.dsmla_shim_dense_mha(handle, torch.cuda.current_stream().cuda_stream))
        run.keep, run.env = (q, kv_up, latent, out, lse, handle), self.env  # alive with the callable (as sparse())
        self.open_batches.append(handle)
        return run, out

    def close_batches(self):
        """Frees the dense batches made since the last call (after a workload, timed or failed)."""
        for handle in self.open_batches:
            self.lib.dsmla_shim_dense_mha_destroy(handle)
        self.open_batches = []


# ---------------------------------------------------------------- the anchors' workloads

def captured_call(ab, function, *args):
    """Runs anchors_bench.<function>(*args) with its timer replaced; returns the call it would have timed."""
    seen, timer = [], ab.timeit
    ab.timeit = lambda fn, *a, **k: seen.append(fn) or 1.0
    try:
        getattr(ab, function)(*args)
    finally:
        ab.timeit = timer
    if len(seen) != 1:
        raise RuntimeError(f"anchors_bench.{function} timed {len(seen)} calls, expected one")
    return seen[0]


def tensors_of(call, *names):
    """The named tensors the captured call closes over (anchors_bench.py's local names)."""
    cells = inspect.getclosurevars(call).nonlocals
    missing = [n for n in names if n not in cells]
    if missing:
        raise RuntimeError(f"anchors_bench.py changed: the timed call has no {missing} (has {sorted(cells)})")
    return [cells[n] for n in names]


def first_output(result):
    return result[0] if isinstance(result, (tuple, list)) else result


def relative_error(torch, ours, theirs):
    a, b = ours.float().reshape(-1), theirs.float().reshape(-1)
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b).clamp_min(1e-30))


def sparse_rows(torch, shims, anchor, reference, q, head_counts, kind, kv, fmt, slots, valid):
    """dsmla's sparse kernel of every shim on the first h heads of q [tokens, H, 576] for each h of head_counts,
    against FlashMLA's call `anchor` at all H heads: contenders, (name, bar, anchor) pairs, and each output's error
    against reference[:, :h]. Rows with fewer heads than H get the small-head bar (kind + "_small")."""
    heads = q.shape[1]
    contenders, pairs, checks = {"FlashMLA": anchor}, [], {}
    for shim in shims:
        for h in head_counts:
            name = shim.label + ("" if h == heads else f" H{h}")
            run, out = shim.sparse(torch, q[:, :h].contiguous(), kv, fmt, slots, valid, TOPK, 576 ** -0.5)
            with environment(shim.env):
                run()
            checks[name] = relative_error(torch, out, reference[:, :h])
            contenders[name] = run
            pairs.append((name, kind if h == heads else kind + "_small", "FlashMLA"))
    return contenders, pairs, checks


def prefill_workload(torch, ab, shims, S, H):
    call = captured_call(ab, "flashmla_prefill", S, H)
    q, kv, idx, length = tensors_of(call, "q", "kv", "idx", "length")
    return sparse_rows(torch, shims, call, first_output(call()), q, (H,) + (SMALL_HEADS if H == 64 else ()),
                       "prefill", kv, 0, idx, length)


def decode_workload(torch, ab, shims, B, H):
    call = captured_call(ab, "flashmla_decode", B, H)
    q, cache, slots = tensors_of(call, "q", "cache", "slots")
    valid = torch.full((B,), TOPK, dtype=torch.int32, device=q.device)
    return sparse_rows(torch, shims, call, first_output(call()).reshape(B, H, 512), q.reshape(B, H, 576),
                       (H,) + (SMALL_HEADS if H == 64 and B >= 16 else ()), "decode", cache, 1, slots.contiguous(),
                       valid)


def dense_workload(torch, ab, shims, S, H):
    fa3 = captured_call(ab, "fa3_dense", S, H)
    cudnn = captured_call(ab, "cudnn_dense", S, H)
    q, k, v, cu = tensors_of(fa3, "q", "k", "v", "cu")
    latent = torch.randn(q.shape[0], 576, device=q.device, dtype=torch.bfloat16)
    kv_up = torch.cat([k[..., :128], v], dim=-1).contiguous()
    # FlashAttention-3 once more, with dsmla's shared k_pe in every head: the output dsmla must match.
    k_shared = k.clone()
    k_shared[..., 128:] = latent[:, None, 512:]
    from flash_attn_interface import flash_attn_varlen_func
    reference = first_output(flash_attn_varlen_func(q, k_shared, v, cu, cu, S, S, causal=True))
    del k_shared
    contenders, pairs, checks = {"FA3": fa3, "cuDNN": cudnn}, [], {}
    for shim in shims:
        run, out = shim.dense(torch, q, kv_up, latent, [S] * (q.shape[0] // S), 192 ** -0.5)
        with environment(shim.env):
            run()
        checks[shim.label] = relative_error(torch, out, reference.reshape(q.shape[0], H * 128))
        contenders[shim.label] = run
        pairs.append((shim.label, "dense", ("FA3", "cuDNN")))
    return contenders, pairs, checks


# ---------------------------------------------------------------- timing

def time_rounds(torch, contenders, rounds, warmup, clock, cover=None):
    """{name: [ms per round]}, every contender once per round (round_orders), plus the SM clock per round.
    cover(), when given, queues GPU work before each sample's start event, so that the GPU is still busy while the
    host enqueues the call: the events then time the call's GPU work alone, not its host launch path."""
    for fn in contenders.values():
        with environment(getattr(fn, "env", {})):
            for _ in range(warmup):
                fn()
            torch.cuda.synchronize()
    samples = {name: [] for name in contenders}
    clocks = []
    for order in round_orders(list(contenders), rounds):
        clocks.append(clock())
        for name in order:
            fn = contenders[name]
            with environment(getattr(fn, "env", {})):  # set before the first event, restored after the last
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                if cover is not None:
                    cover()
                s.record()
                fn()
                e.record()
                torch.cuda.synchronize()
            samples[name].append(s.elapsed_time(e))
    return samples, clocks


def sm_clock_reader():
    """A function returning the SM clock in MHz (None when pynvml is missing): read only, nothing is set."""
    try:
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(int(os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]))
        return lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
    except Exception:
        return lambda: None


def variant_pairs(pairs, shims):
    """For every variant after the first, its per-round ratio to the first variant on the same row."""
    if len(shims) < 2:
        return []
    first, out = shims[0].label, []
    for name, kind, _ in pairs:
        for shim in shims[1:]:
            if name == shim.label or name.startswith(shim.label + " "):
                out.append((f"{name} / {first + name[len(shim.label):]}", name, [first + name[len(shim.label):]]))
    return out


def measure(torch, ab, shims, kind, build, shape, rounds, warmup, clock, cover=None):
    """One workload: build it, check dsmla's outputs, time every contender round by round; its table row."""
    label = f"{kind} " + " ".join(f"{k}{v}" for k, v in shape.items())
    contenders = {}
    try:
        from torch.nn.attention import sdpa_kernel, SDPBackend
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):  # the cuDNN anchor's setting, as anchors_bench.py sets it
            contenders, pairs, checks = build(torch, ab, shims, **shape)
            samples, clocks = time_rounds(torch, contenders, rounds, warmup, clock, cover)
        ratio_pairs = [(name, name, [d] if isinstance(d, str) else list(d)) for name, _, d in pairs]
        medians, ratios = summarize(samples, ratio_pairs + variant_pairs(pairs, shims))
        print(f"{label}: " + ", ".join(f"{k} {v:.4f} ms" for k, v in medians.items()) + " | " +
              ", ".join(f"{k} {r['median']:.3f}x" for k, r in ratios.items()), flush=True)
        return dict(workload=label, kind=kind, **shape, medians_ms=medians, ratios=ratios, checks=checks,
                    bars={name: BARS[bar] for name, bar, _ in pairs}, sm_clock_mhz=clocks, samples_ms=samples)
    except Exception as e:  # one failing workload must not hide the others
        print(f"{label}: FAILED {e!r}", flush=True)
        return dict(workload=label, kind=kind, **shape, error=repr(e)[:400])
    finally:
        for shim in shims:
            shim.close_batches()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shim", action="append", default=[],
                    help="PATH[=LABEL[,NAME=VALUE...]] of a libdsmla_kernel_shim.so, with environment settings")
    ap.add_argument("--anchors", default=".anchors/anchors_bench.py")
    ap.add_argument("--only", default="prefill,decode,dense")
    ap.add_argument("--quick", action="store_true", help="S 1024 and batch 64 only")
    ap.add_argument("--batches", help="decode batch sizes, comma separated (default 1,16,64,128)")
    ap.add_argument("--sizes", help="prefill / dense request lengths S, comma separated (default 256,512,1024,2048,4096)")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--host-inclusive", action="store_true",
                    help="time each call from an idle GPU, host launch path included, as anchors_bench.py does")
    ap.add_argument("--json")
    ap.add_argument("--md")
    a = ap.parse_args()
    import torch
    import importlib.util
    spec = importlib.util.spec_from_file_location("anchors_bench", a.anchors)
    ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab)
    if (ab.TOKENS, ab.TOPK) != (TOKENS, TOPK):
        sys.exit(f"anchors_bench.py has TOKENS, TOPK = {ab.TOKENS}, {ab.TOPK}; this script expects {TOKENS}, {TOPK}")
    shims = []
    for i, text in enumerate(a.shim or ["build-gpu/libdsmla_kernel_shim.so"]):
        shims.append(Shim(*parse_shim(text, i)))
    if len({s.label for s in shims}) != len(shims):
        sys.exit("--shim labels must differ: " + ", ".join(s.label for s in shims))
    kinds = set(a.only.split(","))
    Ss, Bs = ([1024], [64]) if a.quick else ([256, 512, 1024, 2048, 4096], [1, 16, 64, 128])
    if a.batches:
        Bs = [int(b) for b in a.batches.split(",")]
    if a.sizes:
        Ss = [int(S) for S in a.sizes.split(",")]
    plan = ([("prefill", prefill_workload, dict(S=S, H=H)) for S in Ss for H in (128, 64) if "prefill" in kinds] +
            [("decode", decode_workload, dict(B=B, H=H)) for B in Bs for H in (128, 64) if "decode" in kinds] +
            [("dense", dense_workload, dict(S=S, H=H)) for S in Ss for H in (128, 16) if "dense" in kinds])
    clock = sm_clock_reader()
    # ~200 us of spinning (400k cycles at the H200's ~1.98 GHz) ahead of each start event: longer than any
    # contender's host launch path (FlashMLA's Python wrapper: tens of us), which it hides.
    cover = None if a.host_inclusive else (lambda: torch.cuda._sleep(400_000))
    rows = []
    for kind, build, shape in plan:
        rows.append(measure(torch, ab, shims, kind, build, shape, a.rounds, a.warmup, clock, cover))
        torch.cuda.empty_cache()  # the workload's tensors died with measure()'s frame
    env = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, date=time.strftime("%Y-%m-%d %H:%M UTC",
               time.gmtime()), shims={s.label: dict(path=s.path, env=s.env) for s in shims}, rounds=a.rounds, warmup=a.warmup,
               timing="host-inclusive" if a.host_inclusive else "GPU time (launch path hidden)",
               tree=tree_commit())
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(env=env, rows=rows), f, indent=1)
    text = markdown(env, rows)
    if a.md:
        with open(a.md, "w") as f:
            f.write(text)
    print(text)
    return 1 if any("error" in r for r in rows) else 0


def tree_commit():
    if os.path.exists(".tree"):
        return open(".tree").read().strip()
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return None


def markdown(env, rows):
    lines = [f"Paired timing (bench/paired.py): {env['gpu']}, torch {env['torch']}, {env['date']}, tree "
             f"{env['tree']}; {env['rounds']} rounds after {env['warmup']} warm-ups, each contender once per round; "
             f"{env.get('timing', 'host-inclusive')}. "
             "Ratio = median over rounds of (dsmla / anchor in that round), with its 10th-90th percentiles; dense "
             "rows against the faster of FA3 and cuDNN in each round.\n",
             "| workload | contender | median | anchor median | ratio (p10-p90) | ratio of medians | bar | check |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['workload']} | failed: {r['error']} | | | | | | |")
            continue
        for name, ratio in r["ratios"].items():
            base = name.split(" / ")[0]
            anchor = " / ".join(f"{k} {v:.3f}" for k, v in r["medians_ms"].items()
                                if k in ("FlashMLA", "FA3", "cuDNN")) if " / " not in name else "-"
            bar = r["bars"].get(name)
            met = "-" if bar is None else ("yes" if ratio["median"] <= bar else "**no**") + f" (<= {bar})"
            check = r["checks"].get(base)
            check_text = "-" if check is None else ("ok" if check <= CHECK_TOLERANCE else "**MISMATCH**") + \
                f" {check:.1e}"
            lines.append(f"| {r['workload']} | {name} | {r['medians_ms'][base]:.3f} ms | {anchor} | "
                         f"{ratio['median']:.3f}x ({ratio['p10']:.3f}-{ratio['p90']:.3f}) | "
                         f"{ratio['of_medians']:.3f}x | {met} | {check_text} |")
        clocks = [c for c in r["sm_clock_mhz"] if c is not None]
        if clocks:
            lines.append(f"| {r['workload']} | SM clock over the rounds | {min(clocks)}-{max(clocks)} MHz | | | | | |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
