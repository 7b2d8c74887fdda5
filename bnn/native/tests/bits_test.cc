// Tests of core/bits.h and core/bfloat16.h: the 64x64 bit transpose against bit-by-bit
// transposition, and the bfloat16 conversions against hand-worked values (round to nearest, ties
// to even; NaN to the quiet NaN of its sign), exactly.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "check.h"
#include "core/bfloat16.h"
#include "core/bits.h"

namespace {

using bnn::core::bfloat16;
using bnn_test::Case;

float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

TEST(bits_transpose64) {
  bnn_test::Rng rng(1);
  for (int trial = 0; trial < 200; ++trial) {
    uint64_t a[64], t[64];
    for (int i = 0; i < 64; ++i) a[i] = trial < 64 ? uint64_t{1} << trial : rng();
    if (trial % 7 == 3) a[rng() % 64] = ~uint64_t{0};
    std::memcpy(t, a, sizeof(a));
    bnn::core::Transpose64(t);
    int64_t wrong = 0;
    for (int i = 0; i < 64; ++i)
      for (int j = 0; j < 64; ++j) wrong += ((a[i] >> j) & 1) != ((t[j] >> i) & 1);
    CHECK_EQ(wrong, 0, Case("trial", trial));
  }
}

TEST(bits_helpers) {
  CHECK_EQ(bnn::core::WordsFor(0), 0, "");
  CHECK_EQ(bnn::core::WordsFor(1), 1, "");
  CHECK_EQ(bnn::core::WordsFor(64), 1, "");
  CHECK_EQ(bnn::core::WordsFor(65), 2, "");
  bnn_test::Rng rng(2);
  for (int trial = 0; trial < 1000; ++trial) {
    const uint64_t v = rng() & rng();
    CHECK_EQ(bnn::core::Popcount(v), __builtin_popcountll(v), Case("v", v));
  }
  uint64_t words[3] = {0, 0, 0};
  for (int64_t i : {0, 63, 64, 130}) bnn::core::SetBit(words, i);
  CHECK_EQ(words[0], 0x8000000000000001ULL, "");
  CHECK_EQ(words[1], 1ULL, "");
  CHECK_EQ(words[2], 4ULL, "");
  CHECK(bnn::core::GetBit(words, 130) && !bnn::core::GetBit(words, 129), "");
}

TEST(bfloat16_conversions) {
  struct Expected {
    uint32_t f;
    uint16_t bf;
  };
  const Expected cases[] = {
      {0x3F800000u, 0x3F80},  // 1.0
      {0x80000000u, 0x8000},  // -0.0
      {0x00000000u, 0x0000},  // +0.0
      {0x3F808000u, 0x3F80},  // a tie: to the even 0x3F80
      {0x3F818000u, 0x3F82},  // a tie: to the even 0x3F82
      {0x3F808001u, 0x3F81},  // above the tie
      {0x3F807FFFu, 0x3F80},  // below the tie
      {0x7F7FFFFFu, 0x7F80},  // the largest float rounds to infinity
      {0x7F800000u, 0x7F80},  // +inf
      {0xFF800000u, 0xFF80},  // -inf
      {0x7FC00001u, 0x7FC0},  // NaN
      {0x7F800001u, 0x7FC0},  // signalling NaN: quieted
      {0xFFC12345u, 0xFFC0},  // negative NaN
      {0x00000001u, 0x0000},  // the smallest subnormal
      {0x44FA2000u, 0x44FA},  // 2001 -> 2000 (bfloat16 steps of 8 there)
      {0x44FA8000u, 0x44FA},  // 2004, a tie -> 2000 (even)
      {0x44FB8000u, 0x44FC},  // 2012, a tie -> 2016 (even)
      {0xC4FA6000u, 0xC4FA},  // -2003 -> -2000 (below the tie)
  };
  for (const Expected& e : cases) {
    CHECK_EQ(bnn::core::Narrow(FromBits(e.f)).bits, e.bf, Case("float bits", e.f));
    CHECK_EQ(bnn::core::FromFloat<bfloat16>(FromBits(e.f)).bits, e.bf, Case("float bits", e.f));
  }
  for (uint32_t bits = 0; bits < 0x10000u; bits += 7) {
    const float wide = bnn::core::Widen(bfloat16{static_cast<uint16_t>(bits)});
    uint32_t back;
    std::memcpy(&back, &wide, sizeof(back));
    CHECK_EQ(back, bits << 16, Case("bits", bits));
    if (!std::isnan(wide))  // every bfloat16 value narrows back to itself
      CHECK_EQ(bnn::core::Narrow(wide).bits, bits, Case("bits", bits));
  }
}

}  // namespace
