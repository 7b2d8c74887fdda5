// Tests of core/adam.h: every variant of the one-pass Adam update that this CPU runs ("avx512"
// runs the AVX2 loop), float32 and bfloat16 gradients, with and without the clip, against
// reference::AdamUpdate on seeded random arrays, bit for bit: each element takes the same float32
// operations in the same order in every variant (no contraction into fused multiply-adds; vector
// division and square root round as the scalar ones), so the results must be identical. Sizes
// around the vector widths (0, 1, 7, 8, 9, 33, 1000) and the work cut into random ranges.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "check.h"
#include "core/adam.h"

namespace {

namespace core = bnn::core;
namespace ad = bnn::core::adam;
using bnn_test::Case;
using core::Isa;

template <typename T>
void CheckUpdate(bnn_test::Rng& rng, Isa isa, int64_t size, float clip, float scale) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> var(size), m(size), v(size), g(size);
  for (int64_t i = 0; i < size; ++i) {
    var[i] = normal(rng), m[i] = normal(rng) * scale, v[i] = std::fabs(normal(rng)) * scale;
    g[i] = i % 11 == 5 ? 0.0f : normal(rng) * scale;
  }
  std::vector<T> grad(size);
  for (int64_t i = 0; i < size; ++i) {
    if constexpr (std::is_same<T, float>::value) {
      grad[i] = g[i];
    } else {
      grad[i] = core::Narrow(g[i]);
    }
  }
  std::vector<float> want_var = var, want_m = m, want_v = v;
  const float alpha = 0.01f, keep1 = 1.0f - 0.9f, keep2 = 1.0f - 0.999f, epsilon = 1e-7f;
  core::reference::AdamUpdate(grad.data(), want_var.data(), want_m.data(), want_v.data(), size,
                              alpha, keep1, keep2, epsilon, clip);
  const ad::Range<T> range{grad.data(), m.data(), v.data(), var.data(), alpha, keep1, keep2,
                           epsilon,     clip};
  bnn_test::Sharded(rng, size, [&](int64_t first, int64_t last) {
    ad::Run(isa, range, first, last);
  });
  const std::string label = Case("isa", core::kIsaNames[isa], "T",
                                 sizeof(T) == 2 ? "bfloat16" : "float32", "size", size, "clip",
                                 clip, "scale", scale);
  CHECK_SAME(var, want_var, label << " var");
  CHECK_SAME(m, want_m, label << " m");
  CHECK_SAME(v, want_v, label << " v");
}

TEST(adam_update) {
  bnn_test::Rng rng(61);
  const float inf = std::numeric_limits<float>::infinity();
  for (Isa isa : bnn_test::Variants(ad::CpuRuns))
    for (int64_t size : {0, 1, 7, 8, 9, 33, 1000})
      for (float clip : {inf, 0.5f})
        for (float scale : {1.0f, 1e-4f, 1e4f}) {
          CheckUpdate<float>(rng, isa, size, clip, scale);
          CheckUpdate<core::bfloat16>(rng, isa, size, clip, scale);
        }
}

}  // namespace
