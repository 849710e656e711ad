// Event timing and random-input kernels of
// `dsmla bench` (declared in bench_device.hpp).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "bench/bench_device.hpp"
#include "dsmla/format.hpp"

namespace dsmla::cuda::bench {
namespace {

cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

// splitmix64: a counter-based generator, one independent value per (seed, index).
__device__ __forceinline__ std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__device__ __forceinline__ std::uint64_t hash2(std::uint64_t seed, std::uint64_t index) {
  return mix64(mix64(seed) ^ index);
}

// 24 random bits -> (-1, 1), never 0 (the half-step offset keeps it off the centre).
__device__ __forceinline__ float signed_unit(std::uint32_t bits24) {
  return (static_cast<float>(bits24 & 0xffffffu) + 0.5f) * (2.0f / 16777216.0f) - 1.0f;
}

__device__ __forceinline__ std::uint16_t bf16_bits(float x) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

// A random finite e4m3fn code: 0x7f / 0xff are the only NaNs, moved to +-448 (0x7e / 0xfe).
__device__ __forceinline__ std::uint32_t finite_e4m3(std::uint32_t byte) {
  return (byte & 0x7fu) == 0x7fu ? (byte & 0xfeu) : (byte & 0xffu);
}

__device__ __forceinline__ std::uint32_t random_e4m3x4(std::uint64_t h) {
  std::uint32_t w = 0;
  for (int b = 0; b < 4; ++b) w |= finite_e4m3(static_cast<std::uint32_t>(h >> (8 * b))) << (8 * b);
  return w;
}

__device__ __forceinline__ std::uint32_t random_bf16x2(std::uint64_t h) {
  const float lo = signed_unit(static_cast<std::uint32_t>(h));
  const float hi = signed_unit(static_cast<std::uint32_t>(h >> 32));
  return bf16_bits(lo) | (static_cast<std::uint32_t>(bf16_bits(hi)) << 16);
}

__global__ void fill_bf16_kernel(std::uint16_t* dst, std::size_t count, float scale,
                                 std::uint64_t seed) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    const float v = signed_unit(static_cast<std::uint32_t>(hash2(seed, i))) * scale;
    dst[i] = bf16_bits(v);
  }
}

// One thread per 4-byte word of the cache (every format's token size is a
// multiple of 4 and tokens are 4-byte aligned: 1152, 656, 576 bytes).
__global__ void fill_cache_kernel(std::uint32_t* words, std::int64_t total_words,
                                  int words_per_token, int format, std::uint64_t seed) {
  constexpr int kDsMlaCodeWords = kLatentDim / 4;                       // 128
  constexpr int kDsMlaScaleWords = kDsMlaNumTiles;                      // 4
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t w = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       w < total_words; w += stride) {
    const int word_in_token = static_cast<int>(w % words_per_token);
    const std::uint64_t h = hash2(seed, static_cast<std::uint64_t>(w));
    std::uint32_t value;
    switch (static_cast<CacheFormat>(format)) {
      case CacheFormat::bf16:
        value = random_bf16x2(h);
        break;
      case CacheFormat::fp8:
        value = random_e4m3x4(h);
        break;
      default:  // fp8_ds_mla: 512 codes, 4 fp32 tile scales, 64 bf16 k_pe
        if (word_in_token < kDsMlaCodeWords) {
          value = random_e4m3x4(h);
        } else if (word_in_token < kDsMlaCodeWords + kDsMlaScaleWords) {
          const float amax = 2.25f + 1.75f * signed_unit(static_cast<std::uint32_t>(h));
          value = __float_as_uint(amax / 448.0f);
        } else {
          value = random_bf16x2(h);
        }
        break;
    }
    words[w] = value;
  }
}

__global__ void fill_e4m3_kernel(std::uint8_t* dst, std::size_t count, std::uint64_t seed) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    dst[i] = static_cast<std::uint8_t>(finite_e4m3(static_cast<std::uint32_t>(hash2(seed, i))));
  }
}

__global__ void fill_f32_kernel(float* dst, std::size_t count, float scale, std::uint64_t seed) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    dst[i] = signed_unit(static_cast<std::uint32_t>(hash2(seed, i))) * scale;
  }
}

// One thread per 4-byte word of the index cache: a block is block_size * head_dim
// code bytes, then block_size fp32 scales (both multiples of 4 bytes).
__global__ void fill_index_cache_kernel(std::uint32_t* words, std::int64_t total_words, int words_per_block,
                                        int code_words_per_block, std::uint64_t seed) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t w = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       w < total_words; w += stride) {
    const std::uint64_t h = hash2(seed, static_cast<std::uint64_t>(w));
    if (w % words_per_block < code_words_per_block) {
      words[w] = random_e4m3x4(h);
    } else {
      const float amax = 2.25f + 1.75f * signed_unit(static_cast<std::uint32_t>(h));
      words[w] = __float_as_uint(amax / 448.0f);
    }
  }
}

__global__ void causal_topk_kernel(CausalTopkSpec spec, std::int32_t* local_indices,
                                   const std::int32_t* block_table, std::int32_t* slots,
                                   std::int32_t* valid_counts) {
  const int token = blockIdx.x;
  const int request = token / spec.query_len;
  const int position = spec.seq_len - spec.query_len + token % spec.query_len;
  const std::int64_t candidates = position + 1;
  const int topk = spec.topk;
  if (blockIdx.y == 0 && threadIdx.x == 0 && valid_counts != nullptr) {
    valid_counts[token] = static_cast<int>(candidates < topk ? candidates : topk);
  }
  const std::int64_t row = static_cast<std::int64_t>(token) * topk;
  for (int j = blockIdx.y * blockDim.x + threadIdx.x; j < topk; j += gridDim.y * blockDim.x) {
    int pos;
    if (candidates <= topk) {
      pos = j < candidates ? j : -1;
    } else {
      // Stratum j = [j*n/topk, (j+1)*n/topk) holds at least one position (n > topk).
      const std::int64_t lo = j * candidates / topk;
      const std::int64_t hi = (j + 1) * candidates / topk;
      pos = static_cast<int>(lo + static_cast<std::int64_t>(
                                      hash2(spec.seed, static_cast<std::uint64_t>(row + j)) %
                                      static_cast<std::uint64_t>(hi - lo)));
    }
    if (local_indices != nullptr) local_indices[row + j] = pos;
    if (slots != nullptr) {
      int slot = -1;
      if (pos >= 0) {
        const int block = block_table[static_cast<std::int64_t>(request) * spec.max_blocks_per_request +
                                      pos / spec.block_size];
        slot = block * spec.block_size + pos % spec.block_size;
      }
      slots[row + j] = slot;
    }
  }
}

__global__ void iota_kernel(std::int32_t* dst, int count) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count) dst[i] = i;
}

// Accumulates into result[0] (non-finite count), result[1] / result[2] (max |a|,
// max |a - b| as float bits: for non-negative floats the int order is the float order).
__global__ void check_output_kernel(const std::uint16_t* a, const std::uint16_t* b, std::size_t count,
                                    unsigned long long* nonfinite, unsigned int* max_bits) {
  unsigned long long bad = 0;
  float max_abs = 0.f, max_diff = 0.f;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    const float x = __bfloat162float(__ushort_as_bfloat16(a[i]));
    if (!isfinite(x)) {
      ++bad;
      continue;
    }
    max_abs = fmaxf(max_abs, fabsf(x));
    if (b != nullptr) {
      const float y = __bfloat162float(__ushort_as_bfloat16(b[i]));
      if (isfinite(y)) max_diff = fmaxf(max_diff, fabsf(x - y));
    }
  }
  // Warp-reduce first: one atomic per warp instead of one per thread.
  const unsigned warp_bad = __reduce_add_sync(0xffffffffu, static_cast<unsigned>(bad));
  const unsigned warp_abs = __reduce_max_sync(0xffffffffu, __float_as_uint(max_abs));
  const unsigned warp_diff = __reduce_max_sync(0xffffffffu, __float_as_uint(max_diff));
  if ((threadIdx.x & 31) == 0) {
    if (warp_bad != 0) atomicAdd(nonfinite, static_cast<unsigned long long>(warp_bad));
    atomicMax(&max_bits[0], warp_abs);
    atomicMax(&max_bits[1], warp_diff);
  }
}

constexpr int kFillThreads = 256;

int fill_blocks(std::int64_t items) {
  // Grid-stride loops: enough blocks to fill an H200 several times over.
  const std::int64_t wanted = (items + kFillThreads - 1) / kFillThreads;
  return static_cast<int>(wanted < 65536 ? (wanted > 0 ? wanted : 1) : 65536);
}

}  // namespace

DeviceInfo current_device_info() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    cudaGetLastError();
    throw Error(std::string("no CUDA device is visible (") +
                (status != cudaSuccess ? cudaGetErrorString(status) : "device count 0") + ")");
  }
  DeviceInfo info;
  check_cuda(cudaGetDevice(&info.device), "cudaGetDevice");
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, info.device), "cudaGetDeviceProperties");
  info.name = prop.name;
  info.compute_major = prop.major;
  info.compute_minor = prop.minor;
  info.multiprocessors = prop.multiProcessorCount;
  info.l2_bytes = static_cast<std::size_t>(prop.l2CacheSize);
  info.global_memory_bytes = prop.totalGlobalMem;
  check_cuda(cudaDriverGetVersion(&info.driver_version), "cudaDriverGetVersion");
  check_cuda(cudaRuntimeGetVersion(&info.runtime_version), "cudaRuntimeGetVersion");
  return info;
}

void synchronize_and_check(void* stream, const std::string& what) {
  check_cuda(cudaGetLastError(), (what + " (launch)").c_str());
  check_cuda(stream != nullptr ? cudaStreamSynchronize(as_stream(stream)) : cudaDeviceSynchronize(),
             (what + " (execution)").c_str());
}

std::vector<float> time_with_events(void* stream, int warmup, int repeats,
                                    const std::function<void(int)>& work) {
  if (repeats < 1) throw Error("repeats " + std::to_string(repeats) + " < 1");
  const cudaStream_t s = as_stream(stream);
  std::vector<cudaEvent_t> events(2 * static_cast<std::size_t>(repeats), nullptr);
  struct EventGuard {  // destroys the events on every exit path
    std::vector<cudaEvent_t>& events;
    ~EventGuard() {
      for (cudaEvent_t e : events)
        if (e != nullptr) cudaEventDestroy(e);
    }
  } guard{events};
  for (cudaEvent_t& e : events) check_cuda(cudaEventCreate(&e), "cudaEventCreate");

  int call = 0;
  for (int i = 0; i < warmup; ++i) work(call++);
  for (int i = 0; i < repeats; ++i) {
    check_cuda(cudaEventRecord(events[2 * i], s), "cudaEventRecord");
    work(call++);
    check_cuda(cudaEventRecord(events[2 * i + 1], s), "cudaEventRecord");
  }
  synchronize_and_check(stream, "timed work");
  std::vector<float> ms(static_cast<std::size_t>(repeats));
  for (int i = 0; i < repeats; ++i) {
    check_cuda(cudaEventElapsedTime(&ms[i], events[2 * i], events[2 * i + 1]), "cudaEventElapsedTime");
  }
  return ms;
}

void fill_random_bf16(std::uint16_t* dst, std::size_t count, float scale, std::uint64_t seed,
                      void* stream) {
  if (count == 0) return;
  fill_bf16_kernel<<<fill_blocks(static_cast<std::int64_t>(count)), kFillThreads, 0,
                     as_stream(stream)>>>(dst, count, scale, seed);
  check_cuda(cudaGetLastError(), "fill_random_bf16");
}

void fill_random_cache(std::uint8_t* cache, std::int64_t num_slots, CacheFormat format,
                       std::uint64_t seed, void* stream) {
  const int words_per_token = bytes_per_token(format) / 4;
  const std::int64_t total_words = num_slots * words_per_token;
  if (total_words == 0) return;
  fill_cache_kernel<<<fill_blocks(total_words), kFillThreads, 0, as_stream(stream)>>>(
      reinterpret_cast<std::uint32_t*>(cache), total_words, words_per_token,
      static_cast<int>(format), seed);
  check_cuda(cudaGetLastError(), "fill_random_cache");
}

void fill_random_e4m3(std::uint8_t* dst, std::size_t count, std::uint64_t seed, void* stream) {
  if (count == 0) return;
  fill_e4m3_kernel<<<fill_blocks(static_cast<std::int64_t>(count)), kFillThreads, 0, as_stream(stream)>>>(
      dst, count, seed);
  check_cuda(cudaGetLastError(), "fill_random_e4m3");
}

void fill_random_f32(float* dst, std::size_t count, float scale, std::uint64_t seed, void* stream) {
  if (count == 0) return;
  fill_f32_kernel<<<fill_blocks(static_cast<std::int64_t>(count)), kFillThreads, 0, as_stream(stream)>>>(
      dst, count, scale, seed);
  check_cuda(cudaGetLastError(), "fill_random_f32");
}

void fill_random_index_cache(std::uint8_t* cache, std::int64_t num_blocks, int block_size, int head_dim,
                             std::uint64_t seed, void* stream) {
  if (block_size < 1 || head_dim < 4 || head_dim % 4 != 0)
    throw Error("fill_random_index_cache: block_size " + std::to_string(block_size) + ", head_dim " +
                std::to_string(head_dim));
  const int words_per_block = block_size * (head_dim + 4) / 4;
  const std::int64_t total_words = num_blocks * words_per_block;
  if (total_words == 0) return;
  fill_index_cache_kernel<<<fill_blocks(total_words), kFillThreads, 0, as_stream(stream)>>>(
      reinterpret_cast<std::uint32_t*>(cache), total_words, words_per_block, block_size * head_dim / 4, seed);
  check_cuda(cudaGetLastError(), "fill_random_index_cache");
}

void fill_causal_topk(const CausalTopkSpec& spec, std::int32_t* local_indices,
                      const std::int32_t* block_table, std::int32_t* slots,
                      std::int32_t* valid_counts, void* stream) {
  if (spec.num_requests < 1 || spec.query_len < 1 || spec.query_len > spec.seq_len ||
      spec.topk < 1) {
    throw Error("fill_causal_topk: bad shape (requests " + std::to_string(spec.num_requests) +
                ", query_len " + std::to_string(spec.query_len) + ", seq_len " +
                std::to_string(spec.seq_len) + ", topk " + std::to_string(spec.topk) + ")");
  }
  if (slots != nullptr && (block_table == nullptr || spec.block_size < 1 ||
                           spec.max_blocks_per_request * spec.block_size < spec.seq_len)) {
    throw Error("fill_causal_topk: slots need a block table covering seq_len " +
                std::to_string(spec.seq_len));
  }
  const int tokens = spec.num_requests * spec.query_len;
  // Tokens on x (up to 2^31 - 1), column blocks on y (topk / 256 of them, a handful).
  const int column_blocks = (spec.topk + kFillThreads - 1) / kFillThreads;
  const dim3 grid(tokens, column_blocks < 65535 ? column_blocks : 65535);
  causal_topk_kernel<<<grid, kFillThreads, 0, as_stream(stream)>>>(spec, local_indices, block_table,
                                                                   slots, valid_counts);
  check_cuda(cudaGetLastError(), "fill_causal_topk");
}

void fill_iota(std::int32_t* dst, int count, void* stream) {
  if (count <= 0) return;
  iota_kernel<<<(count + kFillThreads - 1) / kFillThreads, kFillThreads, 0, as_stream(stream)>>>(
      dst, count);
  check_cuda(cudaGetLastError(), "fill_iota");
}

OutputCheck check_bf16_output(const std::uint16_t* a, const std::uint16_t* b, std::size_t count,
                              void* stream) {
  struct Result {
    unsigned long long nonfinite;
    unsigned int max_bits[2];
  };
  DeviceBuffer<Result> result(1);
  const cudaStream_t s = as_stream(stream);
  Result* r = result.data();
  check_cuda(cudaMemsetAsync(r, 0, sizeof(Result), s), "check_bf16_output");
  if (count != 0) {
    // A few blocks per SM are plenty for a reduction that reads count * 2 bytes once.
    const int blocks = std::min(fill_blocks(static_cast<std::int64_t>(count)), 1024);
    check_output_kernel<<<blocks, kFillThreads, 0, s>>>(a, b, count, &r->nonfinite, r->max_bits);
    check_cuda(cudaGetLastError(), "check_bf16_output");
  }
  Result host{};
  check_cuda(cudaMemcpyAsync(&host, r, sizeof(Result), cudaMemcpyDeviceToHost, s), "check_bf16_output");
  check_cuda(cudaStreamSynchronize(s), "check_bf16_output");
  OutputCheck out;
  out.nonfinite = static_cast<std::int64_t>(host.nonfinite);
  std::memcpy(&out.max_abs, &host.max_bits[0], sizeof(float));
  std::memcpy(&out.max_abs_diff, &host.max_bits[1], sizeof(float));
  return out;
}

void copy_device(void* dst, const void* src, std::size_t bytes, void* stream) {
  // cudaMemcpy does not wait for a device-to-device copy: queue it on the stream and wait.
  check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, as_stream(stream)), "copy_device");
  check_cuda(cudaStreamSynchronize(as_stream(stream)), "copy_device");
}

}  // namespace dsmla::cuda::bench
