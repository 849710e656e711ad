// `dsmla bench` workloads: the fixed shapes of ANCHORS.md, the batches that
// are timed (Work), what is timed of each (What), their valid-work FLOP and
// compulsory-byte counts, the reference figures they are compared with, and
// the host metadata of a batch. Host code only.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dsmla/plan.hpp"
#include "dsmla/testing/batch.hpp"
#include "dsmla/types.hpp"

namespace dsmla::tools::bench {

// ---------------------------------------------------------------- fixed shapes
constexpr int kPrefillTokens = 16384;  // B sequences of S tokens, B * S = 16384
constexpr int kTopk = 2048;
constexpr int kBlockSize = 64;
constexpr int kDecodeSeqLen = 8192;    // context + the one new token
constexpr CacheFormat kDecodeCache = CacheFormat::fp8_ds_mla;
constexpr int kGemmCeilingN = 8192;
constexpr std::size_t kCopyCeilingBytes = std::size_t{2} << 30;  // 2 GiB each way
constexpr std::size_t kFallbackL2Bytes = 60u << 20;
constexpr int kMaxInputCopies = 64;
constexpr double kBf16 = 2, kFp32 = 4, kInt32 = 4;

// The sections of a run (--only takes a comma-separated list of them).
inline constexpr const char* kSections[] = {"attention", "decode", "mixed", "graph", "indexer"};

struct Options {
  std::string json_path, md_path;
  std::string calibrate_path;  // --calibrate FILE: time the calibration grid, write the cost factors
  std::string anchors_path;    // --anchors FILE: ../shared/anchors/anchors_bench.py --json of the same call
  bool quick = false;
  int repeats = 30;
  int warmup = 5;
  CacheFormat prefill_cache = CacheFormat::bf16;
  std::vector<std::string> only;  // --only: the sections to run (empty: all of kSections)

  bool runs(const std::string& section) const {
    return only.empty() || std::find(only.begin(), only.end(), section) != only.end();
  }
};

// ---------------------------------------------------------------- work and its counts
// A uniform batch: `requests` requests of seq_len positions, the last
// query_len of them new (prefill: query_len = seq_len; decode: query_len = 1,
// or 2 / 4 for speculative decoding, planned with decode_threshold = query_len).
struct Work {
  bool decode = false;
  int requests = 0;
  int query_len = 0;
  int seq_len = 0;
  int heads = 0;
  int topk = kTopk;
  CacheFormat cache = CacheFormat::bf16;

  std::int64_t tokens() const { return std::int64_t{requests} * query_len; }
  std::int64_t ctx_len() const { return seq_len - query_len; }
  std::int64_t kv_rows() const { return std::int64_t{requests} * seq_len; }
  // Causal (query, key) pairs: new token i sees ctx + i + 1 positions.
  double causal_pairs() const {
    const double q = query_len, c = static_cast<double>(ctx_len());
    return requests * (q * c + q * (q + 1) / 2);
  }
  // Valid top-k entries: token i selects min(ctx + i + 1, topk) positions.
  double sparse_valid() const {
    double per_request = 0;
    for (std::int64_t i = 0; i < query_len; ++i) per_request += std::min<std::int64_t>(ctx_len() + i + 1, topk);
    return requests * per_request;
  }
  // Distinct cache positions the sparse kernel must read (exact for the causal sets used here).
  double distinct_keys() const {
    return requests * static_cast<double>(std::min<std::int64_t>(seq_len, std::int64_t{query_len} * topk));
  }
};

enum class What { dense_route, sparse_route, dense_kernel, sparse_kernel };

const char* name_of(What w, bool decode);
// Valid-work FLOPs (DESIGN §7): dense attention 2 * pairs * H * (192 + 128),
// sparse 2 * valid * H * (576 + 512), up-projection 2 * rows * 512 * H * 256
// (dense: every kv row; sparse: q absorption + output projection of every token).
double flops_of(What what, const Work& w);
// Compulsory device-memory traffic: every input read once, every output
// written once (workspace intermediates not counted). Used for TB/s and for
// deciding how many input copies keep the working set out of L2.
double bytes_of(What what, const Work& w);

// The prefill batches of a run (S 128..4096, H 128 and 16); --quick: S 1024, H 128.
std::vector<Work> prefill_work_list(const Options& o);

// ---------------------------------------------------------------- decode (issue 8)
// One decode batch of section `decode` and the rows timed of it (decode_kernel
// and / or decode_route, in that list's order).
struct DecodeWork {
  Work work;
  std::vector<What> whats;
};
// Every batch: `requests` requests of kDecodeSeqLen positions, topk 2048, block 64.
//   H 128 and 64, batch 1 / 16 / 64 / 128, fp8_ds_mla, 1 token: route and kernel;
//   H 16 and 32, the same batches: kernel (issue 8's small-H bar is on the kernel);
//   H 128, batch 64, bf16 and fp8 (per-tensor) caches, 1 token: kernel;
//   H 128, batch 64, fp8_ds_mla, 2 and 4 tokens per request (speculative decoding,
//   decode_threshold 2 and 4): route and kernel.
// --quick: batch 64 only, and H 128 only in the first kind.
std::vector<DecodeWork> decode_work_list(const Options& o);

// Cache bytes a decode call must read at least once: for each query token, its
// valid top-k rows x bytes_per_token(cache) (a row two tokens of a request both
// select counts twice: each token's attention reads it).
double cache_bytes_min(const Work& w);
// The top-k sets of a batch in words: how the rows of the bench are drawn.
std::string topk_sets_of(const Work& w);
// What one timed call of row `what` of decode batch `w` holds.
std::string timed_region(What what, const Work& w);

// Issue 8's bars. Kernel rows at H >= 64: ours / FlashMLA (same H, same run) <= 1.0;
// H 16 / 32: ours / FlashMLA's H 64 time (same batch, same run) <= 0.4 at batch >= 16;
// bf16 / fp8 caches: cache bytes read per second >= the fp8_ds_mla row's (same H, batch);
// q tokens per request: time / the 1-token time of the same call <= 1.3 (q 2), 2.0 (q 4);
// route rows at H 128, batch 16..128: route / kernel alone <= 1.15.
constexpr double kDecodeKernelBar = 1.0, kSmallHeadsBar = 0.4, kCacheRateBar = 1.0, kDecodeRouteBar = 1.15;
constexpr int kSmallHeadsBarMinBatch = 16;
constexpr int kFlashMlaMinHeads = 64;  // FlashMLA runs 64 or 128 heads (16 / 32 padded to 64)
// The speculative-decoding bar of q tokens per request (0: none).
double speculative_bar(int query_len);

// --calibrate: chunks of ctx_len cached and q_len new tokens with seq_len <=
// topk (context 0..2000, new tokens 2..2048; one new token is a decode, which
// is always sparse), H 16 and 128 (--quick: H 128, fewer chunks), each with
// as many requests as keep about 16K new tokens and at most 128K cached rows
// (the dense route up-projects every row of its requests).
std::vector<Work> calibration_grid(const Options& o);

// A mixed serving batch (issues 7 and 9): one 4096-token prompt (sparse), eight
// prompts of 300..2000 tokens (dense under per_request), 32 decodes over
// contexts of 3000..7247 tokens; fp8_ds_mla, topk 2048, H 128 and 64 (--quick: 128).
struct MixedBatch {
  std::vector<std::int32_t> seq_lens, query_lens;
  int heads = 0;
  CacheFormat cache = CacheFormat::fp8_ds_mla;
};
std::vector<MixedBatch> mixed_batches(const Options& o);

// ---------------------------------------------------------------- anchors
// Where the reference figures come from (ANCHORS.md of the design brief).
extern const char* const kAnchorSource;

// What a row is compared with (`ms`, the same work by the best parts available
// today) and, where ANCHORS.md has one, a second reference shown in the JSON.
struct Anchor {
  double ms = 0;
  std::string what;
  double alt_ms = 0;
  std::string alt_what;
};
std::optional<Anchor> anchor_for(What what, const Work& w);

// The anchors timed in the same device call, keyed "<what> <S or B> <H>" in ms
// (what: flashmla_sparse_prefill, flashmla_fp8_decode, fa3_dense, cudnn_dense),
// from either file: bench/paired.py --json (rows {kind, S or B, H, medians_ms};
// GPU time, the launch path hidden: preferred) or
// ../shared/anchors/anchors_bench.py --json (rows {what, unit, time, S or B, H};
// each sample from an idle GPU, which puts FlashMLA's Python launch path into
// the microsecond decode rows).
struct SameRunAnchors {
  std::string source;  // the file, the GPU / versions it names and how it timed
  std::map<std::string, double> ms;
};
// Throws Error naming the file and the problem.
SameRunAnchors load_same_run_anchors(const std::string& path);
// The same-run figure a kernel row compares with: FlashMLA sparse prefill (S, H),
// the faster of cuDNN and FlashAttention-3 (S, H), FlashMLA fp8 decode (batch, H).
// Routes have none (the anchors time no GEMMs).
std::optional<Anchor> same_run_anchor_for(What what, const Work& w, const SameRunAnchors& anchors);

// ---------------------------------------------------------------- lightning indexer (issue 10)
constexpr int kIndexHeads = 64;     // DeepSeek-V3.2's indexer: 64 heads x 128, fp8 keys
constexpr int kIndexHeadDim = 128;
constexpr int kFp8GemmCeilingN = 8192;
// The attention of the run() cross-check of the indexer rows.
constexpr int kIndexerRunHeads = 128;
constexpr CacheFormat kIndexerRunCache = CacheFormat::fp8_ds_mla;
// Issue 10's bars: indexer time at most 0.7x the published DeepGEMM + torch.topk
// figure; the fp8 logits kernel at least 60% of the same-run cuBLASLt fp8 GEMM
// rate; a mixed batch's indexer time under per_request at most 0.55x of the same
// batch forced sparse.
constexpr double kIndexerBar = 0.7, kIndexerLogitsBar = 0.6, kIndexerSkipBar = 0.55;

enum class IndexerKind {
  prefill,       // one sequence of S new tokens: the indexer's launches of run()
  decode,        // batch B, one new token over a context of seq_len positions
  logits_alone,  // the fp8 logits kernel alone on one sequence of S tokens
  routing_skip,  // a mixed batch: indexer under per_request vs the same batch forced sparse
};
const char* name_of(IndexerKind k);

// One indexer workload: requests of seq_lens positions, the last query_lens of them new.
// 64 index heads x 128, topk 2048, block 64; the attention inputs of the run()
// cross-check are fp8_ds_mla, H 128.
struct IndexerWork {
  IndexerKind kind = IndexerKind::prefill;
  std::vector<std::int32_t> seq_lens, query_lens;
  int batch = 0;    // prefill / logits: 1; decode: B; mixed: the number of requests
  int seq_len = 0;  // prefill / logits: S; decode: the context (positions, new token included); mixed: 0
  std::string label() const;  // e.g. "prefill S 16384", "decode B 16 ctx 65536"
};

// Prefill S 4K / 8K / 16K / 32K, decode B 1 / 16 / 64 at contexts 4K and 64K,
// the logits kernel alone on 16K, and the mixed batch of routing_skip_batch()
// (--quick: prefill 16K, decode B 64 at 64K, logits 16K, the mixed batch).
std::vector<IndexerWork> indexer_work_list(const Options& o);

// A mixed batch where half of the prefill tokens route dense under per_request:
// one 8192-token prompt (sparse), four 2048-token prompts (dense: seq_len <= topk),
// and 32 decodes over contexts of 3000..7247 tokens.
IndexerWork routing_skip_batch();

// The published DeepGEMM fp8_mqa_logits + torch.topk figure of a prefill or
// decode row (ANCHORS.md, "Lightning indexer": third party, not same-run), or
// none (prefill 32K). Decode batch 16 has no published figure: its anchor is
// the linear interpolation in batch between the published batch 1 and batch 64
// figures, and its `what` says so.
std::optional<Anchor> indexer_anchor(const IndexerWork& w);

// ---------------------------------------------------------------- host batch metadata
// Metadata of a uniform batch with a shuffled block table (every request's
// blocks scattered over the cache, as a paged allocator leaves them).
BatchStorage make_host_batch(const Work& w, std::uint64_t seed);
// Dense requests of a uniform batch, as the planner lays them out.
std::vector<DenseRequest> dense_requests_of(const Work& w);

}  // namespace dsmla::tools::bench
