// Tests of core/sign_pack.h: every variant of the packing of signs that this CPU runs ("avx512"
// runs the AVX2 code), float32 and bfloat16, along the last axis and along the rows (plain and
// transposed), against reference::PackSigns on seeded random tensors, exactly. Values include
// -0.0 and +0.0 (both +1), NaN of either sign (-1), infinities and subnormals; shapes are ragged
// (lines of 1, 63, 64, 65, 131 values; 1, 63, 64, 65, 130 rows; more than 1024 columns, the
// chunk of a task); every output word is pre-filled so that a word left unwritten shows.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "check.h"
#include "core/sign_pack.h"

namespace {

namespace core = bnn::core;
namespace pk = bnn::core::sign_pack;
using bnn_test::Case;
using core::Isa;

float Special(bnn_test::Rng& rng) {
  const float specials[] = {-0.0f,
                            0.0f,
                            std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::denorm_min(),
                            -std::numeric_limits<float>::denorm_min(),
                            1e-30f,
                            -1e-30f};
  return specials[rng() % 10];
}

template <typename T>
T Value(float f);
template <>
float Value<float>(float f) { return f; }
template <>
core::bfloat16 Value<core::bfloat16>(float f) {  // truncated: keeps every sign, NaN and -0.0
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return core::bfloat16{static_cast<uint16_t>(bits >> 16)};
}

template <typename T>
void CheckPack(bnn_test::Rng& rng, Isa isa, int64_t outer, int64_t rows, int64_t cols,
               bool along_rows, bool transpose) {
  std::vector<T> x(outer * rows * cols);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (T& v : x) v = Value<T>(rng() % 4 == 0 ? Special(rng) : normal(rng));
  const int64_t words = ((along_rows ? rows : cols) + 63) / 64;
  const int64_t size = outer * (along_rows ? cols : rows) * words;
  std::vector<uint64_t> want(size), got(size, 0xFEEDFACECAFEBEEFull);
  core::reference::PackSigns(x.data(), outer, rows, cols, along_rows, transpose, want.data());
  // the op's layout: along the last axis, every line is one of `outer` lines (rows = 1)
  const pk::Layout l = along_rows ? pk::Layout{outer, rows, cols, true, transpose}
                                  : pk::Layout{outer * rows, 1, cols, false, false};
  const auto run = pk::Select<T>(isa);
  if (size > 0)
    bnn_test::Sharded(rng, pk::TaskCount(l), [&](int64_t first, int64_t last) {
      run(x.data(), l, first, last, got.data());
    });
  CHECK_SAME(got, want,
             Case("isa", core::kIsaNames[isa], "T", sizeof(T) == 2 ? "bfloat16" : "float32",
                  "outer", outer, "rows", rows, "cols", cols, "along_rows", along_rows,
                  "transpose", transpose));
}

template <typename T>
void CheckAll(bnn_test::Rng& rng, Isa isa) {
  for (int64_t outer : {1, 3})
    for (int64_t rows : {1, 2, 63, 64, 65, 130})
      for (int64_t cols : {1, 7, 63, 64, 65, 131}) {
        CheckPack<T>(rng, isa, outer, rows, cols, false, false);
        CheckPack<T>(rng, isa, outer, rows, cols, true, false);
        CheckPack<T>(rng, isa, outer, rows, cols, true, true);
      }
  for (bool transpose : {false, true}) {
    CheckPack<T>(rng, isa, 2, 70, 1100, true, transpose);  // two chunks of columns
    CheckPack<T>(rng, isa, 1, 200, 2048, true, transpose);
  }
  CheckPack<T>(rng, isa, 5, 3, 2048, false, false);
  CheckPack<T>(rng, isa, 0, 5, 5, false, false);
  CheckPack<T>(rng, isa, 0, 5, 5, true, true);
}

TEST(sign_pack) {
  bnn_test::Rng rng(51);
  for (Isa isa : bnn_test::Variants(pk::CpuRuns)) {
    CheckAll<float>(rng, isa);
    CheckAll<core::bfloat16>(rng, isa);
  }
}

}  // namespace
