// Host side of the sparse MLA kernel: argument checks, the workspace layout
// of the split-KV choice (plan/sparse_split.hpp) and the kernel that merges
// split partial results.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "cuda/common/launch.hpp"
#include "cuda/sparse_mla/sparse_mla.hpp"
#include "cuda/sparse_mla/kernel_args.hpp"
#include "plan/sparse_split.hpp"

namespace dsmla::cuda {
namespace {

using sparse_mla_detail::kHeadsPerCta;
using sparse_mla_detail::kTileKeys;
using sparse_mla_detail::kValueDim;

static_assert(kTileKeys == kSparseTileKeys && kHeadsPerCta == kSparseHeadsPerItem,
              "the host split choice (plan/sparse_split.hpp) assumes the kernel's block and item sizes");

constexpr int kCombineThreads = kValueDim / 4;  // 4 columns per thread

// out = sum_s exp(lse_s - lse) o_s with lse = log sum_s exp(lse_s); empty splits
// (lse_s = -inf) are never read. One CTA per (token, head).
__global__ void __launch_bounds__(kCombineThreads) sparse_mla_combine_kernel(
    const float* __restrict__ part_lse, const float* __restrict__ part_o, int num_splits, int num_tokens,
    int num_heads, __nv_bfloat16* __restrict__ o_lat, float* __restrict__ lse_out,
    const std::int32_t* __restrict__ lse_rows) {
  const int token = blockIdx.x;
  const int head = blockIdx.y;
  const std::int64_t split_stride = static_cast<std::int64_t>(num_tokens) * num_heads;
  const std::int64_t row = static_cast<std::int64_t>(token) * num_heads + head;
  float lse_max = -INFINITY;
  for (int s = 0; s < num_splits; ++s) lse_max = fmaxf(lse_max, part_lse[s * split_stride + row]);
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  float weight_sum = 0.f;
  if (lse_max != -INFINITY) {
    for (int s = 0; s < num_splits; ++s) {
      const float ls = part_lse[s * split_stride + row];
      if (ls == -INFINITY) continue;
      const float w = __expf(ls - lse_max);
      const float4 v =
          reinterpret_cast<const float4*>(part_o + (s * split_stride + row) * kValueDim)[threadIdx.x];
      acc.x += w * v.x;
      acc.y += w * v.y;
      acc.z += w * v.z;
      acc.w += w * v.w;
      weight_sum += w;
    }
  }
  const float inv = weight_sum > 0.f ? 1.f / weight_sum : 0.f;
  const __nv_bfloat162 lo = __floats2bfloat162_rn(acc.x * inv, acc.y * inv);
  const __nv_bfloat162 hi = __floats2bfloat162_rn(acc.z * inv, acc.w * inv);
  uint2 packed;
  packed.x = *reinterpret_cast<const std::uint32_t*>(&lo);
  packed.y = *reinterpret_cast<const std::uint32_t*>(&hi);
  reinterpret_cast<uint2*>(o_lat + row * kValueDim)[threadIdx.x] = packed;
  if (threadIdx.x == 0 && lse_out != nullptr) {
    const std::int64_t lse_row = lse_rows != nullptr ? lse_rows[token] : token;
    lse_out[lse_row * num_heads + head] = weight_sum > 0.f ? lse_max + logf(weight_sum) : -INFINITY;
  }
}

void check_params(const SparseMlaParams& p) {
  if (p.num_heads <= 0 || p.num_heads % 16 != 0) {
    throw Error("sparse MLA: num_heads " + std::to_string(p.num_heads) + " is not a positive multiple of 16");
  }
  if (p.num_tokens < 0) throw Error("sparse MLA: num_tokens " + std::to_string(p.num_tokens) + " < 0");
  if (p.topk <= 0) throw Error("sparse MLA: topk " + std::to_string(p.topk) + " must be positive");
  if (p.num_slots < 0) throw Error("sparse MLA: num_slots " + std::to_string(p.num_slots) + " < 0");
  if (p.num_tokens == 0) return;
  if (p.q == nullptr || p.kv_cache == nullptr || p.slots == nullptr || p.valid_counts == nullptr ||
      p.o_lat == nullptr) {
    throw Error("sparse MLA: q, kv_cache, slots, valid_counts and o_lat must not be null");
  }
  auto aligned = [](const void* ptr, std::uintptr_t a) { return reinterpret_cast<std::uintptr_t>(ptr) % a == 0; };
  if (!aligned(p.kv_cache, 16) || !aligned(p.q, 16) || !aligned(p.o_lat, 16)) {
    throw Error("sparse MLA: q, kv_cache and o_lat must be 16-byte aligned");
  }
  if (p.format != CacheFormat::bf16 && p.format != CacheFormat::fp8_ds_mla && p.format != CacheFormat::fp8) {
    throw Error("sparse MLA: unknown cache format " + std::to_string(static_cast<int>(p.format)));
  }
}

}  // namespace

std::size_t sparse_mla_workspace_bytes(int num_tokens, int num_heads, int topk) {
  if (num_tokens <= 0 || num_heads <= 0 || topk <= 0) return 0;
  return sparse_split_workspace_bytes(plan_sparse_split(num_tokens, num_heads, topk, multiprocessor_count()),
                                      num_tokens, num_heads);
}

void launch_sparse_mla(const SparseMlaParams& p, cudaStream_t stream) {
  check_params(p);
  if (p.num_tokens == 0) return;
  const SparseSplit split = plan_sparse_split(p.num_tokens, p.num_heads, p.topk, multiprocessor_count());

  sparse_mla_detail::KernelArgs args;
  args.p = p;
  args.split_keys = split.split_keys;
  args.num_splits = split.num_splits;
  if (split.num_splits > 1) {
    if (p.workspace == nullptr || reinterpret_cast<std::uintptr_t>(p.workspace) % kWorkspaceAlignment != 0) {
      throw Error("sparse MLA: " + std::to_string(split.num_splits) +
                  "-way split needs a 256-byte aligned workspace of " +
                  std::to_string(sparse_split_workspace_bytes(split, p.num_tokens, p.num_heads)) + " bytes");
    }
    auto* base = static_cast<std::uint8_t*>(p.workspace);
    args.part_lse = reinterpret_cast<float*>(base);
    args.part_o = reinterpret_cast<float*>(base + sparse_split_lse_bytes(split, p.num_tokens, p.num_heads));
  }

  sparse_mla_detail::run_head_rows_kernel(args, stream);
  check_launch("sparse MLA kernel");

  if (split.num_splits > 1) {
    const dim3 grid(static_cast<unsigned>(p.num_tokens), static_cast<unsigned>(p.num_heads));
    sparse_mla_combine_kernel<<<grid, kCombineThreads, 0, stream>>>(args.part_lse, args.part_o, split.num_splits,
                                                                    p.num_tokens, p.num_heads, p.o_lat, p.lse,
                                                                    p.lse_rows);
    check_launch("sparse MLA combine kernel");
  }
}

}  // namespace dsmla::cuda
