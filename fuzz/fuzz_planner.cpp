// libFuzzer target: plan() on batch metadata decoded from raw bytes, then the
// top-k index checks and conversion, the plan's JSON and the CPU backend's
// plan-time limits. dsmla::Error is a clean rejection.
//
// Input layout (little-endian; missing bytes read as 0):
//   u8 num_heads selector (H = 16 * (1 + v % 8)), u8 cache format (v % 3),
//   u8 policy (v % 3), u8 decode_threshold, i32 topk, i32 block_size,
//   i32 max_blocks_per_request, i32 num_tokens, i64 num_cache_blocks,
//   then four arrays, each a u16 count followed by its values:
//   query_start_loc (i32), seq_lens (i32), block_table (i32), slot_mapping (i64);
//   the remaining bytes are top-k indices (i32), used when they fill [T, topk].
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "dsmla/attention.hpp"
#include "dsmla/plan.hpp"

namespace {

class Reader {
 public:
  Reader(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  template <class T>
  T get() {
    T v{};
    std::uint8_t buf[sizeof(T)] = {};
    for (std::size_t i = 0; i < sizeof(T) && pos_ < size_; ++i) buf[i] = data_[pos_++];
    std::memcpy(&v, buf, sizeof(T));
    return v;
  }
  template <class T>
  std::vector<T> array() {
    const std::size_t n = get<std::uint16_t>();
    std::vector<T> v;
    v.reserve(n);
    for (std::size_t i = 0; i < n; ++i) v.push_back(get<T>());
    return v;
  }
  std::vector<std::int32_t> rest() {
    std::vector<std::int32_t> v;
    while (pos_ < size_) v.push_back(get<std::int32_t>());
    return v;
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_, pos_ = 0;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dsmla;
  Reader in(data, size);
  PlanOptions o;
  o.num_heads = 16 * (1 + in.get<std::uint8_t>() % 8);
  o.cache_format = static_cast<CacheFormat>(in.get<std::uint8_t>() % 3);
  o.policy = static_cast<RoutingPolicy>(in.get<std::uint8_t>() % 3);
  o.decode_threshold = in.get<std::uint8_t>();
  o.topk = in.get<std::int32_t>();
  BatchDesc b;
  b.block_size = in.get<std::int32_t>();
  b.max_blocks_per_request = in.get<std::int32_t>();
  b.num_tokens = in.get<std::int32_t>();
  b.num_cache_blocks = in.get<std::int64_t>();
  const auto qsl = in.array<std::int32_t>();
  const auto seq_lens = in.array<std::int32_t>();
  const auto block_table = in.array<std::int32_t>();
  const auto slots = in.array<std::int64_t>();
  const auto topk = in.rest();
  b.query_start_loc = qsl;
  b.seq_lens = seq_lens;
  b.block_table = block_table;
  b.slot_mapping = slots;

  try {
    const Plan plan = make_plan(b, o);
    (void)plan.to_json();
    Attention att(BackendKind::cpu, o, CpuPrecision::float32, 1);
    att.plan(b);
    (void)att.workspace_bytes();
    const std::size_t cells = static_cast<std::size_t>(plan.num_tokens) * static_cast<std::size_t>(o.topk);
    if (plan.num_sparse_tokens() > 0 && topk.size() >= cells) {
      const std::span<const std::int32_t> indices(topk.data(), cells);
      validate_topk_indices(plan, b, indices);
      (void)convert_topk_to_slots(plan, b, indices);
    }
  } catch (const Error&) {
  }
  return 0;
}
