// xor-popcount kernels of packed +-1 operands: the mismatch counts of rows of x against the units
// of w, their threshold packing into sign words, their affine map to logits, and the "valid"
// convolution of packed images; each beside its plain reference kernel (namespace reference) and
// with one dispatch function per family (CountGroup, PackWord) that maps an Isa to its variant.
//
// Packed operands follow bnn.ops.bitpack (see bits.h): bit i of a +-1 vector is 1 for +1
// and 0 for -1, 64 bits to an int64 word, least significant bit first, pad bits 0.
//
//   x (batch, words), w (words, units) -> mismatches[b, u] = sum_k popcount(x[b, k] XOR w[k, u]);
//       the +-1 dot product of n real bits is n - 2 * mismatches.
//   Sign (threshold (units) int32, flip (ceil(units / 64)) int64, n): words (batch,
//       ceil(units / 64)), bit u of row b is [n - 2 * mismatches >= threshold[u]], then XOR flip;
//       pad bits past `units` are 0 (where flip's are).
//   Affine (scale, shift (units) float32, n): float32(double(n - 2 * mismatches) * scale + shift),
//       the product exact in double and the sum rounded once (as XLA's fused multiply-add on CPU).
//   Threshold packing of int32 a (batch, units): the same words for a >= threshold.
//   Conv2d (x (batch, h, w, words), w (kh * kw * words, units), kh, kw, sh, sw, n): (batch, ho,
//       wo, units) float32 or bfloat16 n - 2 * mismatches, the "valid" +-1 convolution of a padded
//       input packed along its channels with a kernel packed along its input channels, flattened
//       over its taps (tap-major); each output position's row of taps is gathered per block of
//       rows, so no patch tensor is built.
//
// Variants ("generic" plain C++, "avx2", "avx512" with VPOPCNTDQ) are compiled with per-function
// target attributes, so one build serves every x86-64 CPU; the caller picks one the CPU runs
// (Supported in cpu.h).
//
// AVX-512: one 512-bit register holds word k of 8 neighbouring units (w is stored units-minor),
// so a broadcast x word, an xor, a popcount and an add advance 8 dot products; a tile of 6 rows x
// 32 units keeps 24 accumulators in registers.
// AVX2 has no vector popcount. Each word is split into its low and high nibbles (x once per call,
// w per loaded register); VPSHUFB looks up the popcount of 32 nibbles at a time from a 16-entry
// table, and the byte counts of up to 31 words add up in byte lanes (at most 8 per word) before
// VPSADBW sums each 64-bit lane's bytes into that unit's count. A tile of 3 rows x 8 units keeps
// 6 byte accumulators, 4 nibble registers of w, the table and 2 broadcast x nibbles in the 16
// vector registers.
// Work is split (by the caller, over its threads) in items of 64 units (one output word) by 36
// rows: ProductItems and Conv2dItems run a range of them.
#ifndef BNN_NATIVE_CORE_XOR_POPCOUNT_H_
#define BNN_NATIVE_CORE_XOR_POPCOUNT_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "core/bfloat16.h"
#include "core/bits.h"
#include "core/cpu.h"

namespace bnn {
namespace core {

// ---- reference kernels: the plain loops the variants below are checked against -----------------
namespace reference {

// mismatches[b * units + u] = sum_k popcount(x[b, k] XOR w[k, u]) for x (batch, words) and
// w (words, units).
inline void XorPopcount(const int64_t* x, const int64_t* w, int64_t batch, int64_t words,
                        int64_t units, int32_t* mismatches) {
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t u = 0; u < units; ++u) {
      int32_t count = 0;
      for (int64_t k = 0; k < words; ++k)
        count += Popcount(static_cast<uint64_t>(x[b * words + k] ^ w[k * units + u]));
      mismatches[b * units + u] = count;
    }
}

// out (batch, ceil(units / 64)) words: bit u of row b is [a[b, u] >= threshold[u]], each word
// then XOR its flip word.
inline void ThresholdPack(const int32_t* a, int64_t batch, int64_t units,
                          const int32_t* threshold, const int64_t* flip, int64_t* out) {
  const int64_t words = WordsFor(units);
  for (int64_t b = 0; b < batch; ++b) {
    int64_t* row = out + b * words;
    for (int64_t k = 0; k < words; ++k) row[k] = 0;
    for (int64_t u = 0; u < units; ++u)
      if (a[b * units + u] >= threshold[u]) SetBit(row, u);
    for (int64_t k = 0; k < words; ++k) row[k] ^= flip[k];
  }
}

// out (batch, ceil(units / 64)) words: [n - 2 * mismatches >= threshold] XOR flip.
inline void XorPopcountSign(const int64_t* x, const int64_t* w, int64_t batch, int64_t words,
                            int64_t units, int64_t n, const int32_t* threshold,
                            const int64_t* flip, int64_t* out) {
  std::vector<int32_t> dots(batch * units);
  XorPopcount(x, w, batch, words, units, dots.data());
  for (int32_t& d : dots) d = static_cast<int32_t>(n - 2 * static_cast<int64_t>(d));
  ThresholdPack(dots.data(), batch, units, threshold, flip, out);
}

// logits (batch, units): float32(double(n - 2 * mismatches) * scale[u] + shift[u]).
inline void XorPopcountAffine(const int64_t* x, const int64_t* w, int64_t batch, int64_t words,
                              int64_t units, int64_t n, const float* scale, const float* shift,
                              float* logits) {
  std::vector<int32_t> counts(batch * units);
  XorPopcount(x, w, batch, words, units, counts.data());
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t u = 0; u < units; ++u) {
      const double dot = static_cast<double>(n - 2 * static_cast<int64_t>(counts[b * units + u]));
      logits[b * units + u] = static_cast<float>(dot * static_cast<double>(scale[u]) +
                                                 static_cast<double>(shift[u]));
    }
}

// y (batch, ho, wo, units), ho = (h - kh) / sh + 1 (0 where h < kh), wo likewise: the "valid"
// convolution n - 2 * mismatches of x (batch, h, wd, words) with w (kh * kw * words, units), row
// (ti * kw + tj) * words + k of w holding word k of tap (ti, tj); as float32 or bfloat16.
template <typename T>
void XorPopcountConv2d(const int64_t* x, const int64_t* w, int64_t batch, int64_t h, int64_t wd,
                       int64_t words, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                       int64_t units, int64_t n, T* y) {
  const int64_t ho = h >= kh ? (h - kh) / sh + 1 : 0;
  const int64_t wo = wd >= kw ? (wd - kw) / sw + 1 : 0;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < ho; ++i)
      for (int64_t j = 0; j < wo; ++j)
        for (int64_t u = 0; u < units; ++u) {
          int64_t count = 0;
          for (int64_t ti = 0; ti < kh; ++ti)
            for (int64_t tj = 0; tj < kw; ++tj)
              for (int64_t k = 0; k < words; ++k) {
                const int64_t pixel = ((b * h + i * sh + ti) * wd + j * sw + tj) * words + k;
                const int64_t row = (ti * kw + tj) * words + k;
                count += Popcount(static_cast<uint64_t>(x[pixel] ^ w[row * units + u]));
              }
          y[((b * ho + i) * wo + j) * units + u] =
              FromFloat<T>(static_cast<float>(n - 2 * count));
        }
}

}  // namespace reference

namespace xor_popcount {

constexpr int64_t kGroup = 64;  // units per output word and per unit of parallel work

// Whether this CPU runs the kernels that CountGroup and PackWord pick for `isa`: every variant
// here needs its instructions in full.
inline bool CpuRuns(Isa isa) { return Supported(isa); }

// ---- counting: counts[r * 64 + u] for rows r < rows of x and units u0 + u, u < width <= 64 ----

// One POPCNT per word and unit, for any CPU. Reference: reference::XorPopcount.
inline void CountGroupGeneric(const int64_t* x, const int64_t* w, int64_t rows, int64_t words,
                              int64_t units, int64_t u0, int64_t width, int32_t* counts) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t* xr = x + r * words;
    for (int64_t u = 0; u < width; ++u) {
      int32_t c = 0;
      for (int64_t k = 0; k < words; ++k)
        c += __builtin_popcountll(static_cast<uint64_t>(xr[k] ^ w[k * units + u0 + u]));
      counts[r * kGroup + u] = c;
    }
  }
}

#ifdef BNN_X86
constexpr int kRows512 = 6;  // AVX-512 tile: 6 rows x 4 registers of 8 units

// Counts for exactly R rows of x starting at xr (row stride `words`) against the (up to) 32
// units of w starting at column col whose load masks are `mask`, into counts[r * 64 + u].
// R is a compile-time constant so that the R x 4 accumulators stay in registers.
template <int R>
BNN_TARGET_AVX512 inline void TileAvx512(const int64_t* xr, const int64_t* w, int64_t words,
                                         int64_t units, int64_t col, const __mmask8* mask,
                                         int32_t* counts) {
  __m512i acc[R][4];
  BNN_UNROLL for (int r = 0; r < R; ++r)
    BNN_UNROLL for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_si512();
  for (int64_t k = 0; k < words; ++k) {
    const int64_t* wk = w + k * units + col;
    __m512i wv[4];
    BNN_UNROLL for (int j = 0; j < 4; ++j) wv[j] = _mm512_maskz_loadu_epi64(mask[j], wk + 8 * j);
    BNN_UNROLL for (int r = 0; r < R; ++r) {
      const __m512i xv = _mm512_set1_epi64(xr[r * words + k]);
      BNN_UNROLL for (int j = 0; j < 4; ++j)
        acc[r][j] = _mm512_add_epi64(
            acc[r][j], _mm512_popcnt_epi64(_mm512_xor_si512(xv, wv[j])));
    }
  }
  BNN_UNROLL for (int r = 0; r < R; ++r)
    BNN_UNROLL for (int j = 0; j < 4; ++j)
      _mm256_mask_storeu_epi32(counts + r * kGroup + 8 * j, mask[j],
                               _mm512_cvtepi64_epi32(acc[r][j]));
}

// Tiles of 6 rows by 32 units (fewer for the last rows), each half of a 64-unit group at a time
// with its load masks. Reference: reference::XorPopcount.
BNN_TARGET_AVX512 inline void CountGroupAvx512(const int64_t* x, const int64_t* w,
                                               int64_t rows, int64_t words, int64_t units,
                                               int64_t u0, int64_t width, int32_t* counts) {
  for (int64_t half = 0; half < width; half += 32) {
    const int64_t n_here = std::min<int64_t>(32, width - half);
    __mmask8 mask[4];
    for (int j = 0; j < 4; ++j) {
      const int64_t live = std::max<int64_t>(0, std::min<int64_t>(8, n_here - 8 * j));
      mask[j] = static_cast<__mmask8>((1u << live) - 1u);
    }
    const int64_t col = u0 + half;
    int64_t r0 = 0;
    for (; r0 + kRows512 <= rows; r0 += kRows512)
      TileAvx512<kRows512>(x + r0 * words, w, words, units, col, mask,
                                 counts + r0 * kGroup + half);
    const int64_t* xr = x + r0 * words;
    int32_t* tail = counts + r0 * kGroup + half;
    switch (rows - r0) {  // the last rows, fewer than a tile
      case 5: TileAvx512<5>(xr, w, words, units, col, mask, tail); break;
      case 4: TileAvx512<4>(xr, w, words, units, col, mask, tail); break;
      case 3: TileAvx512<3>(xr, w, words, units, col, mask, tail); break;
      case 2: TileAvx512<2>(xr, w, words, units, col, mask, tail); break;
      case 1: TileAvx512<1>(xr, w, words, units, col, mask, tail); break;
      default: break;
    }
  }
}

constexpr int kRows256 = 3;  // AVX2 tile: 3 rows x 2 registers of 4 units (2x2, 4x1, 4x2, 1x4 and
constexpr int kCols256 = 2;  // tiles reading pre-split nibbles of w were no faster, most slower)
static_assert(kGroup % (4 * kCols256) == 0, "tile columns must not straddle a 64-unit group");
constexpr int64_t kByteBlock = 31;  // words whose byte counts (<= 8 each) fit in a byte lane

// Counts for exactly R rows, given as the low (lo) and high (hi) nibbles of their words (row
// stride `words`), against the 4 * J units of w starting at column col (lanes past the end of w
// masked off by `mask` when kMasked), into counts[r * 64 + u].
template <int R, int J, bool kMasked>
BNN_TARGET_AVX2 inline void TileAvx2(const int64_t* lo, const int64_t* hi, const int64_t* w,
                                     int64_t words, int64_t units, int64_t col,
                                     const __m256i* mask, int32_t* counts) {
  const __m256i table = _mm256_setr_epi8(0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4,
                                         0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4);
  const __m256i nibble = _mm256_set1_epi8(0x0f);
  const __m256i evens = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  for (int64_t k0 = 0; k0 < words; k0 += kByteBlock) {
    const int64_t k1 = std::min(words, k0 + kByteBlock);
    __m256i acc[R][J];
    BNN_UNROLL for (int r = 0; r < R; ++r)
      BNN_UNROLL for (int j = 0; j < J; ++j) acc[r][j] = _mm256_setzero_si256();
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t* wk = w + k * units + col;
      __m256i wl[J], wh[J];
      BNN_UNROLL for (int j = 0; j < J; ++j) {
        const __m256i v =
            kMasked ? _mm256_maskload_epi64(reinterpret_cast<const long long*>(wk + 4 * j),
                                            mask[j])
                    : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wk + 4 * j));
        wl[j] = _mm256_and_si256(v, nibble);
        wh[j] = _mm256_and_si256(_mm256_srli_epi64(v, 4), nibble);
      }
      BNN_UNROLL for (int r = 0; r < R; ++r) {
        const __m256i xl = _mm256_set1_epi64x(lo[r * words + k]);
        const __m256i xh = _mm256_set1_epi64x(hi[r * words + k]);
        BNN_UNROLL for (int j = 0; j < J; ++j) {
          const __m256i a = _mm256_xor_si256(xl, wl[j]);
          const __m256i b = _mm256_xor_si256(xh, wh[j]);
          acc[r][j] = _mm256_add_epi8(acc[r][j], _mm256_add_epi8(_mm256_shuffle_epi8(table, a),
                                                                 _mm256_shuffle_epi8(table, b)));
        }
      }
    }
    // each 64-bit lane's byte counts -> that unit's count (< 2^16), the 4 lanes -> 4 int32
    BNN_UNROLL for (int r = 0; r < R; ++r)
      BNN_UNROLL for (int j = 0; j < J; ++j) {
        const __m256i sums = _mm256_sad_epu8(acc[r][j], _mm256_setzero_si256());
        const __m128i c = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(sums, evens));
        __m128i* dst = reinterpret_cast<__m128i*>(counts + r * kGroup + 4 * j);
        _mm_storeu_si128(dst, k0 ? _mm_add_epi32(_mm_loadu_si128(dst), c) : c);
      }
  }
}

// All rows against one tile column of 4 * kCols256 units: tiles of kRows256 rows, then the rest.
template <bool kMasked>
BNN_TARGET_AVX2 void ColumnAvx2(const int64_t* lo, const int64_t* hi, const int64_t* w,
                                int64_t rows, int64_t words, int64_t units, int64_t col,
                                const __m256i* mask, int32_t* counts) {
  int64_t r0 = 0;
  for (; r0 + kRows256 <= rows; r0 += kRows256)
    TileAvx2<kRows256, kCols256, kMasked>(lo + r0 * words, hi + r0 * words, w, words,
                                                units, col, mask, counts + r0 * kGroup);
  const int64_t skip = r0 * words;
  switch (rows - r0) {
    case 2: TileAvx2<2, kCols256, kMasked>(lo + skip, hi + skip, w, words, units, col,
                                                mask, counts + r0 * kGroup); break;
    case 1: TileAvx2<1, kCols256, kMasked>(lo + skip, hi + skip, w, words, units, col,
                                                mask, counts + r0 * kGroup); break;
    default: break;
  }
}

// Columns of 8 units across the group (the last masked), on the nibbles of x. Reference:
// reference::XorPopcount.
BNN_TARGET_AVX2 inline void CountGroupAvx2(const int64_t* lo, const int64_t* hi,
                                           const int64_t* w, int64_t rows, int64_t words,
                                           int64_t units, int64_t u0, int64_t width,
                                           int32_t* counts) {
  constexpr int64_t kStep = 4 * kCols256;
  const __m256i lanes = _mm256_setr_epi64x(0, 1, 2, 3);
  for (int64_t c = 0; c < width; c += kStep) {
    const int64_t live = width - c;
    if (live >= kStep) {
      ColumnAvx2<false>(lo, hi, w, rows, words, units, u0 + c, nullptr, counts + c);
    } else {  // the group's last units: masked loads, so nothing past the end of w is read
      __m256i mask[kCols256];
      for (int j = 0; j < kCols256; ++j)
        mask[j] = _mm256_cmpgt_epi64(_mm256_set1_epi64x(live - 4 * j), lanes);
      ColumnAvx2<true>(lo, hi, w, rows, words, units, u0 + c, mask, counts + c);
    }
  }
}
#endif  // BNN_X86

// Rows of packed words (`words` per row) and, for the AVX2 kernels, their low and high nibbles.
struct Rows {
  const int64_t* x;
  int64_t words;
  std::vector<int64_t> lo, hi;

  Rows(const int64_t* x_, int64_t rows, int64_t words_, Isa isa) : x(x_), words(words_) {
    if (isa != kAvx2) return;
    const uint64_t mask = 0x0f0f0f0f0f0f0f0full;
    lo.resize(rows * words);
    hi.resize(rows * words);
    for (int64_t i = 0; i < rows * words; ++i) {
      const uint64_t v = static_cast<uint64_t>(x[i]);
      lo[i] = static_cast<int64_t>(v & mask);
      hi[i] = static_cast<int64_t>((v >> 4) & mask);
    }
  }
};

// Mismatch counts for rows [row0, row0 + rows) and units [u0, u0 + width), width <= 64, into
// counts[r * 64 + (u - u0)]: the dispatch of the counting kernels, kAvx512 to CountGroupAvx512,
// kAvx2 to CountGroupAvx2 (on the nibbles x holds for it), kGeneric to CountGroupGeneric.
inline void CountGroup(Isa isa, const Rows& x, const int64_t* w, int64_t row0, int64_t rows,
                       int64_t units, int64_t u0, int64_t width, int32_t* counts) {
  const int64_t words = x.words, skip = row0 * words;
#ifdef BNN_X86
  if (isa == kAvx512)
    return CountGroupAvx512(x.x + skip, w, rows, words, units, u0, width, counts);
  if (isa == kAvx2)
    return CountGroupAvx2(x.lo.data() + skip, x.hi.data() + skip, w, rows, words, units,
                                u0, width, counts);
#endif
  CountGroupGeneric(x.x + skip, w, rows, words, units, u0, width, counts);
}

// Rough cycles per row and word of a 64-unit group, for splitting work over threads.
inline int64_t CostPerWord(Isa isa) { return isa == kAvx512 ? 16 : isa == kAvx2 ? 32 : 128; }

// ---- threshold packing: bit u = [scale * values[u] + offset >= threshold[u]] XOR flip ----------
// (scale is 1, 2 or -2, which turns counts into dot products)

// One comparison per unit, for any CPU. Reference: reference::ThresholdPack.
inline int64_t PackWordGeneric(const int32_t* values, const int32_t* threshold, int64_t width,
                               int32_t scale, int32_t offset, int64_t flip) {
  uint64_t bits = 0;
  for (int64_t u = 0; u < width; ++u)
    bits |= static_cast<uint64_t>(scale * values[u] + offset >= threshold[u]) << u;
  return static_cast<int64_t>(bits) ^ flip;
}

#ifdef BNN_X86
// 16 units per masked compare. Reference: reference::ThresholdPack.
BNN_TARGET_AVX512 inline int64_t PackWordAvx512(const int32_t* values,
                                                const int32_t* threshold, int64_t width,
                                                int32_t scale, int32_t offset, int64_t flip) {
  uint64_t bits = 0;
  const __m512i mul = _mm512_set1_epi32(scale), add = _mm512_set1_epi32(offset);
  for (int64_t q = 0; q < width; q += 16) {
    const int64_t live = std::min<int64_t>(16, width - q);
    const __mmask16 mask = static_cast<__mmask16>((1u << live) - 1u);
    const __m512i v = _mm512_add_epi32(
        _mm512_mullo_epi32(_mm512_maskz_loadu_epi32(mask, values + q), mul), add);
    const __m512i t = _mm512_maskz_loadu_epi32(mask, threshold + q);
    bits |= static_cast<uint64_t>(_mm512_mask_cmpge_epi32_mask(mask, v, t)) << q;
  }
  return static_cast<int64_t>(bits) ^ flip;
}

// 8 units per compare and mask, the last units one at a time. Reference: reference::ThresholdPack.
BNN_TARGET_AVX2 inline int64_t PackWordAvx2(const int32_t* values, const int32_t* threshold,
                                            int64_t width, int32_t scale, int32_t offset,
                                            int64_t flip) {
  uint64_t bits = 0;
  const __m256i mul = _mm256_set1_epi32(scale), add = _mm256_set1_epi32(offset);
  int64_t q = 0;
  for (; q + 8 <= width; q += 8) {
    const __m256i v = _mm256_add_epi32(
        _mm256_mullo_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(values + q)),
                           mul), add);
    const __m256i t = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(threshold + q));
    const int below = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(t, v)));
    bits |= static_cast<uint64_t>(~below & 0xff) << q;
  }
  for (; q < width; ++q)
    bits |= static_cast<uint64_t>(scale * values[q] + offset >= threshold[q]) << q;
  return static_cast<int64_t>(bits) ^ flip;
}
#endif

// The dispatch of the packing kernels: kAvx512 to PackWordAvx512, kAvx2 to PackWordAvx2,
// kGeneric to PackWordGeneric.
inline int64_t PackWord(Isa isa, const int32_t* values, const int32_t* threshold,
                        int64_t width, int32_t scale, int32_t offset, int64_t flip) {
#ifdef BNN_X86
  if (isa == kAvx512) return PackWordAvx512(values, threshold, width, scale, offset, flip);
  if (isa == kAvx2) return PackWordAvx2(values, threshold, width, scale, offset, flip);
#endif
  return PackWordGeneric(values, threshold, width, scale, offset, flip);
}

// What a product's words become: mismatch counts, packed signs or affine logits.
enum Mode { kCounts, kSign, kAffine };

// The output of one product: for kSign the thresholds and flips, for kAffine the scale and
// shift, for both the real bits per row n; out points to int32 counts, int64 words or float
// logits as the mode says.
struct Epilogue {
  Mode mode = kCounts;
  int64_t n = 0;
  const int32_t* threshold = nullptr;
  const int64_t* flip = nullptr;
  const float* scale = nullptr;
  const float* shift = nullptr;
  void* out = nullptr;
};

// Rows per item of a product's work: an item is (chunk of up to kProductRows rows, group of 64
// units), chunk-major, so that neighbouring items share x rows and a single group still splits
// over threads.
constexpr int64_t kProductRows = 36;

// Items of the product of `batch` rows by `units` units.
inline int64_t ProductItemCount(int64_t batch, int64_t units) {
  return (batch + kProductRows - 1) / kProductRows * ((units + kGroup - 1) / kGroup);
}

// Rough cycles per item of the product, for the real rows (one example is not worth a thread).
inline int64_t ProductItemCost(Isa isa, int64_t batch, int64_t words) {
  return std::max<int64_t>(1, std::min(kProductRows, batch) * words * CostPerWord(isa));
}

// Items [first, last) of the product x (batch, words) times w (words, units), x given as Rows
// made for `isa`, into e.out as e.mode says. Reference: reference::XorPopcount,
// reference::XorPopcountSign, reference::XorPopcountAffine.
inline void ProductItems(Isa isa, const Rows& rows_in, const int64_t* w, int64_t batch,
                         int64_t units, const Epilogue& e, int64_t first, int64_t last) {
  const int64_t out_words = (units + kGroup - 1) / kGroup;
  int32_t* counts_out = e.mode == kCounts ? static_cast<int32_t*>(e.out) : nullptr;
  int64_t* words_out = e.mode == kSign ? static_cast<int64_t*>(e.out) : nullptr;
  float* logits_out = e.mode == kAffine ? static_cast<float*>(e.out) : nullptr;
  constexpr int64_t kChunk = kProductRows;
  int32_t counts[kChunk * kGroup];
  for (int64_t item = first; item < last; ++item) {
    const int64_t g = item % out_words, r0 = (item / out_words) * kChunk;
    const int64_t u0 = g * kGroup, width = std::min(kGroup, units - u0);
    const int64_t rows = std::min(kChunk, batch - r0);
    CountGroup(isa, rows_in, w, r0, rows, units, u0, width, counts);
    for (int64_t r = 0; r < rows; ++r) {
      const int32_t* c = counts + r * kGroup;
      if (e.mode == kSign) {
        words_out[(r0 + r) * out_words + g] = PackWord(
            isa, c, e.threshold + u0, width, -2, static_cast<int32_t>(e.n), e.flip[g]);
      } else if (e.mode == kAffine) {
        float* row = logits_out + (r0 + r) * units + u0;
        for (int64_t j = 0; j < width; ++j) {
          const double dot = static_cast<double>(e.n - 2 * static_cast<int64_t>(c[j]));
          row[j] = static_cast<float>(dot * static_cast<double>(e.scale[u0 + j]) +
                                      static_cast<double>(e.shift[u0 + j]));
        }
      } else {
        std::memcpy(counts_out + (r0 + r) * units + u0, c, width * sizeof(int32_t));
      }
    }
  }
}

// Rows [first, last) of the threshold packing of int32 a (batch, units) into words_out (batch,
// ceil(units / 64)). Reference: reference::ThresholdPack.
inline void ThresholdPackRows(Isa isa, const int32_t* ap, int64_t units,
                              const int32_t* threshold, const int64_t* flip, int64_t first,
                              int64_t last, int64_t* words_out) {
  const int64_t out_words = (units + kGroup - 1) / kGroup;
  for (int64_t b = first; b < last; ++b)
    for (int64_t g = 0; g < out_words; ++g) {
      const int64_t u0 = g * kGroup;
      words_out[b * out_words + g] = PackWord(isa, ap + b * units + u0, threshold + u0,
                                              std::min(kGroup, units - u0), 1, 0, flip[g]);
    }
}

// ---- convolution: n - 2 * mismatches of each output position's taps and each unit ------------

// The shape of one convolution: x (batch, h, wd, words), kernel kh x kw, strides sh, sw, output
// (batch, ho, wo, units), n real bits per row of taps.
struct ConvGeometry {
  int64_t batch, h, wd, words, kh, kw, sh, sw, ho, wo, units, n;
  int64_t positions() const { return batch * ho * wo; }
  int64_t row_words() const { return kh * kw * words; }
};

// Output positions per item of a convolution's work: an item is (block of kConvPositions
// positions, group of 64 units), block-major.
constexpr int64_t kConvPositions = 36;

inline int64_t ConvItemCount(const ConvGeometry& g) {
  return (g.positions() + kConvPositions - 1) / kConvPositions * ((g.units + kGroup - 1) / kGroup);
}

inline int64_t ConvItemCost(Isa isa, const ConvGeometry& g) {
  return std::max<int64_t>(1, std::min(kConvPositions, g.positions()) * g.row_words() *
                                  CostPerWord(isa));
}

// Items [first, last) of the "valid" +-1 convolution of x with w (kh * kw * words, units) as dot
// products n - 2 * mismatches in T (float or bfloat16) into y (batch, ho, wo, units). A call
// gathers a block's rows of kh * kw * words words (tap-major, as w is flattened) once for all the
// groups of that block it runs. Reference: reference::XorPopcountConv2d.
template <typename T>
void Conv2dItems(Isa isa, const ConvGeometry& geometry, const int64_t* xp, const int64_t* wp,
                 T* yp, int64_t first, int64_t last) {
  const int64_t h = geometry.h, wd = geometry.wd, words = geometry.words;
  const int64_t ho = geometry.ho, wo = geometry.wo, units = geometry.units;
  const int64_t kh = geometry.kh, kw = geometry.kw, sh = geometry.sh, sw = geometry.sw;
  const int64_t n = geometry.n;
  const int64_t positions = geometry.positions(), row_words = geometry.row_words();
  const int64_t out_words = (units + kGroup - 1) / kGroup;
  constexpr int64_t kChunk = kConvPositions;
  int32_t counts[kChunk * kGroup];
  std::vector<int64_t> gathered(kChunk * row_words);
  std::unique_ptr<Rows> rows_in;
  int64_t held = -1;  // the block whose rows `gathered` holds
  for (int64_t item = first; item < last; ++item) {
    const int64_t g = item % out_words, block = item / out_words;
    const int64_t p0 = block * kChunk, rows = std::min(kChunk, positions - p0);
    if (block != held) {
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t p = p0 + r, b = p / (ho * wo), i = (p / wo) % ho, j = p % wo;
        int64_t* dst = gathered.data() + r * row_words;
        for (int64_t ti = 0; ti < kh; ++ti) {
          const int64_t* src = xp + ((b * h + i * sh + ti) * wd + j * sw) * words;
          std::memcpy(dst + ti * kw * words, src, kw * words * sizeof(int64_t));
        }
      }
      rows_in.reset(new Rows(gathered.data(), rows, row_words, isa));
      held = block;
    }
    const int64_t u0 = g * kGroup, width = std::min(kGroup, units - u0);
    CountGroup(isa, *rows_in, wp, 0, rows, units, u0, width, counts);
    for (int64_t r = 0; r < rows; ++r) {
      const int32_t* c = counts + r * kGroup;
      T* row = yp + (p0 + r) * units + u0;
      for (int64_t k = 0; k < width; ++k)
        row[k] = FromFloat<T>(static_cast<float>(n - 2 * static_cast<int64_t>(c[k])));
    }
  }
}

}  // namespace xor_popcount
}  // namespace core
}  // namespace bnn

#endif  // BNN_NATIVE_CORE_XOR_POPCOUNT_H_
