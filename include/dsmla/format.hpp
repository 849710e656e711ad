// Scalar conversions and the byte formats of one cache token (DESIGN §4).
// Host code only; the CUDA kernels implement the same layouts and the tests
// compare their bytes with these.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>

#include "dsmla/types.hpp"

namespace dsmla {

// bf16 <-> float32. float_to_bf16 rounds to nearest even; NaN stays NaN.
float bf16_to_float(std::uint16_t bits);
std::uint16_t float_to_bf16(float x);
inline float round_to_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }

// OCP FP8 E4M3 (e4m3fn: no infinities, 0x7f/0xff are NaN, max finite 448).
// float_to_e4m3 rounds to nearest even and saturates finite values to +-448;
// NaN maps to 0x7f (sign kept), +-inf saturates to +-448.
float e4m3_to_float(std::uint8_t bits);
std::uint8_t float_to_e4m3(float x);

// Layout constants of fp8_ds_mla (one 656-byte token).
inline constexpr int kDsMlaTile = 128;                          // kv_c values per scale
inline constexpr int kDsMlaNumTiles = kLatentDim / kDsMlaTile;  // 4
inline constexpr int kDsMlaScaleOffset = kLatentDim;            // 512: 4 x fp32
inline constexpr int kDsMlaRopeOffset = kLatentDim + 4 * kDsMlaNumTiles;  // 528: 64 x bf16

// Bytes of one cache token (the table of DESIGN §4), 0 for a value outside the
// enum: the one definition behind bytes_per_token(), constexpr so that device
// code (built with --expt-relaxed-constexpr) uses it too.
constexpr int cache_token_bytes(CacheFormat f) {
  return f == CacheFormat::bf16         ? 2 * kLatentKeyDim                 // 1152: 576 x bf16
         : f == CacheFormat::fp8_ds_mla ? kDsMlaRopeOffset + 2 * kRopeDim   // 656
         : f == CacheFormat::fp8        ? kLatentKeyDim                     // 576: 576 x e4m3
                                        : 0;
}

// Quantise one token into `dst` (bytes_per_token(fmt) bytes).
// kv_c: 512 values, k_pe: 64 values, both given as bf16 bits (the model's dtype).
// k_scale is used by CacheFormat::fp8 only (stored value = x / k_scale).
void write_cache_token(CacheFormat fmt, std::span<std::uint8_t> dst,
                       const std::uint16_t* kv_c, const std::uint16_t* k_pe, float k_scale);

// Dequantise one token: out[0:512] = kv_c, out[512:576] = k_pe (float32).
void read_cache_token(CacheFormat fmt, std::span<const std::uint8_t> src, float* out,
                      float k_scale);

// fp8_ds_mla tile scale for a tile whose max |value| is amax: max(amax / 448, FLT_MIN).
// The index cache (below) scales its keys the same way.
float ds_mla_tile_scale(float amax);

// ---------------------------------------------------------------- index cache (DESIGN §6)
// The lightning indexer's key cache, paged like the latent cache (same block
// table, same slots): a tensor [num_blocks, block_size, head_dim + 4] bytes in
// the layout vLLM writes and DeepGEMM's paged MQA-logits kernel reads. Within
// a block, the block_size x head_dim e4m3 codes come first (row j at byte
// j * head_dim), then the block_size fp32 scales (row j at byte
// block_size * head_dim + 4 * j): so the "token" of dimension 2 is not the
// bytes of one token, only the size per token.
constexpr int index_cache_token_bytes(int head_dim) { return head_dim + 4; }

// Byte offsets of slot `slot`'s codes and scale inside the index cache.
constexpr std::size_t index_code_offset(std::int64_t slot, int block_size, int head_dim) {
  const auto block = static_cast<std::size_t>(slot / block_size), row = static_cast<std::size_t>(slot % block_size);
  return block * static_cast<std::size_t>(block_size) * static_cast<std::size_t>(index_cache_token_bytes(head_dim)) +
         row * static_cast<std::size_t>(head_dim);
}
constexpr std::size_t index_scale_offset(std::int64_t slot, int block_size, int head_dim) {
  const auto block = static_cast<std::size_t>(slot / block_size), row = static_cast<std::size_t>(slot % block_size);
  return (block * static_cast<std::size_t>(index_cache_token_bytes(head_dim)) + static_cast<std::size_t>(head_dim)) *
             static_cast<std::size_t>(block_size) +
         4 * row;
}

// Stores the bf16 key `key` (head_dim values) of a new token at `slot`: codes
// e4m3(k / s) (round to nearest even, true division), s = ds_mla_tile_scale(amax |k|).
void write_index_key(std::uint8_t* index_cache, std::int64_t slot, int block_size, int head_dim,
                     const std::uint16_t* key);

// The stored key at `slot`: its head_dim codes (as bytes) and its scale.
struct IndexKeyView {
  const std::uint8_t* codes = nullptr;
  float scale = 0;
};
IndexKeyView read_index_key(const std::uint8_t* index_cache, std::int64_t slot, int block_size, int head_dim);

}  // namespace dsmla
