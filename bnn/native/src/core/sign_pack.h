// Sign bits of a float32 or bfloat16 tensor packed into int64 words, for the operands of bnn's
// native training products; beside their plain reference kernel (reference::PackSigns) and with
// the Select function that maps an Isa to a variant.
//
//   x (..., n) -> (..., ceil(n / 64)) along the last axis; x (..., r, c) -> (..., ceil(r / 64), c)
//   along the rows, or (..., c, ceil(r / 64)) transposed. Bit t % 64 of word t / 64 is set where
//   element t of its line is >= 0 (so -0 counts as +1, NaN as -1) and pad bits past n (or r) are
//   clear: bnn.ops.bitpack's layout.
//
// The sign bits of 8 values come from one vector comparison and its mask (kAvx2, and kAvx512,
// which runs the same code), or from scalar comparisons (kGeneric). Packing along the rows takes
// tiles of 64 rows by 64 columns: each row's 64 bits, then one 64x64 bit transpose turns them
// into each column's 64 bits; the rows are read in order, 16 tiles at a time. One pass over x
// either way: a 2048x2048 float32 kernel packed along its rows took 0.53 ms on a 2-core Zen 4,
// XLA's equivalent (shifts and sums of 32-bit lanes) 1.17 ms.
#ifndef BNN_NATIVE_CORE_SIGN_PACK_H_
#define BNN_NATIVE_CORE_SIGN_PACK_H_

#include <algorithm>
#include <cstdint>

#include "core/bfloat16.h"
#include "core/bits.h"
#include "core/cpu.h"

namespace bnn {
namespace core {
namespace reference {

// The signs of x (outer, rows, cols), T float or bfloat16, bit set where x >= 0. Along the last
// axis (along_rows false): out (outer, rows, ceil(cols / 64)), bit c of line (o, r) for
// x[o, r, c]. Along the rows: out (outer, ceil(rows / 64), cols), bit r of column (o, c) for
// x[o, r, c]; with transpose_output, out (outer, cols, ceil(rows / 64)).
template <typename T>
void PackSigns(const T* x, int64_t outer, int64_t rows, int64_t cols, bool along_rows,
               bool transpose_output, uint64_t* out) {
  const int64_t words = WordsFor(along_rows ? rows : cols);
  for (int64_t t = 0; t < outer * (along_rows ? cols : rows) * words; ++t) out[t] = 0;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        if (!(Widen(x[(o * rows + r) * cols + c]) >= 0.0f)) continue;
        if (!along_rows)
          SetBit(out + (o * rows + r) * words, c);
        else if (transpose_output)
          SetBit(out + (o * cols + c) * words, r);
        else
          out[(o * words + r / 64) * cols + c] |= uint64_t{1} << (r % 64);
      }
}

}  // namespace reference

namespace sign_pack {

// Bits of values[0 ... n) (n <= 64), bit t set where values[t] >= 0.
template <typename T>
inline uint64_t BitsGeneric(const T* values, int64_t n) {
  uint64_t bits = 0;
  for (int64_t t = 0; t < n; ++t) bits |= uint64_t{Widen(values[t]) >= 0.0f} << t;
  return bits;
}

#ifdef BNN_X86
__attribute__((target("avx2"))) inline __m256 Eight(const float* p) { return _mm256_loadu_ps(p); }

__attribute__((target("avx2"))) inline __m256 Eight(const bfloat16* p) {
  const __m128i halves = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(halves), 16));
}

template <typename T>
__attribute__((target("avx2"))) inline uint64_t BitsAvx2(const T* values, int64_t n) {
  if (n < 64) return BitsGeneric(values, n);
  const __m256 zero = _mm256_setzero_ps();
  uint64_t bits = 0;
  for (int e = 0; e < 8; ++e) {
    const __m256 ge = _mm256_cmp_ps(Eight(values + 8 * e), zero, _CMP_GE_OQ);
    bits |= static_cast<uint64_t>(static_cast<uint32_t>(_mm256_movemask_ps(ge))) << (8 * e);
  }
  return bits;
}
#endif

struct Layout {
  int64_t outer, rows, cols;  // x as (outer, rows, cols); packing along the last axis: rows = 1
  bool along_rows, transpose;
};

constexpr int64_t kChunkTiles = 16;  // column tiles per task along the rows: 1024 columns

// Words [first, last) of the output in units of whole tasks: along the last axis, one task per
// line (outer * rows of them, each of cols values); along the rows, one per band of 64 rows and
// chunk of up to kChunkTiles tiles of 64 columns. A band's rows are read one after the other,
// each along its chunk (a tile at a time, 64 rows apart, outruns the CPU's prefetchers), into
// the chunk's tiles of row words, and each tile is then transposed into its columns' words.
template <typename T, uint64_t (*Bits)(const T*, int64_t)>
inline __attribute__((always_inline)) void Pack(const T* x, const Layout& l, int64_t first,
                                                int64_t last, uint64_t* out) {
  const int64_t words = ((l.along_rows ? l.rows : l.cols) + 63) >> 6;
  if (!l.along_rows) {
    for (int64_t line = first; line < last; ++line)
      for (int64_t k = 0; k < words; ++k)
        out[line * words + k] = Bits(x + line * l.cols + 64 * k,
                                     std::min<int64_t>(64, l.cols - 64 * k));
    return;
  }
  const int64_t col_tiles = (l.cols + 63) >> 6;
  const int64_t chunks = (col_tiles + kChunkTiles - 1) / kChunkTiles;
  uint64_t tiles[kChunkTiles][64];
  for (int64_t task = first; task < last; ++task) {
    const int64_t o = task / (words * chunks), k = task / chunks % words;
    const int64_t t0 = kChunkTiles * (task % chunks);
    const int64_t count = std::min(kChunkTiles, col_tiles - t0);
    const int64_t height = std::min<int64_t>(64, l.rows - 64 * k);
    const T* base = x + (o * l.rows + 64 * k) * l.cols + 64 * t0;
    for (int64_t i = 0; i < height; ++i) {
      const T* row = base + i * l.cols;
      for (int64_t t = 0; t < count; ++t)
        tiles[t][i] = Bits(row + 64 * t, std::min<int64_t>(64, l.cols - 64 * (t0 + t)));
    }
    for (int64_t t = 0; t < count; ++t) {
      uint64_t* tile = tiles[t];
      std::fill(tile + height, tile + 64, 0);
      Transpose64(tile);  // tile[j]: column c0 + j's bits along rows 64k ... 64k + 63
      const int64_t c0 = 64 * (t0 + t), width = std::min<int64_t>(64, l.cols - c0);
      for (int64_t j = 0; j < width; ++j) {
        if (l.transpose)
          out[(o * l.cols + c0 + j) * words + k] = tile[j];
        else
          out[(o * words + k) * l.cols + c0 + j] = tile[j];
      }
    }
  }
}

// Pack for any CPU. Reference: reference::PackSigns.
template <typename T>
void PackGeneric(const T* x, const Layout& l, int64_t first, int64_t last, uint64_t* out) {
  Pack<T, BitsGeneric<T>>(x, l, first, last, out);
}

#ifdef BNN_X86
// Pack with the AVX2 comparisons. Reference: reference::PackSigns.
template <typename T>
__attribute__((target("avx2"))) void PackAvx2(const T* x, const Layout& l, int64_t first,
                                              int64_t last, uint64_t* out) {
  Pack<T, BitsAvx2<T>>(x, l, first, last, out);
}
#endif

// The variant that `isa` runs: PackAvx2 for kAvx2 and kAvx512, PackGeneric for kGeneric.
template <typename T>
using PackFn = void (*)(const T*, const Layout&, int64_t, int64_t, uint64_t*);
template <typename T>
PackFn<T> Select(Isa isa) {
#ifdef BNN_X86
  if (isa != kGeneric) return PackAvx2<T>;
#endif
  return PackGeneric<T>;
}

// Whether this CPU runs what Select picks for `isa`: the AVX2 code for kAvx2 and kAvx512.
inline bool CpuRuns(Isa isa) { return isa == kGeneric || HasAvx2(); }

// The tasks of Pack for layout l: a line each along the last axis; along the rows, a band of 64
// rows by a chunk of kChunkTiles tiles of 64 columns each.
inline int64_t TaskCount(const Layout& l) {
  const int64_t words = ((l.along_rows ? l.rows : l.cols) + 63) / 64;
  const int64_t chunk_count = ((l.cols + 63) / 64 + kChunkTiles - 1) / kChunkTiles;
  return l.along_rows ? l.outer * words * chunk_count : l.outer;
}

// Rough cycles per task, from the values it reads (a small tensor stays on one thread).
inline int64_t TaskCost(const Layout& l) {
  return l.along_rows ? 2 * std::min<int64_t>(l.rows, 64) *
                            std::min<int64_t>(l.cols, 64 * kChunkTiles)
                      : std::max<int64_t>(l.cols, 1);
}

}  // namespace sign_pack
}  // namespace core
}  // namespace bnn

#endif  // BNN_NATIVE_CORE_SIGN_PACK_H_
