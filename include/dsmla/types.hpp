// Basic vocabulary shared by every part of dsmla: model dimensions, cache
// formats, routing policies, token paths and the one exception type.
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace dsmla {

// DeepSeek-V3.2 MLA dimensions that are fixed by the model (DESIGN §1).
// The number of heads is a run-time parameter (16..128, multiple of 16).
inline constexpr int kLatentDim = 512;   // kv_lora_rank, width of kv_c
inline constexpr int kRopeDim = 64;      // q_pe / k_pe
inline constexpr int kNopeDim = 128;     // q_nope per head
inline constexpr int kVHeadDim = 128;    // value head dim
inline constexpr int kQkHeadDim = kNopeDim + kRopeDim;      // 192: dense q/k width
inline constexpr int kLatentKeyDim = kLatentDim + kRopeDim;  // 576: sparse key width
inline constexpr int kKvBRowsPerHead = kNopeDim + kVHeadDim; // 256 rows of w_kv_b per head

// Every error dsmla reports: bad input, unsupported combination, device failure.
// The message names the offending value (request, token, column, ...).
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class CacheFormat : int {
  bf16 = 0,        // 1152 B/token: 576 x bf16 [kv_c | k_pe]
  fp8_ds_mla = 1,  // 656 B/token: 512 x e4m3, 4 x fp32 tile scales, 64 x bf16 k_pe
  fp8 = 2,         // 576 B/token: 576 x e4m3 = value / k_scale (per-tensor)
};

enum class RoutingPolicy : int {
  per_request = 0,   // dense iff exact (seq_len <= topk) and cheaper by the cost model
  per_batch = 1,     // all prefills dense iff every prefill has seq_len <= topk
  force_sparse = 2,  // everything on the sparse path
  // per_request, and a prefill whose positions cross topk (ctx_len < topk < seq_len)
  // runs its new tokens at positions below topk dense (exact there: each selects
  // all of 0..pos) and the rest sparse, when that is cheaper by the cost model.
  split_at_topk = 3,
};

// What a token row of the batch does.
enum class TokenPath : std::uint8_t {
  padding = 0,  // row beyond query_start_loc[R]: output 0, lse -inf, nothing written
  decode = 1,   // query_len <= decode_threshold: sparse kernel
  sparse = 2,   // long / cheap-sparse prefill: sparse kernel
  dense = 3,    // short prefill: dense causal MHA
};

// Bytes of one cache token of format f (DESIGN §4: 1152, 656, 576); throws
// Error for a value outside the enum. The compile-time form, usable in device
// code, is cache_token_bytes() in dsmla/format.hpp.
int bytes_per_token(CacheFormat f);
std::string_view to_string(CacheFormat f);
std::string_view to_string(RoutingPolicy p);
std::string_view to_string(TokenPath p);
// Parse the names used in DESIGN and in case files; throws Error naming the text.
// Only the three names of to_string() are cache formats (vLLM's "auto" and
// "fp8_e4m3" are rejected: leave cache_format out of a case file to infer it).
CacheFormat parse_cache_format(std::string_view s);
RoutingPolicy parse_routing_policy(std::string_view s);

// Every workspace region (Plan::ws_*, the CUDA backend's own scratch) starts at
// a multiple of this many bytes.
inline constexpr std::size_t kWorkspaceAlignment = 256;
// `bytes` rounded up to a multiple of `alignment`.
constexpr std::size_t align_up(std::size_t bytes, std::size_t alignment = kWorkspaceAlignment) {
  return (bytes + alignment - 1) / alignment * alignment;
}

// Untrusted text (a metadata value, a JSON excerpt, a command-line word) as it
// may appear inside an error message: every byte outside printable ASCII and
// the backslash are escaped (\xNN, \n, \\), and the result is cut to about
// max_chars characters with "...(N bytes)" appended. Every message that quotes
// input uses this, so no message is cut at a NUL or floods the terminal.
std::string printable(std::string_view text, std::size_t max_chars = 80);

// The default softmax scale of DeepSeek-V3.2: 192^-0.5 * mscale^2, mscale = 0.1 ln 40 + 1.
double default_softmax_scale();

}  // namespace dsmla
