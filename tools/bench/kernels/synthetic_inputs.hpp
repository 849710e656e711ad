// Reproducible synthetic inputs of the kernel harnesses. Each element is a
// function of (tensor, index) through a hash, so a host reference can
// recompute any element with the bits the device fill wrote.
#pragma once
#include <cstdint>
#include <cstring>

namespace dsmla::bench {

// splitmix64's finaliser.
__host__ __device__ inline std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 32;
  return x;
}

// 64 random bits for element `index` of tensor `tensor`.
__host__ __device__ inline std::uint64_t element_hash(std::uint64_t tensor, std::uint64_t index) {
  return mix64(index * 0x9E3779B97F4A7C15ull + tensor * 0xD1B54A32D192ED03ull);
}

// Uniform in [-1, 1): 24 random bits, exact in float.
__host__ __device__ inline float uniform_of_hash(std::uint64_t h) {
  return static_cast<float>(static_cast<std::int32_t>(h >> 40)) * (1.f / 8388608.f) - 1.f;
}

// Standard normal, the distribution of torch.randn that anchors_bench.py
// feeds the anchors: the sum of four 24-bit uniforms (Irwin-Hall; tails cut
// at 2 sqrt(3) = 3.46 sigma, beyond which torch.randn puts 0.05 % of its
// values), summed in integers and scaled once, so host and device compute
// the same float.
__host__ __device__ inline float normal_of(std::uint64_t tensor, std::uint64_t index) {
  const std::uint64_t a = element_hash(tensor, index), b = element_hash(tensor + 0x51ED27u, index);
  constexpr std::uint64_t k24 = 0xFFFFFF;
  const std::int32_t sum = static_cast<std::int32_t>((a & k24) + ((a >> 24) & k24) + (b & k24) + ((b >> 24) & k24)) -
                           (1 << 25);
  return static_cast<float>(sum) * (1.7320508075688772f / 16777216.f);
}

// x rounded to bf16 (to nearest, even; x finite), as a float: the value the
// device's __float2bfloat16 then stores exactly.
__host__ __device__ inline float round_to_bf16_value(float x) {
  std::uint32_t bits;
  std::memcpy(&bits, &x, 4);
  bits = (bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u;
  std::memcpy(&x, &bits, 4);
  return x;
}

}  // namespace dsmla::bench
