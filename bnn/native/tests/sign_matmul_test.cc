// Tests of core/sign_matmul.h: every variant of the sign-bit matrix product that this CPU runs
// ("avx512" runs the AVX2 code), in every layout (signs packed along q or along m, f stored
// (q, p) or (p, q), output (m, p) or (p, m)) and every split of the work (thread counts 1, 2, 3
// and 8 give by-block parts written in place or into a buffer, and by-byte-group parts whose
// partial products are summed), against reference::SignMatmul on seeded random cases.
//
// Tolerance: with f of small integers every table entry and partial sum is an exact float32, so
// the product must equal the reference exactly. With f of random reals the kernel adds in
// another order than the reference (which sums in double and rounds once), so each value must be
// within (q / 8 + 16) * 2^-23 * sum_k |f[k, c]| of it: a table entry is at most 4 roundings deep,
// a row of lookups q / 8 more, the partial products one per part. The generic and AVX2 variants
// run the same float32 additions in the same order, so they must equal each other bit for bit.
#include <cmath>
#include <cstdint>
#include <vector>

#include "check.h"
#include "core/sign_matmul.h"

namespace {

namespace core = bnn::core;
namespace sm = bnn::core::sign_matmul;
using bnn_test::Case;
using core::Isa;

// The kernel's product of the given problem as the TensorFlow op runs it, with the work split as
// for `threads` threads and each parallel loop cut into random ranges.
std::vector<float> Run(bnn_test::Rng& rng, Isa isa, const std::vector<int64_t>& signs,
                       bool along_m, const std::vector<float>& f, bool f_transposed, int64_t m,
                       int64_t q, int64_t p, bool transpose_output, int64_t threads) {
  std::vector<float> result(m * p, -5.0f);
  if (m == 0 || p == 0) return result;
  if (q == 0) return std::vector<float>(m * p, 0.0f);
  sm::Problem pr;
  pr.f = f.data();
  pr.f_transposed = f_transposed;
  pr.q = q, pr.p = p, pr.m = m;
  const int64_t q_words = (q + 63) / 64;
  pr.bytes = 8 * q_words;
  const uint64_t* words = reinterpret_cast<const uint64_t*>(signs.data());
  std::vector<uint64_t> turned;
  if (along_m) {
    const int64_t m_words = (m + 63) / 64;
    turned.assign(m_words * 64 * q_words, 0x1234);
    bnn_test::Sharded(rng, m_words, [&](int64_t first, int64_t last) {
      sm::TurnSigns(words, q, first, last, turned.data());
    });
    words = turned.data();
  }
  pr.patterns = reinterpret_cast<const uint8_t*>(words);
  const sm::Plan plan = sm::PlanFor(pr, threads, transpose_output);
  std::vector<float> partial_buffer;
  float* partial = result.data();
  if (!plan.direct) {
    partial_buffer.assign(plan.partials() * m * plan.stride, -3.0f);
    partial = partial_buffer.data();
  }
  std::vector<float> tables(plan.parts * sm::kPartTables);
  const sm::BlocksFn run = sm::Select(isa);
  bnn_test::Sharded(rng, plan.parts, [&](int64_t first, int64_t last) {
    sm::RunParts(run, pr, plan, partial, tables.data(), first, last);
  });
  if (!plan.direct) {
    bnn_test::Sharded(rng, (m + sm::kSumRows - 1) / sm::kSumRows, [&](int64_t first, int64_t last) {
      sm::SumPartials(pr, plan, partial, transpose_output, result.data(), first, last);
    });
  }
  return result;
}

void CheckProduct(bnn_test::Rng& rng, int64_t m, int64_t q, int64_t p, bool integers) {
  // s (m, q) as bits packed along q and along m; f (q, p) and its transpose (p, q)
  const std::vector<int64_t> along_q = bnn_test::RandomBits(rng, m, q);
  const int64_t q_words = (q + 63) / 64, m_words = (m + 63) / 64;
  std::vector<int64_t> along_m(m_words * q, 0);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t k = 0; k < q; ++k)
      if (core::GetBit(along_q.data() + r * q_words, k))
        along_m[(r / 64) * q + k] |= int64_t{1} << (r % 64);
  std::vector<float> f(q * p), ft(q * p);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : f) v = integers ? static_cast<float>(bnn_test::Uniform(rng, -8, 8)) : normal(rng);
  for (int64_t k = 0; k < q; ++k)
    for (int64_t c = 0; c < p; ++c) ft[c * q + k] = f[k * p + c];
  std::vector<double> magnitude(p, 0.0);  // sum_k |f[k, c]|
  for (int64_t k = 0; k < q; ++k)
    for (int64_t c = 0; c < p; ++c) magnitude[c] += std::fabs(f[k * p + c]);

  for (bool signs_along_m : {false, true})
    for (bool f_transposed : {false, true})
      for (bool transpose_output : {false, true}) {
        const std::vector<int64_t>& signs = signs_along_m ? along_m : along_q;
        const std::vector<float>& operand = f_transposed ? ft : f;
        std::vector<float> want(m * p);
        core::reference::SignMatmul(signs.data(), signs_along_m, operand.data(), f_transposed,
                                    m, q, p, transpose_output, want.data());
        for (int64_t threads : {1, 2, 3, 8}) {
          std::vector<float> first_variant;
          for (Isa isa : bnn_test::Variants(sm::CpuRuns)) {
            const std::vector<float> got = Run(rng, isa, signs, signs_along_m, operand,
                                               f_transposed, m, q, p, transpose_output, threads);
            const std::string label =
                Case("isa", core::kIsaNames[isa], "m", m, "q", q, "p", p, "along_m",
                     signs_along_m, "f_transposed", f_transposed, "transpose_output",
                     transpose_output, "threads", threads, "integers", integers);
            if (integers) {
              CHECK_SAME(got, want, label);
            } else {
              int64_t outside = 0;
              for (int64_t r = 0; r < m; ++r)
                for (int64_t c = 0; c < p; ++c) {
                  const int64_t i = transpose_output ? c * m + r : r * p + c;
                  const double tolerance =
                      (q / 8.0 + 16.0) * std::ldexp(1.0, -23) * magnitude[c];
                  outside += !(std::fabs(double{got[i]} - double{want[i]}) <= tolerance);
                }
              CHECK_EQ(outside, 0, label);
            }
            if (first_variant.empty())
              first_variant = got;
            else
              CHECK_SAME(got, first_variant, label << " (against the first variant)");
          }
        }
      }
}

TEST(sign_matmul_product) {
  bnn_test::Rng rng(31);
  struct Shape {
    int64_t m, q, p;
  };
  const Shape shapes[] = {{1, 1, 1},     {70, 75, 45}, {5, 130, 33},  {64, 64, 64},
                          {3, 1000, 20}, {130, 9, 300}, {2, 17, 2048}, {0, 5, 5},
                          {5, 0, 5},     {5, 5, 0},    {65, 257, 31}, {9, 8, 32}};
  for (const Shape& s : shapes)
    for (bool integers : {true, false}) CheckProduct(rng, s.m, s.q, s.p, integers);
}

}  // namespace
