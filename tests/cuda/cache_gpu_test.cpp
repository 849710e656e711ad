// The cache kernels of src/cuda/cache against the host byte formats of
// include/dsmla/format.hpp: the cache write must produce exactly the bytes of
// write_cache_token (every format, k_scale 1 and 3, saturation, subnormals,
// NaN / inf), padding and out-of-range slots must leave the cache untouched,
// and the dense path's gather must reproduce read_cache_token rounded to bf16.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "cuda/cache/cache_kernels.hpp"
#include "cuda/common/device_buffer.hpp"
#include "dsmla/attention.hpp"
#include "dsmla/format.hpp"
#include "support/test_support.hpp"

namespace dsmla {
namespace {

using cuda::DeviceBuffer;

struct FormatCase {
  CacheFormat format;
  float k_scale;
  std::string name() const {
    std::string n(to_string(format));
    if (format == CacheFormat::fp8) n += "_k_scale_" + std::to_string(static_cast<int>(k_scale));
    return n;
  }
};

const FormatCase kFormats[] = {{CacheFormat::bf16, 1.f},
                               {CacheFormat::fp8_ds_mla, 1.f},
                               {CacheFormat::fp8, 1.f},
                               {CacheFormat::fp8, 3.f}};

// Random bf16 values whose magnitudes span many binades, so that fp8 writes hit
// saturation (> 448 * k_scale), normal and subnormal e4m3 codes and exact ties.
std::vector<std::uint16_t> random_values(std::mt19937_64& rng, std::size_t rows, int width) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_int_distribution<int> binade(-14, 10);
  std::vector<std::uint16_t> v(rows * width);
  for (std::size_t r = 0; r < rows; ++r) {
    const float row_scale = std::ldexp(1.f, binade(rng));
    for (int j = 0; j < width; ++j) v[r * width + j] = float_to_bf16(normal(rng) * row_scale);
  }
  return v;
}

// Device copy of a host byte array between two guard regions.
class GuardedDeviceBytes {
 public:
  static constexpr std::size_t kGuard = 256;
  static constexpr std::uint8_t kGuardByte = 0xa5;

  explicit GuardedDeviceBytes(const std::vector<std::uint8_t>& contents)
      : size_(contents.size()), dev_(contents.size() + 2 * kGuard) {
    std::vector<std::uint8_t> raw(dev_.size(), kGuardByte);
    std::copy(contents.begin(), contents.end(), raw.begin() + kGuard);
    dev_.upload(raw);
  }
  std::uint8_t* data() { return dev_.data() + kGuard; }
  // Contents after the kernels ran; fails the test if a guard byte changed.
  std::vector<std::uint8_t> download_checked() const {
    const std::vector<std::uint8_t> raw = dev_.download();
    std::size_t damaged = 0;
    for (std::size_t i = 0; i < kGuard; ++i)
      damaged += (raw[i] != kGuardByte) + (raw[kGuard + size_ + i] != kGuardByte);
    EXPECT_EQ(damaged, 0u) << "guard bytes around the device buffer were overwritten";
    return {raw.begin() + kGuard, raw.begin() + kGuard + static_cast<std::ptrdiff_t>(size_)};
  }

 private:
  std::size_t size_;
  DeviceBuffer<std::uint8_t> dev_;
};

// Index and value of the first differing byte, for a readable failure.
void expect_same_bytes(const std::vector<std::uint8_t>& want, const std::vector<std::uint8_t>& got, int bytes_per_slot,
                       const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  std::size_t differing = 0, first = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    if (want[i] != got[i] && differing++ == 0) first = i;
  EXPECT_EQ(differing, 0u) << what << ": " << differing << " bytes differ, first at slot " << first / bytes_per_slot
                           << " byte " << first % bytes_per_slot << ": want 0x" << std::hex << int{want[first]}
                           << " got 0x" << int{got[first]};
}

class CacheWriteTest : public ::testing::TestWithParam<FormatCase> {};

TEST_P(CacheWriteTest, BytesEqualHostWriter) {
  DSMLA_SKIP_WITHOUT_GPU();
  const FormatCase fc = GetParam();
  const int bpt = bytes_per_token(fc.format);
  const int T = 301;
  const std::int64_t num_slots = 64 * 9;
  std::mt19937_64 rng(42 + static_cast<int>(fc.format));

  std::vector<std::uint16_t> kv_c = random_values(rng, T, kLatentDim);
  std::vector<std::uint16_t> k_pe = random_values(rng, T, kRopeDim);
  // Special values in token 0 (kv_c tile 0 and k_pe) and an all-zero tile in token 1.
  // Infinities stay out of fp8_ds_mla's kv_c: they make the tile scale infinite, and the
  // sign of the NaN that inf / inf gives is the host CPU's choice (x86: negative).
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const bool tile_scaled = fc.format == CacheFormat::fp8_ds_mla;
  const float specials[] = {nan, -nan, tile_scaled ? 3.f : inf, tile_scaled ? -5.f : -inf,
                            -0.f, 448.f, 464.f, -1e30f, 1e-30f, 0.0009765625f /* 2^-10: tie to 0 */};
  for (std::size_t i = 0; i < std::size(specials); ++i) {
    kv_c[i] = float_to_bf16(specials[i]);
    k_pe[i] = float_to_bf16(i == 2 ? inf : i == 3 ? -inf : specials[i]);
  }
  std::fill(kv_c.begin() + kLatentDim + 128, kv_c.begin() + kLatentDim + 256, std::uint16_t{0});

  // Distinct slots in random order; every 7th token is padding (-1); two tokens carry
  // slots outside the cache (the planner rejects those; the kernel must skip them).
  std::vector<std::int64_t> all_slots(num_slots);
  std::iota(all_slots.begin(), all_slots.end(), 0);
  std::shuffle(all_slots.begin(), all_slots.end(), rng);
  std::vector<std::int64_t> slot_mapping(T);
  for (int t = 0; t < T; ++t) slot_mapping[t] = t % 7 == 3 ? -1 : all_slots[t];
  slot_mapping[5] = num_slots;
  slot_mapping[6] = -5;

  std::vector<std::uint8_t> cache(num_slots * bpt);
  for (auto& b : cache) b = static_cast<std::uint8_t>(rng());
  std::vector<std::uint8_t> want = cache;
  for (int t = 0; t < T; ++t) {
    const std::int64_t slot = slot_mapping[t];
    if (slot < 0 || slot >= num_slots) continue;
    write_cache_token(fc.format, std::span<std::uint8_t>(want.data() + slot * bpt, bpt), &kv_c[t * kLatentDim],
                      &k_pe[t * kRopeDim], fc.k_scale);
  }

  DeviceBuffer<std::uint16_t> d_kv_c, d_k_pe;
  DeviceBuffer<std::int64_t> d_slots;
  d_kv_c.upload(kv_c);
  d_k_pe.upload(k_pe);
  d_slots.upload(slot_mapping);
  GuardedDeviceBytes d_cache(cache);
  cuda::launch_cache_write({.kv_c = d_kv_c.data(),
                            .k_pe = d_k_pe.data(),
                            .slot_mapping = d_slots.data(),
                            .num_tokens = T,
                            .kv_cache = d_cache.data(),
                            .num_slots = num_slots,
                            .format = fc.format,
                            .k_scale = fc.k_scale},
                           nullptr);
  DSMLA_CUDA_CHECK(cudaDeviceSynchronize());
  expect_same_bytes(want, d_cache.download_checked(), bpt, fc.name() + " cache after the write");
}

TEST_P(CacheWriteTest, GatherLatentMatchesHostDequantisation) {
  DSMLA_SKIP_WITHOUT_GPU();
  const FormatCase fc = GetParam();
  const int bpt = bytes_per_token(fc.format);
  const int block_size = 16, num_blocks = 12, max_blocks = 5, T = 40;
  std::mt19937_64 rng(7 + static_cast<int>(fc.format));

  // A cache of valid tokens (random bytes could hold NaN codes).
  std::vector<std::uint8_t> cache(static_cast<std::size_t>(num_blocks) * block_size * bpt);
  const std::vector<std::uint16_t> cache_kv = random_values(rng, num_blocks * block_size, kLatentDim);
  const std::vector<std::uint16_t> cache_pe = random_values(rng, num_blocks * block_size, kRopeDim);
  for (int s = 0; s < num_blocks * block_size; ++s)
    write_cache_token(fc.format, std::span<std::uint8_t>(cache.data() + s * bpt, bpt), &cache_kv[s * kLatentDim],
                      &cache_pe[s * kRopeDim], fc.k_scale);
  const std::vector<std::uint16_t> kv_c = random_values(rng, T, kLatentDim);
  const std::vector<std::uint16_t> k_pe = random_values(rng, T, kRopeDim);

  // Two requests with shuffled blocks; request 1's third block id is outside the cache.
  std::vector<std::int32_t> block_table = {7, 2, 11, 0, 5, /* request 1 */ 3, 9, num_blocks, 1, 4};
  std::vector<cuda::LatentRowSource> rows;
  for (int pos = 0; pos < 70; ++pos) rows.push_back({0, pos, pos < 50 ? -1 : pos - 50, 0});  // 50 cached + 20 new
  for (int pos = 0; pos < 60; ++pos) rows.push_back({1, pos, pos < 40 ? -1 : 20 + (pos - 40), 0});

  std::vector<std::uint16_t> want(rows.size() * kLatentKeyDim);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    std::uint16_t* dst = &want[i * kLatentKeyDim];
    const cuda::LatentRowSource r = rows[i];
    if (r.token >= 0) {
      std::copy_n(&kv_c[r.token * kLatentDim], kLatentDim, dst);
      std::copy_n(&k_pe[r.token * kRopeDim], kRopeDim, dst + kLatentDim);
      continue;
    }
    const std::int32_t block = block_table[r.request * max_blocks + r.position / block_size];
    if (block < 0 || block >= num_blocks) {
      std::fill_n(dst, kLatentKeyDim, std::uint16_t{0});
      continue;
    }
    float values[kLatentKeyDim];
    const std::int64_t slot = std::int64_t{block} * block_size + r.position % block_size;
    read_cache_token(fc.format, std::span<const std::uint8_t>(cache.data() + slot * bpt, bpt), values, fc.k_scale);
    for (int j = 0; j < kLatentKeyDim; ++j) dst[j] = float_to_bf16(values[j]);
  }

  DeviceBuffer<std::uint16_t> d_kv_c, d_k_pe;
  DeviceBuffer<std::uint8_t> d_cache;
  DeviceBuffer<std::int32_t> d_table;
  DeviceBuffer<cuda::LatentRowSource> d_rows;
  d_kv_c.upload(kv_c);
  d_k_pe.upload(k_pe);
  d_cache.upload(cache);
  d_table.upload(block_table);
  d_rows.upload(rows);
  std::vector<std::uint8_t> poisoned(want.size() * 2, 0xff);
  GuardedDeviceBytes d_latent(poisoned);
  cuda::launch_gather_latent({.rows = d_rows.data(),
                              .num_rows = static_cast<std::int64_t>(rows.size()),
                              .kv_c = d_kv_c.data(),
                              .k_pe = d_k_pe.data(),
                              .kv_cache = d_cache.data(),
                              .block_table = d_table.data(),
                              .max_blocks_per_request = max_blocks,
                              .block_size = block_size,
                              .num_blocks = num_blocks,
                              .format = fc.format,
                              .k_scale = fc.k_scale,
                              .latent = reinterpret_cast<std::uint16_t*>(d_latent.data())},
                             nullptr);
  DSMLA_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<std::uint8_t> got_bytes = d_latent.download_checked();
  std::vector<std::uint8_t> want_bytes(want.size() * 2);
  std::memcpy(want_bytes.data(), want.data(), want_bytes.size());
  expect_same_bytes(want_bytes, got_bytes, kLatentKeyDim * 2, fc.name() + " gathered latent rows");
}

INSTANTIATE_TEST_SUITE_P(Formats, CacheWriteTest, ::testing::ValuesIn(kFormats),
                         [](const auto& info) { return info.param.name(); });

}  // namespace
}  // namespace dsmla
