// `dsmla bench`: times the dense and sparse routes of dsmla::Attention (and
// each attention kernel alone) on the shapes of ANCHORS.md, next to the
// ceilings measured in the same run, and writes JSON + a markdown table.
//
// The parts: workloads.hpp (shapes, counts, anchors), runner.hpp (timing on
// the device, with the device helpers of bench_device.hpp), report.hpp (JSON,
// markdown, table). This file: the command line.
#include "bench/bench.hpp"

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <optional>
#include <string>

#include "bench/runner.hpp"
#include "bench/workloads.hpp"
#include "cli.hpp"
#include "dsmla/types.hpp"

namespace dsmla::tools {
namespace {

using bench::Options;

const char* kUsage =
    "usage: dsmla bench [--json FILE] [--md FILE] [--quick] [--repeats N] [--warmup N]\n"
    "                   [--prefill-cache bf16|fp8_ds_mla|fp8] [--anchors FILE] [--calibrate FILE]\n"
    "                   [--only attention,decode,mixed,graph,indexer]\n"
    "  Times the dense route, the sparse route and each kernel alone for 16384 prefill\n"
    "  tokens (S in 128..4096, H 128 and 16), next to a cuBLAS bf16 GEMM and a device copy\n"
    "  measured in the same run; then decode (issue 8; 8192-position requests, topk 2048):\n"
    "  fp8_ds_mla route and kernel at H 128 and 64, batch 1..128; the kernel at H 16 and 32\n"
    "  (against FlashMLA's H 64 time) with the cache bytes read per second; the kernel with\n"
    "  bf16 and per-tensor fp8 caches (H 128, batch 64); 2 and 4 tokens per request planned\n"
    "  as decodes (decode_threshold 2 / 4; H 128, batch 64), route and kernel, against the\n"
    "  1-token rows; then a mixed serving batch (a 4096-token prompt, eight\n"
    "  of 300..2000, 32 decodes; fp8_ds_mla, H 128 and 64): its forward on one stream, with\n"
    "  DSMLA_OVERLAP_PATHS=1 and planned split_at_topk, and its dense and sparse requests alone,\n"
    "  and 4 prompts of 4096 tokens (H 128 and 16) per_request and split_at_topk; then one fp8_ds_mla\n"
    "  decode step (batch 64, H 128) eager and replayed from a captured CUDA graph; then the\n"
    "  lightning indexer (64 heads x 128, topk 2048, block 64): its launches of one run() for\n"
    "  a prefill of 4K..32K tokens and decode batch 1 / 16 / 64 at contexts 4K and 64K against\n"
    "  the published DeepGEMM + torch.topk figures (not same-run), the fp8 logits kernel alone\n"
    "  on 16K tokens against a cuBLASLt e4m3 GEMM of the same run, and a mixed batch with half\n"
    "  its prefill tokens dense, per_request against force_sparse.\n"
    "  --quick: S 1024, H 128; decode batch 64 (H 128, 16, 32, the caches, 2 / 4 tokens);\n"
    "  mixed and long prompts H 128 only; indexer prefill 16K and decode B 64 at 64K.\n"
    "  --only LIST: only these sections (comma-separated): attention (prefill route and\n"
    "  kernel rows), decode, mixed, graph, indexer. The ceilings are always measured.\n"
    "  --anchors FILE: the anchors of the same device call, bench/paired.py --json (GPU time:\n"
    "  preferred) or anchors_bench.py --json (each sample from an idle GPU: its decode times\n"
    "  include FlashMLA's launch path); kernel rows then show its FlashMLA / cuDNN /\n"
    "  FlashAttention-3 time and ours / anchor. Read first: a bad file stops the run.\n"
    "  --calibrate FILE: instead, both routes of chunks of context 0..2000 and 2..2048 new\n"
    "  tokens (seq_len <= topk, H 16 and 128), and per head count the dense_cost_factor that\n"
    "  routes the most chunks to their faster route, written to FILE (dsmla plan\n"
    "  --cost-factors FILE, dsmla_options_load_cost_factors, load_cost_factors); --md then\n"
    "  gets the grid.\n"
    "  Progress goes to stderr, a compact table to stdout. Needs a CUDA build and a GPU.\n";

Options parse_options(const Args& args) {
  Options o;
  o.json_path = args.get("--json", "");
  o.md_path = args.get("--md", "");
  o.quick = args.has("--quick");
  o.calibrate_path = args.get("--calibrate", "");
  o.anchors_path = args.get("--anchors", "");
  o.repeats = static_cast<int>(args.get_int("--repeats", o.repeats, 1, 100000));
  o.warmup = static_cast<int>(args.get_int("--warmup", o.warmup, 0, 100000));
  if (args.has("--only")) {
    const std::string list = args.get("--only", "");
    std::size_t start = 0;
    while (start <= list.size()) {
      const std::size_t comma = std::min(list.find(',', start), list.size());
      const std::string name = list.substr(start, comma - start);
      if (std::find(std::begin(bench::kSections), std::end(bench::kSections), name) == std::end(bench::kSections)) {
        std::string known;
        for (const char* section : bench::kSections) known += std::string(known.empty() ? "" : ", ") + section;
        throw UsageError("--only: unknown section '" + name + "' (" + known + ")");
      }
      o.only.push_back(name);
      start = comma + 1;
    }
  }
  if (args.has("--prefill-cache")) {
    o.prefill_cache = parse_cache_format_arg(args.get("--prefill-cache", ""), "--prefill-cache");
  }
  return o;
}

}  // namespace

int bench_main(int argc, char** argv) {
  const Args args("bench",
                  {{"--json"}, {"--md"}, {"--quick", true, ""}, {"--repeats"}, {"--warmup"}, {"--prefill-cache"},
                   {"--calibrate"}, {"--anchors"}, {"--only"}},
                  argc, argv);
  if (args.help()) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  args.expect_positional(0, "");
  const Options options = parse_options(args);
  // The file the caller named is read before anything runs, on any machine.
  std::optional<bench::SameRunAnchors> anchors;
  if (!options.anchors_path.empty()) {
    try {
      anchors = bench::load_same_run_anchors(options.anchors_path);
    } catch (const Error& e) {
      throw UsageError(e.what());  // a bad file the caller named, not a failure of the run
    }
  }
  try {
    return bench::run_bench(options, anchors);
  } catch (const Error& e) {
    // Inputs here are fixed shapes: a dsmla::Error is a failure of the run, not bad input.
    throw RuntimeFailure(e.what());
  }
}

}  // namespace dsmla::tools
