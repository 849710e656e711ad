// Lightning indexer (DESIGN §6): logits over each planned row's candidate
// positions, then the top-k positions by logit (ties: lower position first).
// See NOTES.md for the design and the envelope.
//
// launch_indexer_topk processes the rows in chunks of chunk_rows(...) rows so the
// logits workspace stays within kWorkspaceBudgetBytes: per chunk, one logits
// launch (grid rows x key tiles) writes order-preserving uint32 keys of the
// logits into the workspace, then one top-k launch (one CTA per row) selects.
//
// Logits (cuda_core kernel, the reference; wgmma_ws is the default): one 256-thread CTA per (row, tile of
// 64 positions). The row's query (H x 128 e4m3 codes) is dequantised into shared
// memory as fp32 (exact); four threads own a key, each 32 of its 128 dims in
// registers as fp32 (exact); per head, 32 FMAs, two xor-shuffles give the full
// dot, then acc += w[h] * relu(dot); logit = acc * scale[key]. fp32 accumulation
// in a fixed order, identical for every key, so duplicate keys tie exactly.
//
// Top-k: 1-8 1024-thread CTAs per row (topk_kernel; its passes in topk_select.cuh).
#include <algorithm>
#include <map>
#include <mutex>
#include <string>

#include "common/env.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/common/fp8.cuh"
#include "cuda/common/launch.hpp"
#include "cuda/indexer/indexer.hpp"
#include "cuda/indexer/indexer_kernels.cuh"
#include "cuda/indexer/indexer_schedule.hpp"
#include "cuda/indexer/indexer_variants.hpp"
#include "cuda/indexer/topk_select.cuh"
#include "dsmla/types.hpp"

namespace dsmla::cuda {
namespace indexer {
namespace {

// ------------------------------------------------------------------ logits (CUDA cores)
constexpr int kLogitThreads = 256;
constexpr int kKeysPerTile = kLogitThreads / 4;  // 64
static_assert(kKeysPerTile == kRowAlign, "one logits tile per row-alignment unit");
constexpr int kQuarter = kHeadDim / 4;           // 32 dims per thread
constexpr int kQStride = kQuarter + 4;           // padded: the 4 quarters hit distinct banks

__global__ void __launch_bounds__(kLogitThreads)
    logits_cuda_core_kernel(IndexerTopkParams p, int row_begin, int stride, std::uint32_t* keys) {
  __shared__ __align__(16) float q_s[kMaxHeads * 4 * kQStride];  // [head][quarter][kQStride]
  __shared__ float w_s[kMaxHeads];

  const int local_row = blockIdx.x;
  const IndexerRow row = p.rows[row_begin + local_row];
  const int tile_begin = blockIdx.y * kKeysPerTile;
  // Block-uniform exits: invalid row, shortcut row (top-k needs no logits), tile past pos.
  if (!row_is_valid(row, p) || row.pos + 1 <= p.topk || tile_begin > row.pos) return;

  const int tid = threadIdx.x;
  const int heads = p.num_heads;
  const std::uint32_t* q_words =
      reinterpret_cast<const std::uint32_t*>(p.index_q + std::int64_t{row.token} * heads * kHeadDim);
  for (int w = tid; w < heads * (kHeadDim / 4); w += kLogitThreads) {
    const std::uint32_t word = q_words[w];
    const int e = 4 * w, h = e / kHeadDim, d = e % kHeadDim;
    float4 f;
    f.x = e4m3_to_float(static_cast<std::uint8_t>(word));
    f.y = e4m3_to_float(static_cast<std::uint8_t>(word >> 8));
    f.z = e4m3_to_float(static_cast<std::uint8_t>(word >> 16));
    f.w = e4m3_to_float(static_cast<std::uint8_t>(word >> 24));
    *reinterpret_cast<float4*>(&q_s[(h * 4 + d / kQuarter) * kQStride + d % kQuarter]) = f;
  }
  for (int h = tid; h < heads; h += kLogitThreads) w_s[h] = p.weights[std::int64_t{row.token} * heads + h];

  // This thread's key quarter (zeros for a non-candidate: computed, never stored as a logit).
  const int key = tid / 4, quarter = tid % 4;
  const int position = tile_begin + key;
  float k[kQuarter];
  float scale = 0.f;
  bool candidate = false;
  if (position <= row.pos) {
    const std::int64_t block = block_of(p, row.request, position);
    if (block >= 0) {
      candidate = true;
      const int r = position % p.block_size;
      const std::uint8_t* base = p.index_cache + block * cache_block_bytes(p);
      const std::uint32_t* codes =
          reinterpret_cast<const std::uint32_t*>(base + std::int64_t{r} * kHeadDim + quarter * kQuarter);
#pragma unroll
      for (int i = 0; i < kQuarter / 4; ++i) {
        const std::uint32_t word = codes[i];
#pragma unroll
        for (int b = 0; b < 4; ++b) k[4 * i + b] = e4m3_to_float(static_cast<std::uint8_t>(word >> (8 * b)));
      }
      scale = reinterpret_cast<const float*>(base + std::int64_t{p.block_size} * kHeadDim)[r];
    }
  }
  if (!candidate) {
#pragma unroll
    for (int i = 0; i < kQuarter; ++i) k[i] = 0.f;
  }
  __syncthreads();

  float acc = 0.f;
  for (int h = 0; h < heads; ++h) {
    const float4* qh = reinterpret_cast<const float4*>(&q_s[(h * 4 + quarter) * kQStride]);
    float partial = 0.f;
#pragma unroll
    for (int i = 0; i < kQuarter / 4; ++i) {
      const float4 qv = qh[i];
      partial = fmaf(qv.x, k[4 * i + 0], partial);
      partial = fmaf(qv.y, k[4 * i + 1], partial);
      partial = fmaf(qv.z, k[4 * i + 2], partial);
      partial = fmaf(qv.w, k[4 * i + 3], partial);
    }
    // The key's four threads are lanes 4j..4j+3 of one warp; every lane takes part.
    partial += __shfl_xor_sync(0xffffffffu, partial, 1);
    partial += __shfl_xor_sync(0xffffffffu, partial, 2);
    acc = fmaf(w_s[h], fmaxf(partial, 0.f), acc);
  }
  if (quarter == 0 && position <= row.pos)
    keys[std::int64_t{local_row} * stride + position] = candidate ? logit_key(acc * scale) : kNotCandidate;
}

// ------------------------------------------------------------------ top-k
// Row blockIdx.x / split of the chunk, CTA blockIdx.x % split of its group (a
// cluster of `split` CTAs when kCluster, else split == 1; topk_select.cuh).
template <bool kCluster>
__global__ void __launch_bounds__(kTopkThreads)
    topk_kernel(IndexerTopkParams p, int row_begin, int stride, const std::uint32_t* keys, int split) {
  __shared__ TopkShared<kCluster> sh;

  const int local_row = static_cast<int>(blockIdx.x) / split;
  const TopkGroup<kCluster> group{split, static_cast<int>(blockIdx.x) % split};
  const IndexerRow row = p.rows[row_begin + local_row];
  // Uniform over the group: its CTAs wait for each other only on valid rows.
  if (!row_is_valid(row, p)) return;
  const int topk = p.topk;
  const int n = row.pos + 1;  // candidate positions 0..pos
  const bool shortcut = n <= topk;
  std::int32_t* out = p.topk_out + std::int64_t{row.token} * topk;
  const RowKeys row_keys{&p, shortcut ? nullptr : keys + std::int64_t{local_row} * stride, row.request};

  // Slots [pad_begin, topk) get -1, by pad_ctas of the group's CTAs.
  std::uint32_t pad_begin = 0;
  int pad_ctas = split;
  if (shortcut) {  // every candidate (key 1 > 0); at most topk positions: the group's first CTA does it all
    pad_ctas = 1;
    if (group.rank == 0) pad_begin = compact(row_keys, Span{0, n}, kNotCandidate, 0u, 0u, 0u, sh, out, topk);
  } else {
    const Span slice = slice_of(n, group.rank, split);
    if constexpr (kCluster)
      if (threadIdx.x < 3) sh.local_above[threadIdx.x] = 0;  // before radix_pass's first barrier
    RadixState st{0u, 0u, static_cast<std::uint32_t>(topk)};
    radix_pass(row_keys, slice, 0, 21, 0x7ffu, st, sh, group);
    radix_pass(row_keys, slice, 1, 10, 0x7ffu, st, sh, group);
    radix_pass(row_keys, slice, 2, 0, 0x3ffu, st, sh, group);
    const std::uint32_t threshold = st.prefix;
    // Fewer candidates than topk: the k-th key is "not a candidate", take none of those.
    const std::uint32_t need_eq = threshold == kNotCandidate ? 0u : st.remaining;
    if constexpr (kCluster) {
      // The earlier slices' keys > T and == T, and the whole row's.
      if (threadIdx.x == 0) {
        sh.slice_gt = sh.local_above[0] + sh.local_above[1] + sh.local_above[2];
        sh.slice_eq = sh.local_at;
      }
      group.sync();
      std::uint32_t gt_before = 0, eq_before = 0, row_gt = 0, row_eq = 0;
      for (int r = 0; r < split; ++r) {
        const std::uint32_t gt = *group.at(&sh.slice_gt, r), eq = *group.at(&sh.slice_eq, r);
        if (r < group.rank) {
          gt_before += gt;
          eq_before += eq;
        }
        row_gt += gt;
        row_eq += eq;
      }
      compact(row_keys, slice, threshold, need_eq, gt_before, eq_before, sh, out, topk);
      pad_begin = row_gt + min(row_eq, need_eq);
    } else {
      pad_begin = compact(row_keys, slice, threshold, need_eq, 0u, 0u, sh, out, topk);
    }
  }
  if (group.rank < pad_ctas)
    for (std::uint32_t i = pad_begin + group.rank * kTopkThreads + threadIdx.x; i < static_cast<std::uint32_t>(topk);
         i += pad_ctas * kTopkThreads)
      out[i] = -1;
  // No CTA leaves while another may still read its shared memory.
  if constexpr (kCluster) group.sync();
}

// ------------------------------------------------------------------ host side
int row_stride(int max_pos) { return (max_pos + 1 + kRowAlign - 1) / kRowAlign * kRowAlign; }

bool needs_logits(int max_pos, int topk) { return max_pos + 1 > topk; }

int chunk_rows(int num_rows, int max_pos) {
  const std::int64_t row_bytes = std::int64_t{row_stride(max_pos)} * 4;
  return static_cast<int>(std::clamp<std::int64_t>(kWorkspaceBudgetBytes / row_bytes, 1, num_rows));
}

void check_envelope(int max_pos, int num_heads, int topk, const char* who) {
  if (max_pos < 0 || max_pos >= kMaxPositions)
    throw Error(std::string(who) + ": max_pos " + std::to_string(max_pos) + " outside [0, " +
                std::to_string(kMaxPositions - 1) + "]");
  if (num_heads <= 0 || num_heads > kMaxHeads || num_heads % 16 != 0)
    throw Error(std::string(who) + ": num_heads " + std::to_string(num_heads) +
                " is not supported (a multiple of 16 up to 64)");
  if (topk <= 0 || topk > kMaxTopk)
    throw Error(std::string(who) + ": topk " + std::to_string(topk) + " outside [1, " + std::to_string(kMaxTopk) + "]");
}

}  // namespace
}  // namespace indexer

const char* to_string(IndexerLogitsKernel kernel) {
  switch (kernel) {
    case IndexerLogitsKernel::wgmma: return "wgmma";
    case IndexerLogitsKernel::wgmma_ws: return "wgmma_ws";
    case IndexerLogitsKernel::cuda_core: break;
  }
  return "cuda_core";
}

IndexerLogitsKernel default_indexer_logits_kernel() {
  static const IndexerLogitsKernel kernel = [] {
    // wgmma_ws since its first GPU run (2026-12-02: the same tests passed,
    // 1.84x faster than wgmma on a 16K prefill, NOTES.md v2); wgmma before it
    // (19x faster than cuda_core), which stays as the reference.
    switch (dsmla::detail::env_choice("DSMLA_INDEXER_LOGITS", {"wgmma_ws", "wgmma", "cuda_core"})) {
      case 1: return IndexerLogitsKernel::wgmma;
      case 2: return IndexerLogitsKernel::cuda_core;
      default: return IndexerLogitsKernel::wgmma_ws;
    }
  }();
  return kernel;
}

std::size_t indexer_workspace_bytes(int num_rows, int max_pos, int num_heads, int topk) {
  using namespace indexer;
  if (num_rows <= 0) return 0;
  check_envelope(max_pos, num_heads, topk, "indexer_workspace_bytes");
  if (!needs_logits(max_pos, topk)) return 0;
  return static_cast<std::size_t>(chunk_rows(num_rows, max_pos)) * row_stride(max_pos) * 4;
}

void launch_indexer_topk(const IndexerTopkParams& p, cudaStream_t stream) {
  launch_indexer_topk(p, default_indexer_logits_kernel(), stream);
}

namespace indexer {
namespace {

// How many groups of 1, 2, 4 and 8 top-k CTAs the current device holds at once
// (once per device; one 1024-thread CTA per multiprocessor).
TopkGroupSlots topk_group_slots() {
  static std::mutex mutex;
  static std::map<int, TopkGroupSlots> known;
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  const std::lock_guard<std::mutex> lock(mutex);
  if (const auto it = known.find(device); it != known.end()) return it->second;
  TopkGroupSlots slots{};
  slots.groups_at_once[0] = multiprocessor_count();
  for (int i = 1; i < 4; ++i) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(1u << i);
    config.blockDim = dim3(kTopkThreads);
    cudaLaunchAttribute cluster = {};
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim = {1u << i, 1, 1};
    config.attrs = &cluster;
    config.numAttrs = 1;
    check_cuda(cudaOccupancyMaxActiveClusters(&slots.groups_at_once[i], topk_kernel<true>, &config),
               "cudaOccupancyMaxActiveClusters (indexer top-k)");
  }
  known.emplace(device, slots);
  return slots;
}

// Top-k CTAs per row for a launch over `rows` rows: indexer_topk_ctas_per_row's
// choice on this device, or DSMLA_INDEXER_TOPK_CTAS_PER_ROW (1, 2, 4 or 8) for sweeps.
// (The environment is read once per process, not on every chunk's launch.)
int chosen_topk_split(int rows, int max_pos) {
  static_assert(kMaxTopkCtasPerRow == 8, "the choices below");
  static const int forced = [] {
    const int choice = dsmla::detail::env_choice("DSMLA_INDEXER_TOPK_CTAS_PER_ROW", {"1", "2", "4", "8"});
    return choice < 0 ? 0 : 1 << choice;
  }();
  return forced != 0 ? forced : indexer_topk_ctas_per_row(rows, max_pos + 1, topk_group_slots());
}

// The top-k of rows [row_begin, row_begin + rows): `split` CTAs per row (0:
// chosen_topk_split), a cluster launch when split > 1.
void launch_topk(const IndexerTopkParams& p, int row_begin, int rows, int stride, const std::uint32_t* keys,
                 int split, cudaStream_t stream) {
  if (split == 0) split = chosen_topk_split(rows, p.max_pos);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(rows * split));
  config.blockDim = dim3(kTopkThreads);
  config.stream = stream;
  cudaLaunchAttribute cluster = {};
  if (split > 1) {
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim = {static_cast<unsigned>(split), 1, 1};
    config.attrs = &cluster;
    config.numAttrs = 1;
  }
  check_cuda(split > 1 ? cudaLaunchKernelEx(&config, topk_kernel<true>, p, row_begin, stride, keys, split)
                       : cudaLaunchKernelEx(&config, topk_kernel<false>, p, row_begin, stride, keys, split),
             "indexer topk_kernel launch");
}

// launch_indexer_topk's checks and chunk loop; `with_topk` false launches only
// the logits; topk_split as in launch_indexer_topk (indexer_variants.hpp).
void launch_chunks(const IndexerTopkParams& p, IndexerLogitsKernel kernel, bool with_topk, int topk_split,
                   cudaStream_t stream) {
  if (p.num_rows <= 0) return;
  const char* who = "launch_indexer_topk";
  check_envelope(p.max_pos, p.num_heads, p.topk, who);
  if (p.head_dim != kHeadDim)
    throw Error(std::string(who) + ": head_dim " + std::to_string(p.head_dim) + " is not supported (only 128)");
  if (p.block_size <= 0)
    throw Error(std::string(who) + ": block_size " + std::to_string(p.block_size) + " must be positive");
  if (p.max_blocks_per_request < 0 || p.num_blocks < 0)
    throw Error(std::string(who) + ": negative max_blocks_per_request or num_blocks");
  if (p.rows == nullptr || p.topk_out == nullptr || p.block_table == nullptr)
    throw Error(std::string(who) + ": null rows, topk_out or block_table");
  if (topk_split != 0 && topk_split != 1 && topk_split != 2 && topk_split != 4 && topk_split != kMaxTopkCtasPerRow)
    throw Error(std::string(who) + ": top-k CTAs per row " + std::to_string(topk_split) + " is not 0, 1, 2, 4 or 8");
  const bool logits = needs_logits(p.max_pos, p.topk);
  if (logits) {
    if (p.index_q == nullptr || p.weights == nullptr || (p.index_cache == nullptr && p.num_blocks > 0))
      throw Error(std::string(who) + ": null index_q, weights or index_cache");
    if (p.workspace == nullptr) throw Error(std::string(who) + ": missing workspace");
    if (reinterpret_cast<std::uintptr_t>(p.workspace) % 256 != 0)
      throw Error(std::string(who) + ": workspace is not 256-byte aligned");
    if (reinterpret_cast<std::uintptr_t>(p.index_q) % 16 != 0 || reinterpret_cast<std::uintptr_t>(p.index_cache) % 16 != 0)
      throw Error(std::string(who) + ": index_q and index_cache must be 16-byte aligned");
  }
  const int stride = row_stride(p.max_pos);
  const int chunk = chunk_rows(p.num_rows, p.max_pos);
  std::uint32_t* keys = static_cast<std::uint32_t*>(p.workspace);
  // The tensor-core kernels' 16-byte gathers need 16-byte aligned key rows (block_size % 4 == 0).
  const bool aligned_rows = p.block_size % 4 == 0;
  for (int r0 = 0; r0 < p.num_rows; r0 += chunk) {
    const int rows = std::min(chunk, p.num_rows - r0);
    if (logits) {
      if (kernel == IndexerLogitsKernel::wgmma && aligned_rows) {
        launch_logits_wgmma(p, r0, rows, stride, keys, stream);
      } else if (kernel == IndexerLogitsKernel::wgmma_ws && aligned_rows) {
        launch_logits_wgmma_ws(p, r0, rows, stride, keys, stream);
      } else {
        const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(stride / kKeysPerTile));
        logits_cuda_core_kernel<<<grid, kLogitThreads, 0, stream>>>(p, r0, stride, keys);
        check_launch("indexer logits_cuda_core_kernel");
      }
    }
    if (with_topk) launch_topk(p, r0, rows, stride, keys, topk_split, stream);
  }
}

}  // namespace
}  // namespace indexer

void launch_indexer_topk(const IndexerTopkParams& p, IndexerLogitsKernel kernel, cudaStream_t stream,
                         int topk_ctas_per_row) {
  indexer::launch_chunks(p, kernel, true, topk_ctas_per_row, stream);
}

void launch_indexer_logits_only(const IndexerTopkParams& p, IndexerLogitsKernel kernel, cudaStream_t stream) {
  indexer::launch_chunks(p, kernel, false, 0, stream);
}

int default_topk_ctas_per_row(const IndexerTopkParams& p) {
  if (p.num_rows <= 0) return 1;
  indexer::check_envelope(p.max_pos, p.num_heads, p.topk, "default_topk_ctas_per_row");
  return indexer::chosen_topk_split(std::min(p.num_rows, indexer::chunk_rows(p.num_rows, p.max_pos)), p.max_pos);
}

}  // namespace dsmla::cuda
