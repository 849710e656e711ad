// What the sparse MLA launcher passes to the kernel (work items: token x head
// block x a range of the top-k positions).
#pragma once
#include <cuda_runtime.h>
#include <cutlass/fast_math.h>

#include <vector>

#include "cuda/sparse_mla/sparse_mla.hpp"
#include "dsmla/format.hpp"

namespace dsmla::cuda::sparse_mla_detail {

inline constexpr int kHeadsPerCta = 64;
inline constexpr int kTileKeys = 64;
inline constexpr int kValueDim = kLatentDim;  // 512

struct KernelArgs {
  SparseMlaParams p;
  int split_keys = 0;          // top-k positions per split, a multiple of kTileKeys
  int num_splits = 1;
  // > 0: the balanced schedule (head_rows_work.cuh, Schedule) over this many
  // lanes; the caller passes the CTAs whose partial slots its workspace holds,
  // the launcher the lanes it launches (no more); num_splits is then 1.
  int lanes = 0;
  // Partial results. Equal splits: rows [num_splits, num_tokens, num_heads];
  // balanced: rows [2 x CTAs, 64] (two slots of a CTA's 64 head rows).
  float* part_lse = nullptr;   // a float per row
  float* part_o = nullptr;     // 512 floats per row
  // The schedule's divisors (head_rows_work.cuh), set by the launcher
  // (head_rows.cu, set_schedule_divisors): CUTLASS's multiply-and-shift
  // division. A division by a run-time value is ~20 instructions at each of
  // its inlined uses; they made nearly a quarter of the kernel's code, which every
  // multiprocessor fetches cold (sparse_mla/NOTES.md, session 42).
  cutlass::FastDivmod by_splits, by_head_blocks, by_row_blocks, by_lanes;
  int lane_blocks = 0, lane_extra = 0;  // balanced: total key blocks / lanes, and % lanes
};

// Where lane `lane` of `lanes` starts in the balanced schedule's `total`
// concatenated key blocks (head_rows_work.cuh, Schedule): floor(lane total /
// lanes), in 32-bit arithmetic (total < 2^31, the launcher's check; lane <=
// lanes <= the multiprocessor count).
__host__ __device__ __forceinline__ int lane_start(int total, int lane, int lanes) {
  return lane * (total / lanes) + lane * (total % lanes) / lanes;
}

// What a launch's work items write (WorkItem::part_row, head_rows_work.cuh):
// with no split, every item its final output; with equal splits, every item
// a partial; balanced, either. The launcher picks the kernel compiled for
// its case (the decode kernels, head_rows.cu), so that the kernel holds only
// the epilogue path it takes: code a CTA never runs still costs it time
// (sparse_mla/NOTES.md, session 42).
enum class ItemOutputs { final_only, partial_only, mixed };
inline ItemOutputs item_outputs(const KernelArgs& a) {
  return a.lanes > 0 ? ItemOutputs::mixed : a.num_splits > 1 ? ItemOutputs::partial_only : ItemOutputs::final_only;
}

// How a balanced launch went, for the merge kernel: the lanes launched (with
// args.lanes > 0 no more than that, nor than fit, nor than key blocks; 0 when
// not balanced) and the items a lane takes at a time (2 when paired).
struct LaneLaunch {
  int lanes = 0;
  int items_per_row = 1;
};

// The warp-specialised kernel, every cache format and head count (head_rows_kernel.cuh).
LaneLaunch run_head_rows_kernel(const KernelArgs& args, cudaStream_t stream);

#ifdef DSMLA_TRACE
// Traced builds: the head_rows kernel's stamps (head_rows_work.cuh, trace_slot),
// kCtas rows of kSlots (cuda/common/trace.cuh); cleared before a launch to read.
void clear_head_rows_trace();
std::vector<unsigned long long> read_head_rows_trace();
#endif

}  // namespace dsmla::cuda::sparse_mla_detail
