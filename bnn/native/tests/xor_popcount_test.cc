// Tests of core/xor_popcount.h: every variant of the xor-popcount product (mismatch counts, packed
// signs, affine logits), of the threshold packing and of the packed convolution that this CPU
// runs, against the reference kernels on seeded random cases, with the work split into random
// ranges as a thread pool splits it. Ragged sizes throughout: bit counts that are not multiples
// of 64, unit counts around the tile widths (4, 8, 32, 64), batches of 0 and 1 and around the
// 6- and 3-row tiles and the 36-row items, more than 31 words (the AVX2 byte-count blocks),
// thresholds at the dot products themselves. All results are integers or exact conversions of
// them, so every comparison is exact (the affine logits: one double multiply-add rounded once,
// the same expression in every variant; the bfloat16 convolution: the same rounding of the same
// float).
#include <cstdint>
#include <vector>

#include "check.h"
#include "core/xor_popcount.h"

namespace {

namespace core = bnn::core;
namespace xp = bnn::core::xor_popcount;
using bnn_test::Case;
using core::Isa;

// Thresholds for units whose dot products with row 0 of x are `dots`: random near n's scale,
// with every third at a dot product itself and some one above it (the edges of >=).
std::vector<int32_t> Thresholds(bnn_test::Rng& rng, const std::vector<int32_t>& dots,
                                int64_t units, int64_t n) {
  std::vector<int32_t> t(units);
  for (int64_t u = 0; u < units; ++u) {
    const int64_t pick = bnn_test::Uniform(rng, 0, 5);
    if (!dots.empty() && pick <= 1)
      t[u] = dots[u] + static_cast<int32_t>(pick);  // at the edge, or just above it
    else
      t[u] = static_cast<int32_t>(bnn_test::Uniform(rng, -n - 2, n + 2));
  }
  return t;
}

void CheckProduct(bnn_test::Rng& rng, Isa isa, int64_t batch, int64_t n, int64_t units) {
  const int64_t words = (n + 63) / 64;
  const std::vector<int64_t> x = bnn_test::RandomBits(rng, batch, n);
  // w (words, units): unit u's bits in column u, pad bits past n clear
  const std::vector<int64_t> wt = bnn_test::RandomBits(rng, units, n);
  std::vector<int64_t> w(words * units);
  for (int64_t u = 0; u < units; ++u)
    for (int64_t k = 0; k < words; ++k) w[k * units + u] = wt[u * words + k];
  const std::string label = Case("isa", core::kIsaNames[isa], "batch", batch, "n", n, "units", units);

  std::vector<int32_t> expected(batch * units);
  core::reference::XorPopcount(x.data(), w.data(), batch, words, units, expected.data());
  const xp::Rows rows_in(x.data(), batch, words, isa);
  const int64_t items = batch && units ? xp::ProductItemCount(batch, units) : 0;

  // counts
  std::vector<int32_t> counts(batch * units, -7);
  xp::Epilogue e;
  e.mode = xp::kCounts;
  e.out = counts.data();
  bnn_test::Sharded(rng, items, [&](int64_t first, int64_t last) {
    xp::ProductItems(isa, rows_in, w.data(), batch, units, e, first, last);
  });
  CHECK_SAME(counts, expected, label << " counts");

  // packed signs
  const int64_t out_words = (units + 63) / 64;
  std::vector<int32_t> dots0;
  for (int64_t u = 0; batch && u < units; ++u) dots0.push_back(static_cast<int32_t>(n - 2 * expected[u]));
  const std::vector<int32_t> threshold = Thresholds(rng, dots0, units, n);
  const std::vector<int64_t> flip = bnn_test::RandomWords(rng, out_words);
  std::vector<int64_t> signs(batch * out_words, 0x5555), want_signs(batch * out_words);
  core::reference::XorPopcountSign(x.data(), w.data(), batch, words, units, n, threshold.data(),
                                   flip.data(), want_signs.data());
  e = xp::Epilogue();
  e.mode = xp::kSign;
  e.n = n;
  e.threshold = threshold.data();
  e.flip = flip.data();
  e.out = signs.data();
  bnn_test::Sharded(rng, items, [&](int64_t first, int64_t last) {
    xp::ProductItems(isa, rows_in, w.data(), batch, units, e, first, last);
  });
  CHECK_SAME(signs, want_signs, label << " signs");

  // affine logits
  std::vector<float> scale(units), shift(units);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t u = 0; u < units; ++u) scale[u] = normal(rng), shift[u] = normal(rng);
  std::vector<float> logits(batch * units, -1.0f), want_logits(batch * units);
  core::reference::XorPopcountAffine(x.data(), w.data(), batch, words, units, n, scale.data(),
                                     shift.data(), want_logits.data());
  e = xp::Epilogue();
  e.mode = xp::kAffine;
  e.n = n;
  e.scale = scale.data();
  e.shift = shift.data();
  e.out = logits.data();
  bnn_test::Sharded(rng, items, [&](int64_t first, int64_t last) {
    xp::ProductItems(isa, rows_in, w.data(), batch, units, e, first, last);
  });
  CHECK_SAME(logits, want_logits, label << " logits");
}

TEST(xor_popcount_product) {
  bnn_test::Rng rng(11);
  for (Isa isa : bnn_test::Variants(xp::CpuRuns)) {
    for (int64_t batch : {0, 1, 2, 5, 6, 7, 37, 73})
      for (int64_t n : {1, 63, 64, 65, 130, 2100})
        for (int64_t units : {1, 3, 4, 5, 8, 9, 31, 33, 64, 70, 130})
          CheckProduct(rng, isa, batch, n, units);
    CheckProduct(rng, isa, 36, 1000, 257);   // whole items
    CheckProduct(rng, isa, 100, 2048, 200);  // a layer's size
  }
}

TEST(xor_popcount_threshold_pack) {
  bnn_test::Rng rng(12);
  for (Isa isa : bnn_test::Variants(xp::CpuRuns))
    for (int64_t batch : {0, 1, 3, 17})
      for (int64_t units : {1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 70, 200}) {
        std::vector<int32_t> a(batch * units);
        for (int32_t& v : a) v = static_cast<int32_t>(bnn_test::Uniform(rng, -40, 40));
        std::vector<int32_t> row0(a.begin(), a.begin() + (batch ? units : 0));
        const std::vector<int32_t> threshold = Thresholds(rng, row0, units, 40);
        const int64_t out_words = (units + 63) / 64;
        const std::vector<int64_t> flip = bnn_test::RandomWords(rng, out_words);
        std::vector<int64_t> got(batch * out_words, 3), want(batch * out_words);
        core::reference::ThresholdPack(a.data(), batch, units, threshold.data(), flip.data(),
                                       want.data());
        bnn_test::Sharded(rng, batch, [&](int64_t first, int64_t last) {
          xp::ThresholdPackRows(isa, a.data(), units, threshold.data(), flip.data(), first, last,
                                got.data());
        });
        CHECK_SAME(got, want, Case("isa", core::kIsaNames[isa], "batch", batch, "units", units));
        // the other scales PackWord takes: 2 a + offset (pixel layer) and offset - 2 a (products)
        if (batch == 0) continue;
        for (int32_t scale : {2, -2}) {
          const int64_t width = std::min<int64_t>(64, units);
          const int32_t offset = static_cast<int32_t>(bnn_test::Uniform(rng, -50, 50));
          uint64_t want_word = 0;
          for (int64_t u = 0; u < width; ++u)
            if (scale * a[u] + offset >= threshold[u]) want_word |= uint64_t{1} << u;
          CHECK_EQ(xp::PackWord(isa, a.data(), threshold.data(), width, scale, offset, flip[0]),
                   static_cast<int64_t>(want_word) ^ flip[0],
                   Case("isa", core::kIsaNames[isa], "scale", scale, "width", width));
        }
      }
}

template <typename T>
void CheckConv(bnn_test::Rng& rng, Isa isa, int64_t batch, int64_t h, int64_t wd, int64_t c,
               int64_t units, int64_t kh, int64_t kw, int64_t sh, int64_t sw) {
  const int64_t words = (c + 63) / 64;
  const std::vector<int64_t> x = bnn_test::RandomBits(rng, batch * h * wd, c);
  const std::vector<int64_t> w = bnn_test::RandomWords(rng, kh * kw * words * units);
  const int64_t n = kh * kw * c;
  const int64_t ho = h >= kh ? (h - kh) / sh + 1 : 0, wo = wd >= kw ? (wd - kw) / sw + 1 : 0;
  std::vector<T> got(batch * ho * wo * units, core::FromFloat<T>(-99.0f));
  std::vector<T> want(got.size());
  core::reference::XorPopcountConv2d(x.data(), w.data(), batch, h, wd, words, kh, kw, sh, sw,
                                     units, n, want.data());
  const xp::ConvGeometry g{batch, h, wd, words, kh, kw, sh, sw, ho, wo, units, n};
  const int64_t items = g.positions() && units ? xp::ConvItemCount(g) : 0;
  bnn_test::Sharded(rng, items, [&](int64_t first, int64_t last) {
    xp::Conv2dItems(isa, g, x.data(), w.data(), got.data(), first, last);
  });
  CHECK_SAME(got, want,
             Case("isa", core::kIsaNames[isa], "T", sizeof(T) == 2 ? "bfloat16" : "float32",
                  "batch", batch, "h", h, "w", wd, "c", c, "units", units, "kernel",
                  std::to_string(kh) + "x" + std::to_string(kw), "strides",
                  std::to_string(sh) + "x" + std::to_string(sw)));
}

TEST(xor_popcount_conv2d) {
  bnn_test::Rng rng(13);
  struct Shape {
    int64_t batch, h, w, c, units, kh, kw, sh, sw;
  };
  const Shape shapes[] = {
      {2, 5, 7, 70, 9, 2, 3, 1, 2},   {1, 8, 8, 64, 64, 3, 3, 1, 1},
      {3, 9, 6, 130, 33, 3, 2, 2, 3}, {0, 4, 4, 5, 8, 3, 3, 1, 1},
      {2, 2, 2, 5, 8, 3, 3, 1, 1},    {1, 1, 1, 1, 1, 1, 1, 1, 1},
      {5, 7, 9, 200, 65, 1, 5, 3, 1}, {4, 10, 10, 128, 130, 3, 3, 1, 1},
      {1, 12, 5, 1, 7, 5, 5, 4, 2},   {9, 6, 6, 2000, 20, 3, 3, 2, 2},  // n = 18000
  };
  for (Isa isa : bnn_test::Variants(xp::CpuRuns))
    for (const Shape& s : shapes) {
      CheckConv<float>(rng, isa, s.batch, s.h, s.w, s.c, s.units, s.kh, s.kw, s.sh, s.sw);
      CheckConv<core::bfloat16>(rng, isa, s.batch, s.h, s.w, s.c, s.units, s.kh, s.kw, s.sh,
                                s.sw);
    }
}

}  // namespace
