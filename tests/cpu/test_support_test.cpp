// The shared test helpers must be able to fail: guard bytes and poisoning.
// (The comparison itself, dsmla::compare_outputs, is tested in tests/api.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "dsmla/format.hpp"
#include "support/test_support.hpp"

namespace dsmla {
namespace {

TEST(GuardedBuffer, DetectsWritesOutsideTheArray) {
  test::GuardedBuffer<float> buffer(10);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(buffer.data()) % 64, 0u);
  for (float& x : buffer.span()) x = 1.0f;
  EXPECT_TRUE(buffer.guards_intact());
  buffer.data()[10] = 2.0f;  // one past the end, inside the guard
  EXPECT_FALSE(buffer.guards_intact());
  EXPECT_EQ(buffer.damaged_guard_bytes(), 4u);  // every byte of the float differs from 0xa5

  test::GuardedBuffer<std::uint16_t> before(4);
  before.data()[-1] = 0;
  EXPECT_FALSE(before.guards_intact());
}

TEST(Poison, RowsStillPoisonedAreReported) {
  std::vector<std::uint16_t> rows(4 * 8, 0);
  test::poison_bf16(std::span(rows).subspan(8 * 2 + 3, 1));
  EXPECT_TRUE(std::isnan(bf16_to_float(test::kPoisonBf16)));
  EXPECT_EQ(test::poisoned_rows(rows, 8), std::vector<std::size_t>{2});
}

// An output the run never wrote (still poisoned) fails any comparison.
TEST(Poison, PoisonedValuesNeverCompareEqual) {
  std::vector<std::uint16_t> out(2 * kVHeadDim, float_to_bf16(1.0f)), poisoned = out;
  std::vector<float> lse(2, 1.0f), poisoned_lse = lse;
  test::poison_bf16(std::span(poisoned).subspan(kVHeadDim + 4, 1));
  const Tolerance anything{.rtol = 1e30, .atol = 1e30};
  EXPECT_FALSE(compare_outputs(out, lse, poisoned, lse, anything, 2).ok());
  test::poison_float(poisoned_lse);
  EXPECT_FALSE(compare_outputs(out, lse, out, poisoned_lse, anything, 2).ok());
}

TEST(CacheVariants, CoverDesignScales) {
  ASSERT_EQ(test::cache_variants().size(), 4u);
  EXPECT_EQ(test::cache_variants()[3].name(), "fp8_q2_k3");
}

}  // namespace
}  // namespace dsmla
