// Tests of core/sign_patches.h: every variant of the +-1 patches that this CPU runs (the masked
// AVX-512 writer for "avx512", the table for "avx2" and "generic"), as float32, bfloat16 and
// packed bits, against reference::SignPatches and reference::SignPatchesPacked on seeded random
// images, exactly (every output is +1, -1 or a bit). Ragged shapes: channels 1, 5, 64, 65, 130,
// widths past 64 (several plane words), odd kernels and strides (the strided plane reads),
// batches of 0 and 1, kernels as large as the image; rows written past the caches (streamed) on
// cache-line-aligned rows; every output slot is pre-filled so that a slot left unwritten shows.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "check.h"
#include "core/sign_patches.h"

namespace {

namespace core = bnn::core;
namespace sp = bnn::core::sign_patches;
using bnn_test::Case;
using core::Isa;

// A buffer of `count` Bits whose first element is on a 64-byte boundary.
template <typename Bits>
struct Aligned {
  std::vector<Bits> storage;
  Bits* data;
  explicit Aligned(int64_t count, Bits fill) : storage(count + 64, fill) {
    uintptr_t p = reinterpret_cast<uintptr_t>(storage.data());
    data = reinterpret_cast<Bits*>((p + 63) & ~uintptr_t{63});
  }
};

template <typename T>
void CheckPatches(bnn_test::Rng& rng, Isa isa, int64_t batch, int64_t h, int64_t w, int64_t c,
                  int64_t kh, int64_t kw, int64_t sh, int64_t sw, bool stream) {
  constexpr bool kPacked = std::is_same<T, int64_t>::value;
  using Bits = typename sp::Element<T>::Bits;
  const std::vector<int64_t> image = bnn_test::RandomBits(rng, batch * h * w, c);
  const sp::Geometry g = sp::MakeGeometry(batch, h, w, c, kh, kw, sh, sw, kPacked);
  const int64_t rows = kh * kw * c;
  const int64_t row_length = kPacked ? (g.columns + 63) / 64 : g.columns;  // in T
  std::vector<T> want(rows * row_length);
  if constexpr (kPacked)
    core::reference::SignPatchesPacked(image.data(), batch, h, w, c, kh, kw, sh, sw, want.data());
  else
    core::reference::SignPatches(image.data(), batch, h, w, c, kh, kw, sh, sw, want.data());
  Aligned<Bits> out(rows * g.row_values, static_cast<Bits>(0xA5A5A5A5u));
  if (g.columns > 0) {
    std::vector<uint64_t> planes(sp::PlaneWords(g), 0xDEADBEEFull);
    const uint64_t* in = reinterpret_cast<const uint64_t*>(image.data());
    bnn_test::Sharded(rng, g.batch * g.h, [&](int64_t first, int64_t last) {
      sp::ToPlanes(g, in, first, last, planes.data());
    });
    bnn_test::Sharded(rng, rows, [&](int64_t first, int64_t last) {
      sp::Rows<T>(isa, g, planes.data(), out.data, stream, first, last);
    });
  }
  std::vector<T> got(rows * row_length);
  if (!got.empty()) std::memcpy(got.data(), out.data, got.size() * sizeof(T));
  CHECK_SAME(got, want,
             Case("isa", core::kIsaNames[isa], "T",
                  kPacked ? "bits" : sizeof(T) == 2 ? "bfloat16" : "float32", "batch", batch,
                  "h", h, "w", w, "c", c, "kernel", std::to_string(kh) + "x" + std::to_string(kw),
                  "strides", std::to_string(sh) + "x" + std::to_string(sw), "stream", stream));
}

template <typename T>
void CheckAll(bnn_test::Rng& rng, Isa isa) {
  struct Shape {
    int64_t batch, h, w, c, kh, kw, sh, sw;
  };
  const Shape shapes[] = {
      {2, 5, 9, 70, 2, 3, 2, 3},  {1, 3, 3, 1, 3, 3, 1, 1},   {3, 12, 70, 130, 3, 3, 1, 1},
      {2, 7, 7, 64, 1, 1, 2, 2},  {0, 4, 4, 5, 3, 3, 1, 1},   {1, 1, 1, 1, 1, 1, 1, 1},
      {2, 9, 131, 65, 5, 2, 3, 5}, {4, 6, 6, 5, 6, 6, 1, 1},  {1, 20, 200, 3, 1, 7, 2, 1},
      {5, 8, 8, 33, 3, 3, 1, 2},
  };
  for (const Shape& s : shapes)
    CheckPatches<T>(rng, isa, s.batch, s.h, s.w, s.c, s.kh, s.kw, s.sh, s.sw, false);
  // streamed rows: batch * ho * wo values a multiple of 64 bytes per row, 16-byte stores
  CheckPatches<T>(rng, isa, 4, 10, 10, 70, 3, 3, 1, 1, !std::is_same<T, int64_t>::value);
  CheckPatches<T>(rng, isa, 16, 6, 6, 3, 3, 3, 1, 1, !std::is_same<T, int64_t>::value);
}

TEST(sign_patches_values_and_bits) {
  bnn_test::Rng rng(41);
  for (Isa isa : bnn_test::Variants(sp::CpuRuns)) {
    CheckAll<float>(rng, isa);
    CheckAll<core::bfloat16>(rng, isa);
    CheckAll<int64_t>(rng, isa);
  }
}

TEST(sign_patches_stream_choice) {
  alignas(64) static float buffer[32];
  CHECK(!sp::StreamWrites(sp::kStreamBytes - 1, 64, buffer), "small");
  CHECK(sp::StreamWrites(sp::kStreamBytes, 64, buffer), "large, aligned");
  CHECK(!sp::StreamWrites(sp::kStreamBytes, 60, buffer), "rows off the cache lines");
  CHECK(!sp::StreamWrites(sp::kStreamBytes, 64, buffer + 1), "start off a cache line");
}

}  // namespace
