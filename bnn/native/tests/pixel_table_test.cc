// Tests of core/pixel_table.h: every variant of the first layer on 8-bit pixels that this CPU
// runs ("avx512" runs the AVX2 code), uint8 pixels and float pixels with their encoding, against
// reference::PixelTableSign on seeded random cases, exactly (integer products). Ragged sizes:
// pixel counts not multiples of 4, unit counts around 32 and 64, batches of 0, 1 and around the
// 8-example items; images with zero groups (the live-group path), with none (every group live),
// all-zero images, and the extremes (every pixel 255, every weight +1 or -1, more than 32 groups
// for the 16-bit rounds) with thresholds at the products themselves.
#include <cmath>
#include <cstdint>
#include <vector>

#include "check.h"
#include "core/pixel_table.h"

namespace {

namespace core = bnn::core;
namespace pt = bnn::core::pixel_table;
using bnn_test::Case;
using core::Isa;

enum Fill { kRandom, kSparse, kDense, kZero, kMax };
enum Weights { kRandomWeights, kAllPlus, kAllMinus };

// The table kernel of random +-1 weights (bits past n and pad units 0), as bnn.packed.runtime.table_kernel
// lays it out: byte [u / 32, g, u % 32] holds unit u's bits 4 g ... 4 g + 3.
std::vector<uint8_t> Table(bnn_test::Rng& rng, int64_t n, int64_t units, Weights weights) {
  const int64_t groups = (n + 3) / 4, blocks = 2 * ((units + 63) / 64);
  std::vector<uint8_t> table(blocks * groups * 32, 0);
  for (int64_t u = 0; u < units; ++u)
    for (int64_t i = 0; i < n; ++i) {
      const bool plus = weights == kAllPlus || (weights == kRandomWeights && (rng() & 1));
      if (plus) table[((u / 32) * groups + i / 4) * 32 + u % 32] |= 1 << (i % 4);
    }
  return table;
}

void CheckLayer(bnn_test::Rng& rng, Isa isa, int64_t batch, int64_t n, int64_t units, Fill fill,
                Weights weights, bool as_float) {
  const int64_t groups = (n + 3) / 4;
  std::vector<uint8_t> pixels(batch * n);
  for (int64_t i = 0; i < batch * n; ++i) {
    switch (fill) {
      case kRandom: pixels[i] = static_cast<uint8_t>(rng()); break;
      case kSparse: pixels[i] = rng() % 5 == 0 ? static_cast<uint8_t>(rng()) : 0; break;
      case kDense: pixels[i] = static_cast<uint8_t>(1 + rng() % 255); break;
      case kZero: pixels[i] = 0; break;
      case kMax: pixels[i] = 255; break;
    }
  }
  const std::vector<uint8_t> table = Table(rng, n, units, weights);
  // thresholds: some at example 0's products (computed here with the reference's rule)
  std::vector<int32_t> threshold(units);
  for (int64_t u = 0; u < units; ++u) {
    int32_t dot = 0;
    for (int64_t i = 0; batch && i < n; ++i) {
      const bool plus = (table[((u / 32) * groups + i / 4) * 32 + u % 32] >> (i % 4)) & 1;
      dot += plus ? pixels[i] : -pixels[i];
    }
    const int64_t pick = bnn_test::Uniform(rng, 0, 3);
    threshold[u] = pick == 0   ? dot
                   : pick == 1 ? dot + 1
                               : static_cast<int32_t>(bnn_test::Uniform(rng, -255 * n, 255 * n));
  }
  const int64_t out_words = (units + 63) / 64;
  const std::vector<int64_t> flip = bnn_test::RandomWords(rng, out_words);
  std::vector<int64_t> want(batch * out_words), got(batch * out_words, 9);
  core::reference::PixelTableSign(pixels.data(), batch, n, table.data(), units, threshold.data(),
                                  flip.data(), want.data());

  // the pixels as floats x = u * scale + offset, which the kernel encodes back to u
  const float scale = 1.0f / 127.5f, offset = -1.0f;
  std::vector<float> xs(batch * n);
  for (int64_t i = 0; i < batch * n; ++i) xs[i] = pixels[i] * scale + offset;
  for (int64_t i = 0; i < batch * n; ++i)
    if (core::reference::EncodePixel(xs[i], scale, offset) != pixels[i]) xs[i] = -2.0f;  // 0

  std::vector<uint8_t> tables(batch * groups * 32);
  std::vector<int32_t> totals(batch), live(batch * groups), counts(batch);
  bnn_test::Sharded(rng, batch, [&](int64_t first, int64_t last) {
    if (as_float)
      pt::PrepareExamples(isa, xs.data(), n, groups, scale, offset, first, last, tables.data(),
                          totals.data(), live.data(), counts.data());
    else
      pt::PrepareExamples(isa, pixels.data(), n, groups, 1.0f, 0.0f, first, last, tables.data(),
                          totals.data(), live.data(), counts.data());
  });
  const int64_t items = batch && units ? pt::SignItemCount(batch, units) : 0;
  bnn_test::Sharded(rng, items, [&](int64_t first, int64_t last) {
    pt::SignItems(isa, tables.data(), live.data(), counts.data(), totals.data(), batch,
                  table.data(), groups, units, threshold.data(), flip.data(), first, last,
                  got.data());
  });
  if (as_float) {  // the reference on the pixels the floats encode to
    for (int64_t i = 0; i < batch * n; ++i) pixels[i] = core::reference::EncodePixel(xs[i], scale, offset);
    core::reference::PixelTableSign(pixels.data(), batch, n, table.data(), units,
                                    threshold.data(), flip.data(), want.data());
  }
  CHECK_SAME(got, want,
             Case("isa", core::kIsaNames[isa], "batch", batch, "n", n, "units", units, "fill",
                  fill, "weights", weights, "float", as_float));
}

TEST(pixel_table_sign) {
  bnn_test::Rng rng(21);
  for (Isa isa : bnn_test::Variants(pt::CpuRuns)) {
    for (int64_t batch : {0, 1, 7, 8, 9, 20})
      for (int64_t n : {1, 3, 4, 5, 130, 784})
        for (int64_t units : {1, 31, 32, 33, 64, 65, 100})
          CheckLayer(rng, isa, batch, n, units, static_cast<Fill>((batch + n + units) % 4),
                     kRandomWeights, (batch + units) % 2 == 1);
    for (Weights weights : {kAllPlus, kAllMinus, kRandomWeights})
      for (bool as_float : {false, true}) {
        CheckLayer(rng, isa, 3, 784, 70, kMax, weights, as_float);
        CheckLayer(rng, isa, 4, 3072, 128, kMax, weights, as_float);
      }
    CheckLayer(rng, isa, 17, 784, 256, kSparse, kRandomWeights, false);
    CheckLayer(rng, isa, 17, 784, 256, kDense, kRandomWeights, true);
  }
}

TEST(pixel_table_encoding) {
  // the float encoding: round half to even, clipped to [0, 255]
  const float scale = 0.5f, offset = 1.0f;
  struct Expected {
    float x;
    uint32_t u;
  };
  const Expected cases[] = {{1.0f, 0},   {1.25f, 0},   {1.75f, 2},  {1.5f, 1},
                            {2.25f, 2},  {0.0f, 0},    {-5.0f, 0},  {128.5f, 255},
                            {1e9f, 255}, {128.0f, 254}, {2.75f, 4}};
  for (const Expected& e : cases) {
    CHECK_EQ(pt::Pixel(e.x, scale, offset), e.u, Case("x", e.x));
    CHECK_EQ(static_cast<uint32_t>(core::reference::EncodePixel(e.x, scale, offset)), e.u,
             Case("x", e.x));
  }
}

}  // namespace
