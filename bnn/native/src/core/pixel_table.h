// The first layer on 8-bit pixels: the exact integer products u . w of pixels u in [0, 255] with
// +-1 weights w, by table lookup, compared with thresholds and packed into sign words; beside its
// plain reference kernel (reference::PixelTableSign) and with its dispatch functions (Tables,
// TableSums) that map an Isa to a variant ("avx512" runs the AVX2 code: every AVX-512 CPU has
// AVX2).
//
//   u (batch, n) uint8, or float32 x encoded as clip(round_half_even((x - offset) / scale), 0,
//   255); w (blocks, groups, 32) uint8, blocks = 2 * ceil(units / 64), groups = ceil(n / 4):
//   byte [u / 32, g, u % 32] holds bits 4 g ... 4 g + 3 of unit u's weights (1 for +1; bits past
//   n and pad units 0) -> words (batch, ceil(units / 64)), bit u = [u . w >= threshold[u]], then
//   XOR flip.
//
// With u . w = 2 * (u . b) - sum(u) for the weight bits b and u = 16 * h + l for the pixels'
// nibbles, u . b = 16 * (h . b) + l . b; per group of 4 pixels, the 16 sums of their low (high)
// nibbles over the subsets of the group form a table that each unit's 4 weight bits index.
// VPSHUFB serves 32 units at once. Work is split (by the caller) in items of 8 examples by 64
// units (one output word): PrepareExamples builds each example's tables, SignItems runs a range
// of items.
#ifndef BNN_NATIVE_CORE_PIXEL_TABLE_H_
#define BNN_NATIVE_CORE_PIXEL_TABLE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/bits.h"
#include "core/cpu.h"
#include "core/xor_popcount.h"

namespace bnn {
namespace core {
namespace reference {

// Pixel of float x: clip(round_half_even((x - offset) / scale), 0, 255), in float32.
inline uint8_t EncodePixel(float x, float scale, float offset) {
  float u = std::nearbyint((x - offset) / scale);
  if (u < 0.0f) u = 0.0f;
  if (u > 255.0f) u = 255.0f;
  return static_cast<uint8_t>(u);
}

// out (batch, ceil(units / 64)) words: bit u of row b is [sum_i u[b, i] * w(i, u) >=
// threshold[u]], each word then XOR its flip word, for pixels u (batch, n) and w(i, u) = +1
// where bit i % 4 of table byte [u / 32, i / 4, u % 32] is set, else -1.
inline void PixelTableSign(const uint8_t* u, int64_t batch, int64_t n, const uint8_t* table,
                           int64_t units, const int32_t* threshold, const int64_t* flip,
                           int64_t* out) {
  const int64_t groups = (n + 3) / 4;
  std::vector<int32_t> dots(batch * units);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t unit = 0; unit < units; ++unit) {
      int32_t dot = 0;
      for (int64_t i = 0; i < n; ++i) {
        const uint8_t byte = table[((unit / 32) * groups + i / 4) * 32 + unit % 32];
        const int32_t pixel = u[b * n + i];
        dot += (byte >> (i % 4)) & 1 ? pixel : -pixel;
      }
      dots[b * units + unit] = dot;
    }
  ThresholdPack(dots.data(), batch, units, threshold, flip, out);
}

}  // namespace reference

namespace pixel_table {

using xor_popcount::kGroup;
using xor_popcount::PackWord;

// Whether this CPU runs the kernels that Tables and TableSums pick for `isa`.
inline bool CpuRuns(Isa isa) { return Supported(isa); }

// ---- pixel tables: the first layer's u . b for 8-bit pixels u and 0/1 weight bits b ------------
// u . b = 16 * (h . b) + (l . b) for the high and low nibbles h, l of the pixels. For each group of
// 4 pixels, tables[g * 32 + p] is the sum of the low nibbles of the group's pixels at the set bits
// of p (<= 60), tables[g * 32 + 16 + p] the same for the high nibbles. The kernel w holds, for each
// group and unit, the unit's 4 weight bits of the group as one byte, in blocks of 32 units
// (ceil(units / 32), groups, 32) so that a block's bytes are contiguous (pad units 0); a unit's
// sums are the tables looked up at its bytes, added over the groups. A group of 4 zero pixels adds
// nothing, so each example keeps the tables of its other groups only (`live`, in order, `count`
// of them): on MNIST-like images about 29% of the groups.

// Moves the groups of 4 pixels that hold a non-zero pixel to the front of `pixels`, in order,
// and their indices to `live`; returns how many. Pad pixels past an example's end stay zero: only
// the last group holds them, and it moves nowhere.
inline int64_t LiveGroups(uint8_t* pixels, int64_t groups, int32_t* live) {
  int64_t count = 0;
  for (int64_t g = 0; g < groups; ++g) {
    uint32_t four;
    std::memcpy(&four, pixels + g * 4, sizeof(four));
    if (four == 0) continue;
    std::memcpy(pixels + count * 4, &four, sizeof(four));
    live[count++] = static_cast<int32_t>(g);
  }
  return count;
}

// Each group's two tables, built up one pixel at a time, for any CPU. Reference:
// reference::PixelTableSign.
inline void BuildTables(const uint8_t* pixels, int64_t groups, uint8_t* tables) {
  for (int64_t g = 0; g < groups; ++g) {
    uint8_t* low = tables + g * 32;
    uint8_t* high = low + 16;
    low[0] = high[0] = 0;
    for (int j = 0; j < 4; ++j) {
      const uint8_t pixel = pixels[g * 4 + j];
      const int span = 1 << j;
      for (int p = 0; p < span; ++p) {
        low[span + p] = static_cast<uint8_t>(low[p] + (pixel & 15));
        high[span + p] = static_cast<uint8_t>(high[p] + (pixel >> 4));
      }
    }
  }
}

// sums[j] = u . b of units u0 + j, j < width, from one example's tables of groups live[0..count).
// Reference: reference::PixelTableSign.
inline void TableSumsGeneric(const uint8_t* tables, const int32_t* live, int64_t count,
                             const uint8_t* w, int64_t groups, int64_t u0, int64_t width,
                             int32_t* sums) {
  for (int64_t j = 0; j < width; ++j) {
    const uint8_t* column = w + (u0 + j) / 32 * groups * 32 + (u0 + j) % 32;
    int32_t sum = 0;
    for (int64_t i = 0; i < count; ++i) {
      const uint8_t index = column[live[i] * 32];
      sum += 16 * tables[i * 32 + 16 + index] + tables[i * 32 + index];
    }
    sums[j] = sum;
  }
}

#ifdef BNN_X86
// One group's two tables are one register: its 4 pixels' low nibbles in the low 128-bit lane, high
// nibbles in the high lane; byte p of a lane is the sum of the nibbles j at the set bits of p % 16,
// four VPSHUFB selections (nibble j where bit j of p is set, else 0) added up.
// Reference: reference::PixelTableSign.
BNN_TARGET_AVX2 inline void BuildTablesAvx2(const uint8_t* pixels, int64_t groups,
                                            uint8_t* tables) {
  __m256i select[4];
  for (int j = 0; j < 4; ++j) {
    alignas(32) uint8_t bytes[32];
    for (int p = 0; p < 32; ++p) bytes[p] = (p % 16 >> j & 1) ? static_cast<uint8_t>(j) : 0x80;
    select[j] = _mm256_load_si256(reinterpret_cast<const __m256i*>(bytes));
  }
  const __m256i nibble = _mm256_set1_epi8(0x0f);
  for (int64_t g = 0; g < groups; ++g) {
    int32_t four;
    std::memcpy(&four, pixels + g * 4, sizeof(four));
    const __m256i x = _mm256_set1_epi32(four);
    const __m256i n = _mm256_and_si256(_mm256_blend_epi32(x, _mm256_srli_epi16(x, 4), 0xF0),
                                       nibble);
    const __m256i table = _mm256_add_epi8(
        _mm256_add_epi8(_mm256_shuffle_epi8(n, select[0]), _mm256_shuffle_epi8(n, select[1])),
        _mm256_add_epi8(_mm256_shuffle_epi8(n, select[2]), _mm256_shuffle_epi8(n, select[3])));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(tables + g * 32), table);
  }
}

// 32 units at a time. VPSHUFB looks up each unit's byte in the group's two tables (broadcast to
// both 128-bit lanes); the byte sums of 4 groups (<= 240 each) are interleaved and VPMADDUBSW
// gives each unit's low + 16 * high in a 16-bit lane (<= 4080); 8 of those (<= 32640) are added
// in 16 bits, then widened into int32 sums.
constexpr int64_t kTableRounds16 = 8;  // rounds of 4 groups whose 16-bit sums stay below 2^15

// J blocks of 32 units (units 32 j.. of sums) in one pass over the groups, so each group's tables
// are loaded once for J lookups. kEvery: every group is live (live[i] == i), no index is read.
template <bool kEvery, int J>
BNN_TARGET_AVX2 void TableSumsTile(const uint8_t* tables, const int32_t* live, int64_t count,
                                   const uint8_t* w, int64_t groups, int64_t block,
                                   int32_t* sums) {
  const __m256i zero = _mm256_setzero_si256();
  const __m256i weights = _mm256_set1_epi16(16 << 8 | 1);  // bytes (low, high) -> low + 16 high
  const uint8_t* column = w + block * groups * 32;
  __m256i total[J][4];
  BNN_UNROLL for (int j = 0; j < J; ++j)
    BNN_UNROLL for (int t = 0; t < 4; ++t) total[j][t] = zero;
  for (int64_t g0 = 0; g0 < count; g0 += 4 * kTableRounds16) {
    const int64_t g1 = std::min(count, g0 + 4 * kTableRounds16);
    __m256i sum16[J][2];
    BNN_UNROLL for (int j = 0; j < J; ++j) sum16[j][0] = sum16[j][1] = zero;
    for (int64_t g = g0; g < g1; g += 4) {
      __m256i low8[J], high8[J];
      BNN_UNROLL for (int j = 0; j < J; ++j) low8[j] = high8[j] = zero;
      const int64_t here = std::min<int64_t>(4, g1 - g);
      BNN_UNROLL for (int64_t q = 0; q < 4; ++q) {
        if (q >= here) break;
        const uint8_t* table = tables + (g + q) * 32;
        const __m256i low = _mm256_broadcastsi128_si256(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(table)));
        const __m256i high = _mm256_broadcastsi128_si256(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(table + 16)));
        const uint8_t* bytes = column + (kEvery ? g + q : live[g + q]) * 32;
        BNN_UNROLL for (int j = 0; j < J; ++j) {
          const __m256i index = _mm256_loadu_si256(
              reinterpret_cast<const __m256i*>(bytes + j * groups * 32));
          low8[j] = _mm256_add_epi8(low8[j], _mm256_shuffle_epi8(low, index));
          high8[j] = _mm256_add_epi8(high8[j], _mm256_shuffle_epi8(high, index));
        }
      }
      BNN_UNROLL for (int j = 0; j < J; ++j) {
        sum16[j][0] = _mm256_add_epi16(
            sum16[j][0], _mm256_maddubs_epi16(_mm256_unpacklo_epi8(low8[j], high8[j]), weights));
        sum16[j][1] = _mm256_add_epi16(
            sum16[j][1], _mm256_maddubs_epi16(_mm256_unpackhi_epi8(low8[j], high8[j]), weights));
      }
    }
    BNN_UNROLL for (int j = 0; j < J; ++j)
      BNN_UNROLL for (int h = 0; h < 2; ++h) {
        total[j][2 * h] =
            _mm256_add_epi32(total[j][2 * h], _mm256_unpacklo_epi16(sum16[j][h], zero));
        total[j][2 * h + 1] =
            _mm256_add_epi32(total[j][2 * h + 1], _mm256_unpackhi_epi16(sum16[j][h], zero));
      }
  }
  // total[j][2 * h + k], lane 4 * a + i (a: 128-bit lane, i < 4): unit 32 j + 8 h + 16 a + 4 k + i
  alignas(32) int32_t lanes[4][8];
  BNN_UNROLL for (int j = 0; j < J; ++j) {
    for (int t = 0; t < 4; ++t)
      _mm256_store_si256(reinterpret_cast<__m256i*>(lanes[t]), total[j][t]);
    for (int h = 0; h < 2; ++h)
      for (int k = 0; k < 2; ++k)
        for (int a = 0; a < 2; ++a)
          for (int i = 0; i < 4; ++i)
            sums[32 * j + 8 * h + 16 * a + 4 * k + i] = lanes[2 * h + k][4 * a + i];
  }
}

// A 64-unit group as two blocks of 32 in one pass, or one block where the group has 32 units or
// fewer. Reference: reference::PixelTableSign.
template <bool kEvery>
BNN_TARGET_AVX2 void TableSumsAvx2(const uint8_t* tables, const int32_t* live, int64_t count,
                                   const uint8_t* w, int64_t groups, int64_t u0, int64_t width,
                                   int32_t* sums) {
  if (width > 32)  // u0 is a multiple of 64: whole blocks (pad units)
    return TableSumsTile<kEvery, 2>(tables, live, count, w, groups, u0 / 32, sums);
  TableSumsTile<kEvery, 1>(tables, live, count, w, groups, u0 / 32, sums);
}
#endif

// The dispatch of the table builders: kAvx2 and kAvx512 to BuildTablesAvx2, kGeneric to
// BuildTables. The AVX-512 variant runs the AVX2 code (every AVX-512 CPU has AVX2).
inline void Tables(Isa isa, const uint8_t* pixels, int64_t groups, uint8_t* tables) {
#ifdef BNN_X86
  if (isa != kGeneric) return BuildTablesAvx2(pixels, groups, tables);
#endif
  BuildTables(pixels, groups, tables);
}

// The dispatch of the table sums: kAvx2 and kAvx512 to TableSumsAvx2, kGeneric to
// TableSumsGeneric. sums has room for 64 units (a whole output word); units past `width` get pad
// sums.
inline void TableSums(Isa isa, const uint8_t* tables, const int32_t* live, int64_t count,
                      const uint8_t* w, int64_t groups, int64_t u0, int64_t width,
                      int32_t* sums) {
#ifdef BNN_X86
  if (isa != kGeneric)
    return count == groups
               ? TableSumsAvx2<true>(tables, live, count, w, groups, u0, width, sums)
               : TableSumsAvx2<false>(tables, live, count, w, groups, u0, width, sums);
#endif
  TableSumsGeneric(tables, live, count, w, groups, u0, width, sums);
}

// Pixel u in [0, 255]: uint8 as is; float x encoded as clip(round_half_even((x - offset) / scale)),
// the float32 arithmetic of bnn.packed.model's encoder.
inline uint32_t Pixel(uint8_t u, float, float) { return u; }
inline uint32_t Pixel(float x, float scale, float offset) {
  const float u = std::nearbyint((x - offset) / scale);
  return static_cast<uint32_t>(std::min(std::max(u, 0.0f), 255.0f));
}

// Examples per item of the first layer's work.
constexpr int64_t kExamples = 8;

// Items of a first layer of `batch` examples and `units` units: (chunk of kExamples examples,
// group of 64 units), chunk-major.
inline int64_t SignItemCount(int64_t batch, int64_t units) {
  return (batch + kExamples - 1) / kExamples * ((units + kGroup - 1) / kGroup);
}

// Rough cycles per item of the first layer, for splitting work over threads.
inline int64_t SignItemCost(Isa isa, int64_t batch, int64_t groups) {
  return std::max<int64_t>(1, std::min(kExamples, batch) * groups * (isa == kGeneric ? 256 : 8));
}

// Examples [first, last) of u (batch, n), T uint8 or float (encoded with scale and offset) made
// ready for SignItems: totals[b] = sum of the example's pixels, counts[b] its groups of 4 that
// hold a non-zero pixel, live[b * groups ...] their indices and tables[b * groups * 32 ...] their
// tables.
template <typename T>
void PrepareExamples(Isa isa, const T* up, int64_t n, int64_t groups, float scale, float offset,
                     int64_t first, int64_t last, uint8_t* tables, int32_t* totals,
                     int32_t* live, int32_t* counts) {
  std::vector<uint8_t> pixels(groups * 4, 0);  // one example, zero-padded to whole groups
  for (int64_t b = first; b < last; ++b) {
    int32_t total = 0;
    for (int64_t i = 0; i < n; ++i) {
      pixels[i] = static_cast<uint8_t>(Pixel(up[b * n + i], scale, offset));
      total += pixels[i];
    }
    totals[b] = total;
    const int64_t count = LiveGroups(pixels.data(), groups, live + b * groups);
    counts[b] = static_cast<int32_t>(count);
    Tables(isa, pixels.data(), count, tables + b * groups * 32);
  }
}

// Items [first, last) of the first layer on the prepared examples: output bits [z >= threshold]
// XOR flip of z = u . w = 2 * (u . b) - sum(u), exact, packed into words_out (batch,
// ceil(units / 64)). Reference: reference::PixelTableSign.
inline void SignItems(Isa isa, const uint8_t* tables, const int32_t* live, const int32_t* counts,
                      const int32_t* totals, int64_t batch, const uint8_t* wp, int64_t groups,
                      int64_t units, const int32_t* threshold, const int64_t* flip,
                      int64_t first, int64_t last, int64_t* words_out) {
  const int64_t out_words = (units + kGroup - 1) / kGroup;
  constexpr int64_t kChunk = kExamples;
  int32_t sums[kGroup];
  for (int64_t item = first; item < last; ++item) {
    const int64_t g = item % out_words, b0 = (item / out_words) * kChunk;
    const int64_t u0 = g * kGroup, width = std::min(kGroup, units - u0);
    for (int64_t b = b0; b < std::min(batch, b0 + kChunk); ++b) {
      TableSums(isa, tables + b * groups * 32, live + b * groups, counts[b], wp, groups, u0,
                width, sums);
      words_out[b * out_words + g] =
          PackWord(isa, sums, threshold + u0, width, 2, -totals[b], flip[g]);
    }
  }
}

}  // namespace pixel_table
}  // namespace core
}  // namespace bnn

#endif  // BNN_NATIVE_CORE_PIXEL_TABLE_H_
