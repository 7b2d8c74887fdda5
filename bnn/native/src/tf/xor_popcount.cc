// Native xor-popcount kernels for bnn's packed inference (see bnn/kernels.py, which compiles this
// file with the host's compiler on first use and loads it with tf.load_op_library).
//
// Packed operands follow bnn.packing.pack_bits: bit i of a +-1 vector is 1 for +1 and 0 for -1,
// 64 bits to an int64 word, least significant bit first, pad bits 0.
//
//   BnnXorPopcount(x (batch, words), w (words, units)) -> (batch, units) int32
//       mismatches[b, u] = sum_k popcount(x[b, k] XOR w[k, u]); the +-1 dot product is
//       n - 2 * mismatches.
//   BnnXorPopcountSign(x, w, threshold (units) int32, flip (ceil(units / 64)) int64, n)
//       -> (batch, ceil(units / 64)) int64: bit u of row b is [n - 2 * mismatches >= threshold[u]],
//       then XOR flip; pad bits past `units` are 0.
//   BnnXorPopcountAffine(x, w, scale (units) float32, shift (units) float32, n)
//       -> (batch, units) float32 logits: float32(double(n - 2 * mismatches) * scale + shift), the
//       product exact in double and the sum rounded once (as XLA's fused multiply-add on CPU).
//   BnnThresholdPack(a (batch, units) int32, threshold, flip) -> the same words for a >= threshold.
//   BnnPixelTableSign(u (batch, ...) uint8 or float, w (blocks, groups, 32) uint8, threshold,
//       flip) -> the same words for the exact integer product u . w of 8-bit pixels u (floats
//       encoded to pixels first) with +-1 weights, whose bits w holds by groups of 4 pixels.
//   BnnPackedDenseChain(u, table, threshold, flip, kernels, thresholds, flips, w, logit_scale,
//       logit_shift) -> float32 logits of a whole packed MLP in one call: BnnPixelTableSign, then
//       BnnXorPopcountSign for each hidden kernel (n: the units before it), then
//       BnnXorPopcountAffine, with the same results as those ops one after the other.
//   BnnXorPopcountConv2d(x (batch, h, w, words), w (kh * kw * words, units), kh, kw, sh, sw, n)
//       -> (batch, ho, wo, units) float32 or bfloat16 n - 2 * mismatches: the "valid" +-1
//       convolution of a padded input packed along its channels with a kernel packed along its
//       input channels, flattened over its taps (tap-major); each output position's row of taps
//       is gathered per block of rows, so no patch tensor is built.
//   BnnKernelVariants() -> the instruction-set variants this CPU runs, best last.
//
// Every op has an `isa` attribute: "generic" (plain C++), "avx2", "avx512" (AVX-512 with
// VPOPCNTDQ), or "auto" (the best this CPU runs). The vector variants are compiled with
// per-function target attributes, so one build serves every x86-64 CPU; an op refuses a variant
// the CPU lacks instead of faulting.
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
// The first layer on pixels (BnnPixelTableSign, see BuildTables) looks up, for each group of 4
// pixels, sums of their nibbles in 16-entry tables indexed by a unit's 4 weight bits: VPSHUFB
// serves 32 units at once (the AVX-512 variant runs the AVX2 code).
// Work is split over TensorFlow's intra-op threads in tiles of 64 units (one output word) by 36
// rows (8 examples for the first layer).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define BNN_X86 1
#define BNN_TARGET_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vpopcntdq")))
#define BNN_TARGET_AVX2 __attribute__((target("avx2")))
#endif

#include "native.h"
#include "tensorflow/core/util/work_sharder.h"

namespace bnn {
namespace {

constexpr int64_t kGroup = 64;  // units per output word and per unit of parallel work

// Fully unrolled loops let the compiler keep a tile's accumulators in registers (without it,
// GCC keeps a copy of the accumulator array on the stack and stores to it every iteration).
#if defined(__clang__)
#define BNN_UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define BNN_UNROLL _Pragma("GCC unroll 32")
#else
#define BNN_UNROLL
#endif

enum Isa { kGeneric = 0, kAvx2 = 1, kAvx512 = 2 };
const char* const kIsaNames[] = {"generic", "avx2", "avx512"};

bool Supported(Isa isa) {
#ifdef BNN_X86
  __builtin_cpu_init();
  if (isa == kAvx512)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vpopcntdq");
  if (isa == kAvx2) return __builtin_cpu_supports("avx2");
  return true;
#else
  return isa == kGeneric;
#endif
}

// The op's `variant` attribute as an Isa this CPU runs ("auto": the best one).
Status ResolveIsa(OpKernelConstruction* ctx, Isa* isa) {
  std::string name;
  TF_RETURN_IF_ERROR(ctx->GetAttr("isa", &name));
  if (name == "auto") {
    *isa = Supported(kAvx512) ? kAvx512 : Supported(kAvx2) ? kAvx2 : kGeneric;
    return Status();
  }
  *isa = name == "avx512" ? kAvx512 : name == "avx2" ? kAvx2 : kGeneric;
  if (!Supported(*isa))
    return InvalidArgument("kernel variant '", name, "' needs instructions this CPU lacks");
  return Status();
}

// ---- counting: counts[r * 64 + u] for rows r < rows of x and units u0 + u, u < width <= 64 ----

void CountGroupGeneric(const int64_t* x, const int64_t* w, int64_t rows, int64_t words,
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

BNN_TARGET_AVX512 void CountGroupAvx512(const int64_t* x, const int64_t* w, int64_t rows,
                                        int64_t words, int64_t units, int64_t u0, int64_t width,
                                        int32_t* counts) {
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

BNN_TARGET_AVX2 void CountGroupAvx2(const int64_t* lo, const int64_t* hi, const int64_t* w,
                                    int64_t rows, int64_t words, int64_t units, int64_t u0,
                                    int64_t width, int32_t* counts) {
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
// counts[r * 64 + (u - u0)].
void CountGroup(Isa isa, const Rows& x, const int64_t* w, int64_t row0, int64_t rows,
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
int64_t CostPerWord(Isa isa) { return isa == kAvx512 ? 16 : isa == kAvx2 ? 32 : 128; }

// ---- threshold packing: bit u = [scale * values[u] + offset >= threshold[u]] XOR flip ----------
// (scale is 1, 2 or -2, which turns counts into dot products)

int64_t PackWordGeneric(const int32_t* values, const int32_t* threshold, int64_t width,
                        int32_t scale, int32_t offset, int64_t flip) {
  uint64_t bits = 0;
  for (int64_t u = 0; u < width; ++u)
    bits |= static_cast<uint64_t>(scale * values[u] + offset >= threshold[u]) << u;
  return static_cast<int64_t>(bits) ^ flip;
}

#ifdef BNN_X86
BNN_TARGET_AVX512 int64_t PackWordAvx512(const int32_t* values, const int32_t* threshold,
                                         int64_t width, int32_t scale, int32_t offset,
                                         int64_t flip) {
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

BNN_TARGET_AVX2 int64_t PackWordAvx2(const int32_t* values, const int32_t* threshold,
                                     int64_t width, int32_t scale, int32_t offset, int64_t flip) {
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

int64_t PackWord(Isa isa, const int32_t* values, const int32_t* threshold, int64_t width,
                 int32_t scale, int32_t offset, int64_t flip) {
#ifdef BNN_X86
  if (isa == kAvx512) return PackWordAvx512(values, threshold, width, scale, offset, flip);
  if (isa == kAvx2) return PackWordAvx2(values, threshold, width, scale, offset, flip);
#endif
  return PackWordGeneric(values, threshold, width, scale, offset, flip);
}

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
int64_t LiveGroups(uint8_t* pixels, int64_t groups, int32_t* live) {
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

void BuildTables(const uint8_t* pixels, int64_t groups, uint8_t* tables) {
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
void TableSumsGeneric(const uint8_t* tables, const int32_t* live, int64_t count,
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
BNN_TARGET_AVX2 void BuildTablesAvx2(const uint8_t* pixels, int64_t groups, uint8_t* tables) {
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

template <bool kEvery>
BNN_TARGET_AVX2 void TableSumsAvx2(const uint8_t* tables, const int32_t* live, int64_t count,
                                   const uint8_t* w, int64_t groups, int64_t u0, int64_t width,
                                   int32_t* sums) {
  if (width > 32)  // u0 is a multiple of 64: whole blocks (pad units)
    return TableSumsTile<kEvery, 2>(tables, live, count, w, groups, u0 / 32, sums);
  TableSumsTile<kEvery, 1>(tables, live, count, w, groups, u0 / 32, sums);
}
#endif

// The AVX-512 variant runs the AVX2 code (every AVX-512 CPU has AVX2).
void Tables(Isa isa, const uint8_t* pixels, int64_t groups, uint8_t* tables) {
#ifdef BNN_X86
  if (isa != kGeneric) return BuildTablesAvx2(pixels, groups, tables);
#endif
  BuildTables(pixels, groups, tables);
}

// sums has room for 64 units (a whole output word); units past `width` get pad sums.
void TableSums(Isa isa, const uint8_t* tables, const int32_t* live, int64_t count,
               const uint8_t* w, int64_t groups, int64_t u0, int64_t width, int32_t* sums) {
#ifdef BNN_X86
  if (isa != kGeneric)
    return count == groups
               ? TableSumsAvx2<true>(tables, live, count, w, groups, u0, width, sums)
               : TableSumsAvx2<false>(tables, live, count, w, groups, u0, width, sums);
#endif
  TableSumsGeneric(tables, live, count, w, groups, u0, width, sums);
}

// ---- ops --------------------------------------------------------------------------------------

#define BNN_VARIANT_ATTR "isa: {'auto', 'generic', 'avx2', 'avx512'} = 'auto'"

Status MatrixShapes(InferenceContext* c, ShapeHandle* x, ShapeHandle* w) {
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, x));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, w));
  DimensionHandle words;
  return c->Merge(c->Dim(*x, 1), c->Dim(*w, 0), &words);
}

DimensionHandle WordsOf(InferenceContext* c, DimensionHandle units) {
  if (!c->ValueKnown(units)) return c->UnknownDim();
  return c->MakeDim((c->Value(units) + kGroup - 1) / kGroup);
}

REGISTER_OP("BnnXorPopcount")
    .Input("x: int64")
    .Input("w: int64")
    .Output("mismatches: int32")
    .Attr(BNN_VARIANT_ATTR)
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle x, w;
      TF_RETURN_IF_ERROR(MatrixShapes(c, &x, &w));
      c->set_output(0, c->Matrix(c->Dim(x, 0), c->Dim(w, 1)));
      return Status();
    });

REGISTER_OP("BnnXorPopcountSign")
    .Input("x: int64")
    .Input("w: int64")
    .Input("threshold: int32")
    .Input("flip: int64")
    .Attr("n: int")
    .Attr(BNN_VARIANT_ATTR)
    .Output("words: int64")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle x, w;
      TF_RETURN_IF_ERROR(MatrixShapes(c, &x, &w));
      c->set_output(0, c->Matrix(c->Dim(x, 0), WordsOf(c, c->Dim(w, 1))));
      return Status();
    });

REGISTER_OP("BnnXorPopcountAffine")
    .Input("x: int64")
    .Input("w: int64")
    .Input("scale: float")
    .Input("shift: float")
    .Attr("n: int")
    .Attr(BNN_VARIANT_ATTR)
    .Output("logits: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle x, w;
      TF_RETURN_IF_ERROR(MatrixShapes(c, &x, &w));
      c->set_output(0, c->Matrix(c->Dim(x, 0), c->Dim(w, 1)));
      return Status();
    });

REGISTER_OP("BnnThresholdPack")
    .Input("a: int32")
    .Input("threshold: int32")
    .Input("flip: int64")
    .Attr(BNN_VARIANT_ATTR)
    .Output("words: int64")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle a;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &a));
      c->set_output(0, c->Matrix(c->Dim(a, 0), WordsOf(c, c->Dim(a, 1))));
      return Status();
    });

REGISTER_OP("BnnPixelTableSign")
    .Input("u: T")
    .Input("w: uint8")
    .Input("threshold: int32")
    .Input("flip: int64")
    .Attr("T: {uint8, float}")
    .Attr("scale: float = 1.0")
    .Attr("offset: float = 0.0")
    .Attr(BNN_VARIANT_ATTR)
    .Output("words: int64")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle u, w, threshold;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 2, &u));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 3, &w));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &threshold));
      c->set_output(0, c->Matrix(c->Dim(u, 0), WordsOf(c, c->Dim(threshold, 0))));
      return Status();
    });

REGISTER_OP("BnnPackedDenseChain")
    .Input("u: T")
    .Input("table: uint8")
    .Input("threshold: int32")
    .Input("flip: int64")
    .Input("kernels: N * int64")
    .Input("thresholds: N * int32")
    .Input("flips: N * int64")
    .Input("w: int64")
    .Input("logit_scale: float")
    .Input("logit_shift: float")
    .Attr("N: int >= 0")
    .Attr("T: {uint8, float}")
    .Attr("scale: float = 1.0")
    .Attr("offset: float = 0.0")
    .Attr(BNN_VARIANT_ATTR)
    .Output("logits: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle u, w;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 2, &u));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(c->num_inputs() - 3), 2, &w));
      c->set_output(0, c->Matrix(c->Dim(u, 0), c->Dim(w, 1)));
      return Status();
    });

REGISTER_OP("BnnXorPopcountConv2d")
    .Input("x: int64")
    .Input("w: int64")
    .Attr("kh: int >= 1")
    .Attr("kw: int >= 1")
    .Attr("sh: int >= 1")
    .Attr("sw: int >= 1")
    .Attr("n: int")
    .Attr("T: {float, bfloat16}")
    .Attr(BNN_VARIANT_ATTR)
    .Output("y: T")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle x, w;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 4, &x));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &w));
      int kh, kw, sh, sw;
      TF_RETURN_IF_ERROR(c->GetAttr("kh", &kh));
      TF_RETURN_IF_ERROR(c->GetAttr("kw", &kw));
      TF_RETURN_IF_ERROR(c->GetAttr("sh", &sh));
      TF_RETURN_IF_ERROR(c->GetAttr("sw", &sw));
      auto out = [c](DimensionHandle d, int k, int s) {
        if (!c->ValueKnown(d)) return c->UnknownDim();
        return c->MakeDim(std::max<int64_t>(0, (c->Value(d) - k) / s + 1));
      };
      c->set_output(0, c->MakeShape({c->Dim(x, 0), out(c->Dim(x, 1), kh, sh),
                                     out(c->Dim(x, 2), kw, sw), c->Dim(w, 1)}));
      return Status();
    });

REGISTER_OP("BnnKernelVariants")
    .Output("variants: string")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(c->UnknownDim()));
      return Status();
    });

// Checks the shapes shared by the kernels; returns false after setting an error on ctx.
bool CheckThresholds(OpKernelContext* ctx, const Tensor& threshold, const Tensor& flip,
                     int64_t units) {
  const int64_t words = (units + kGroup - 1) / kGroup;
  if (threshold.dims() != 1 || threshold.dim_size(0) != units) {
    ctx->SetStatus(InvalidArgument("threshold must have shape (", units, "), got ",
                                   threshold.shape().DebugString()));
    return false;
  }
  if (flip.dims() != 1 || flip.dim_size(0) != words) {
    ctx->SetStatus(InvalidArgument("flip must have shape (", words, "), got ",
                                   flip.shape().DebugString()));
    return false;
  }
  return true;
}

using Workers = ::tensorflow::thread::ThreadPool;

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

// x (batch, words) times w (words, units), over the intra-op threads, into e.out.
void RunProduct(Workers* workers, Isa isa, const int64_t* x, int64_t batch, int64_t words,
                const int64_t* w, int64_t units, const Epilogue& e) {
  if (batch == 0 || units == 0) return;
  const Rows rows_in(x, batch, words, isa);
  const int64_t out_words = (units + kGroup - 1) / kGroup;
  int32_t* counts_out = e.mode == kCounts ? static_cast<int32_t*>(e.out) : nullptr;
  int64_t* words_out = e.mode == kSign ? static_cast<int64_t*>(e.out) : nullptr;
  float* logits_out = e.mode == kAffine ? static_cast<float*>(e.out) : nullptr;

  // Units of work: (group of 64 units, chunk of up to kChunk rows), chunk-major, so that
  // neighbouring work shares x rows and a single group still splits over threads.
  constexpr int64_t kChunk = 36;
  const int64_t chunks = (batch + kChunk - 1) / kChunk;
  auto work = [&](int64_t first, int64_t last) {
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
  };
  // Cost per item in rough cycles, for the real rows (one example is not worth a thread).
  const int64_t cost = std::max<int64_t>(1, std::min(kChunk, batch) * words * CostPerWord(isa));
  workers->ParallelFor(chunks * out_words, cost, work);
}

// Checks a product's operands, x (batch, words) and w (words, units); false after setting an
// error on ctx.
bool CheckProduct(OpKernelContext* ctx, const Tensor& x, const Tensor& w, const char* x_name,
                  const char* w_name) {
  if (x.dims() != 2 || w.dims() != 2) {
    ctx->SetStatus(InvalidArgument(x_name, " and ", w_name, " must be matrices, got ",
                                   x.shape().DebugString(), " and ", w.shape().DebugString()));
    return false;
  }
  if (w.dim_size(0) != x.dim_size(1)) {
    ctx->SetStatus(InvalidArgument(x_name, " has ", x.dim_size(1), " words per row but ", w_name,
                                   " has ", w.dim_size(0)));
    return false;
  }
  return true;
}

// Checks an affine map's scale and shift for `units` units; false after setting an error.
bool CheckAffine(OpKernelContext* ctx, const Tensor& scale, const Tensor& shift, int64_t units) {
  for (const Tensor* t : {&scale, &shift})
    if (t->dims() != 1 || t->dim_size(0) != units) {
      ctx->SetStatus(InvalidArgument(t == &scale ? "scale" : "shift", " must have shape (",
                                     units, "), got ", t->shape().DebugString()));
      return false;
    }
  return true;
}

Workers* IntraOpThreads(OpKernelContext* ctx) {
  return ctx->device()->tensorflow_cpu_worker_threads()->workers;
}

class XorPopcountOp : public OpKernel {
 public:
  explicit XorPopcountOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ResolveIsa(ctx, &isa_));
    const std::string& op = type_string();
    mode_ = op == "BnnXorPopcountSign" ? kSign : op == "BnnXorPopcountAffine" ? kAffine : kCounts;
    if (mode_ != kCounts) OP_REQUIRES_OK(ctx, ctx->GetAttr("n", &n_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    const Tensor& w = ctx->input(1);
    if (!CheckProduct(ctx, x, w, "x", "w")) return;
    const int64_t batch = x.dim_size(0), units = w.dim_size(1);
    const int64_t out_words = (units + kGroup - 1) / kGroup;
    Epilogue e;
    e.mode = mode_;
    e.n = n_;
    if (mode_ == kSign) {
      if (!CheckThresholds(ctx, ctx->input(2), ctx->input(3), units)) return;
      e.threshold = ctx->input(2).flat<int32_t>().data();
      e.flip = ctx->input(3).flat<int64_t>().data();
    } else if (mode_ == kAffine) {
      if (!CheckAffine(ctx, ctx->input(2), ctx->input(3), units)) return;
      e.scale = ctx->input(2).flat<float>().data();
      e.shift = ctx->input(3).flat<float>().data();
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({batch, mode_ == kSign ? out_words : units}), &out));
    e.out = out->data();
    RunProduct(IntraOpThreads(ctx), isa_, x.flat<int64_t>().data(), batch, x.dim_size(1),
               w.flat<int64_t>().data(), units, e);
  }

 private:
  Isa isa_ = kGeneric;
  Mode mode_ = kCounts;
  int64_t n_ = 0;
};

class ThresholdPackOp : public OpKernel {
 public:
  explicit ThresholdPackOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ResolveIsa(ctx, &isa_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& a = ctx->input(0);
    OP_REQUIRES(ctx, a.dims() == 2,
                InvalidArgument("a must be a matrix, got ", a.shape().DebugString()));
    const int64_t batch = a.dim_size(0), units = a.dim_size(1);
    if (!CheckThresholds(ctx, ctx->input(1), ctx->input(2), units)) return;
    const int64_t out_words = (units + kGroup - 1) / kGroup;
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({batch, out_words}), &out));
    const int32_t* ap = a.flat<int32_t>().data();
    const int32_t* threshold = ctx->input(1).flat<int32_t>().data();
    const int64_t* flip = ctx->input(2).flat<int64_t>().data();
    int64_t* words_out = out->flat<int64_t>().data();
    const Isa isa = isa_;
    auto work = [&](int64_t first, int64_t last) {
      for (int64_t b = first; b < last; ++b)
        for (int64_t g = 0; g < out_words; ++g) {
          const int64_t u0 = g * kGroup;
          words_out[b * out_words + g] = PackWord(isa, ap + b * units + u0, threshold + u0,
                                                  std::min(kGroup, units - u0), 1, 0, flip[g]);
        }
    };
    // About one vector compare per 16 units: cheap enough that small batches stay on one
    // thread (waking another costs more than the work).
    ctx->device()->tensorflow_cpu_worker_threads()->workers->ParallelFor(
        batch, std::max<int64_t>(1, units / 16), work);
  }

 private:
  Isa isa_ = kGeneric;
};

// Pixel u in [0, 255]: uint8 as is; float x encoded as clip(round_half_even((x - offset) / scale)),
// the float32 arithmetic of bnn.packing's encoder.
inline uint32_t Pixel(uint8_t u, float, float) { return u; }
inline uint32_t Pixel(float x, float scale, float offset) {
  const float u = std::nearbyint((x - offset) / scale);
  return static_cast<uint32_t>(std::min(std::max(u, 0.0f), 255.0f));
}

// Checks a first layer's pixels u (batch, ...) and weight table w (blocks, groups, 32) against
// its threshold and flip; sets *units and *n (values per example); false after setting an error.
bool CheckPixelTable(OpKernelContext* ctx, const Tensor& u, const Tensor& w,
                     const Tensor& threshold, const Tensor& flip, int64_t* units, int64_t* n) {
  if (u.dims() < 2 || w.dims() != 3 || w.dim_size(2) != 32) {
    ctx->SetStatus(InvalidArgument("u must have a batch axis and w the shape (blocks, groups, "
                                   "32), got ", u.shape().DebugString(), " and ",
                                   w.shape().DebugString()));
    return false;
  }
  const int64_t batch = u.dim_size(0), groups = w.dim_size(1);
  *units = threshold.dims() == 1 ? threshold.dim_size(0) : -1;
  *n = batch ? u.NumElements() / batch : 0;
  if (batch != 0 && groups != (*n + 3) / 4) {
    ctx->SetStatus(InvalidArgument("u has ", *n, " values per example, which make ",
                                   (*n + 3) / 4, " groups of 4, but w has ", groups));
    return false;
  }
  if (w.dim_size(0) != (*units + 63) / 64 * 2) {
    ctx->SetStatus(InvalidArgument("w has ", w.dim_size(0), " blocks of 32 units, but ", *units,
                                   " units (the threshold's length) need ",
                                   (*units + 63) / 64 * 2));
    return false;
  }
  return CheckThresholds(ctx, threshold, flip, *units);
}

// First layer on 8-bit pixels u (batch, n) (uint8, or floats encoded to them with scale and
// offset) and +-1 weights with bits b: z = u . w = 2 * (u . b) - sum(u), exact, with u . b from
// pixel tables (see BuildTables); output bits [z >= threshold] XOR flip, packed, into words_out
// (batch, ceil(units / 64)). w holds the weight bits of each group of 4 pixels and unit as one
// byte, (blocks, groups, 32) with blocks = 2 * ceil(units / 64) (whole output words) and
// groups = ceil(n / 4).
template <typename T>
void RunPixelTableSign(Workers* workers, Isa isa, const T* up, int64_t batch, int64_t n,
                       const uint8_t* wp, int64_t groups, int64_t units,
                       const int32_t* threshold, const int64_t* flip, float scale,
                       float offset, int64_t* words_out) {
  if (batch == 0 || units == 0) return;
  const int64_t out_words = (units + kGroup - 1) / kGroup;
  std::vector<uint8_t> tables(batch * groups * 32);
  std::vector<int32_t> totals(batch), live(batch * groups), counts(batch);
  auto prepare = [&](int64_t first, int64_t last) {
    std::vector<uint8_t> pixels(groups * 4, 0);  // one example, zero-padded to whole groups
    for (int64_t b = first; b < last; ++b) {
      int32_t total = 0;
      for (int64_t i = 0; i < n; ++i) {
        pixels[i] = static_cast<uint8_t>(Pixel(up[b * n + i], scale, offset));
        total += pixels[i];
      }
      totals[b] = total;
      const int64_t count = LiveGroups(pixels.data(), groups, live.data() + b * groups);
      counts[b] = static_cast<int32_t>(count);
      Tables(isa, pixels.data(), count, tables.data() + b * groups * 32);
    }
  };
  workers->ParallelFor(batch, groups * 64, prepare);
  constexpr int64_t kChunk = 8;  // examples per unit of work
  const int64_t chunks = (batch + kChunk - 1) / kChunk;
  auto work = [&](int64_t first, int64_t last) {
    int32_t sums[kGroup];
    for (int64_t item = first; item < last; ++item) {
      const int64_t g = item % out_words, b0 = (item / out_words) * kChunk;
      const int64_t u0 = g * kGroup, width = std::min(kGroup, units - u0);
      for (int64_t b = b0; b < std::min(batch, b0 + kChunk); ++b) {
        TableSums(isa, tables.data() + b * groups * 32, live.data() + b * groups, counts[b],
                  wp, groups, u0, width, sums);
        words_out[b * out_words + g] =
            PackWord(isa, sums, threshold + u0, width, 2, -totals[b], flip[g]);
      }
    }
  };
  const int64_t cost = std::max<int64_t>(
      1, std::min(kChunk, batch) * groups * (isa == kGeneric ? 256 : 8));
  workers->ParallelFor(chunks * out_words, cost, work);
}

// What the ops on pixels share: the encoding of float inputs (scale, offset) and the variant.
class PixelOp : public OpKernel {
 public:
  explicit PixelOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("scale", &scale_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("offset", &offset_));
    OP_REQUIRES_OK(ctx, ResolveIsa(ctx, &isa_));
  }

 protected:
  float scale_ = 1.0f, offset_ = 0.0f;
  Isa isa_ = kGeneric;
};

template <typename T>
class PixelTableSignOp : public PixelOp {
 public:
  using PixelOp::PixelOp;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& u = ctx->input(0);
    const Tensor& w = ctx->input(1);
    int64_t units = 0, n = 0;
    if (!CheckPixelTable(ctx, u, w, ctx->input(2), ctx->input(3), &units, &n)) return;
    const int64_t batch = u.dim_size(0);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({batch, (units + kGroup - 1) / kGroup}), &out));
    RunPixelTableSign(IntraOpThreads(ctx), isa_, u.flat<T>().data(), batch, n,
                      w.flat<uint8_t>().data(), w.dim_size(1), units,
                      ctx->input(2).flat<int32_t>().data(), ctx->input(3).flat<int64_t>().data(),
                      scale_, offset_, out->flat<int64_t>().data());
  }
};

// A packed MLP in one op: the pixel-table first layer, N hidden xor-popcount layers to packed
// signs (each reading the previous layer's units as its n), and the logits' affine layer. One
// call instead of N + 2 saves each op's dispatch, which dominates small batches.
template <typename T>
class PackedDenseChainOp : public PixelOp {
 public:
  using PixelOp::PixelOp;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& u = ctx->input(0);
    const Tensor& table = ctx->input(1);
    int64_t units = 0, n = 0;
    if (!CheckPixelTable(ctx, u, table, ctx->input(2), ctx->input(3), &units, &n)) return;
    ::tensorflow::OpInputList kernels, thresholds, flips;
    OP_REQUIRES_OK(ctx, ctx->input_list("kernels", &kernels));
    OP_REQUIRES_OK(ctx, ctx->input_list("thresholds", &thresholds));
    OP_REQUIRES_OK(ctx, ctx->input_list("flips", &flips));
    const Tensor& w_last = ctx->input(4 + 3 * kernels.size());
    const Tensor& scale = ctx->input(5 + 3 * kernels.size());
    const Tensor& shift = ctx->input(6 + 3 * kernels.size());
    const int64_t batch = u.dim_size(0);
    // shapes first, so that a mismatch fails before any work
    std::vector<int64_t> widths = {units};
    for (int i = 0; i <= kernels.size(); ++i) {
      const Tensor& w = i < kernels.size() ? kernels[i] : w_last;
      OP_REQUIRES(ctx, w.dims() == 2 && w.dim_size(0) == (widths.back() + kGroup - 1) / kGroup,
                  InvalidArgument(i < kernels.size() ? "kernels[" + std::to_string(i) + "]"
                                                     : std::string("w"),
                                  " must have ", (widths.back() + kGroup - 1) / kGroup,
                                  " rows of words for ", widths.back(), " inputs, got ",
                                  w.shape().DebugString()));
      widths.push_back(w.dim_size(1));
      if (i < kernels.size() && !CheckThresholds(ctx, thresholds[i], flips[i], widths.back()))
        return;
    }
    if (!CheckAffine(ctx, scale, shift, widths.back())) return;
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({batch, widths.back()}), &out));
    Workers* workers = IntraOpThreads(ctx);
    std::vector<int64_t> a(batch * ((units + kGroup - 1) / kGroup)), b;
    RunPixelTableSign(workers, isa_, u.flat<T>().data(), batch, n, table.flat<uint8_t>().data(),
                      table.dim_size(1), units, ctx->input(2).flat<int32_t>().data(),
                      ctx->input(3).flat<int64_t>().data(), scale_, offset_, a.data());
    for (int i = 0; i <= kernels.size(); ++i) {
      const Tensor& w = i < kernels.size() ? kernels[i] : w_last;
      const int64_t in = widths[i], width = widths[i + 1];
      Epilogue e;
      e.n = in;
      if (i < kernels.size()) {
        b.resize(batch * ((width + kGroup - 1) / kGroup));  // every word is written
        e.mode = kSign;
        e.threshold = thresholds[i].flat<int32_t>().data();
        e.flip = flips[i].flat<int64_t>().data();
        e.out = b.data();
      } else {
        e.mode = kAffine;
        e.scale = scale.flat<float>().data();
        e.shift = shift.flat<float>().data();
        e.out = out->data();
      }
      RunProduct(workers, isa_, a.data(), batch, (in + kGroup - 1) / kGroup,
                 w.flat<int64_t>().data(), width, e);
      a.swap(b);
    }
  }
};

// The "valid" +-1 convolution of packed operands as dot products n - 2 * mismatches in T. Work
// items are (block of kChunk output positions, group of 64 units), block-major; a thread gathers
// a block's rows of kh * kw * words words (tap-major, as w is flattened) once for all the groups
// of that block it runs.
template <typename T>
class XorPopcountConv2dOp : public OpKernel {
 public:
  explicit XorPopcountConv2dOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ResolveIsa(ctx, &isa_));
    int kh, kw, sh, sw;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("kh", &kh));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("kw", &kw));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("sh", &sh));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("sw", &sw));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("n", &n_));
    kh_ = kh, kw_ = kw, sh_ = sh, sw_ = sw;
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    const Tensor& w = ctx->input(1);
    OP_REQUIRES(ctx, x.dims() == 4 && w.dims() == 2,
                InvalidArgument("x must be (batch, h, w, words) and w a matrix, got ",
                                x.shape().DebugString(), " and ", w.shape().DebugString()));
    const int64_t batch = x.dim_size(0), h = x.dim_size(1), wd = x.dim_size(2);
    const int64_t words = x.dim_size(3), units = w.dim_size(1);
    const int64_t row_words = kh_ * kw_ * words;
    OP_REQUIRES(ctx, w.dim_size(0) == row_words,
                InvalidArgument("a ", kh_, "x", kw_, " kernel over ", words, " words per pixel "
                                "needs ", row_words, " rows of w, got ", w.dim_size(0)));
    const int64_t ho = h >= kh_ ? (h - kh_) / sh_ + 1 : 0;
    const int64_t wo = wd >= kw_ ? (wd - kw_) / sw_ + 1 : 0;
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({batch, ho, wo, units}), &out));
    const int64_t positions = batch * ho * wo;
    if (positions == 0 || units == 0) return;
    const int64_t* xp = x.flat<int64_t>().data();
    const int64_t* wp = w.flat<int64_t>().data();
    T* yp = out->flat<T>().data();
    const int64_t out_words = (units + kGroup - 1) / kGroup;
    const int64_t kh = kh_, kw = kw_, sh = sh_, sw = sw_, n = n_;
    const Isa isa = isa_;
    constexpr int64_t kChunk = 36;
    const int64_t chunks = (positions + kChunk - 1) / kChunk;
    auto work = [&](int64_t first, int64_t last) {
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
            row[k] = static_cast<T>(static_cast<float>(n - 2 * static_cast<int64_t>(c[k])));
        }
      }
    };
    const int64_t cost =
        std::max<int64_t>(1, std::min(kChunk, positions) * row_words * CostPerWord(isa_));
    ctx->device()->tensorflow_cpu_worker_threads()->workers->ParallelFor(
        chunks * out_words, cost, work);
  }

 private:
  Isa isa_ = kGeneric;
  int64_t kh_ = 1, kw_ = 1, sh_ = 1, sw_ = 1, n_ = 0;
};

class KernelVariantsOp : public OpKernel {
 public:
  explicit KernelVariantsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    std::vector<const char*> names;
    for (Isa isa : {kGeneric, kAvx2, kAvx512})
      if (Supported(isa)) names.push_back(kIsaNames[isa]);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({static_cast<int64_t>(names.size())}), &out));
    for (size_t i = 0; i < names.size(); ++i) out->flat<::tensorflow::tstring>()(i) = names[i];
  }
};

REGISTER_KERNEL_BUILDER(Name("BnnXorPopcount").Device(DEVICE_CPU), XorPopcountOp);
REGISTER_KERNEL_BUILDER(Name("BnnXorPopcountSign").Device(DEVICE_CPU), XorPopcountOp);
REGISTER_KERNEL_BUILDER(Name("BnnXorPopcountAffine").Device(DEVICE_CPU), XorPopcountOp);
REGISTER_KERNEL_BUILDER(Name("BnnThresholdPack").Device(DEVICE_CPU), ThresholdPackOp);
REGISTER_KERNEL_BUILDER(
    Name("BnnPixelTableSign").Device(DEVICE_CPU).TypeConstraint<uint8_t>("T"),
    PixelTableSignOp<uint8_t>);
REGISTER_KERNEL_BUILDER(
    Name("BnnPixelTableSign").Device(DEVICE_CPU).TypeConstraint<float>("T"),
    PixelTableSignOp<float>);
REGISTER_KERNEL_BUILDER(
    Name("BnnPackedDenseChain").Device(DEVICE_CPU).TypeConstraint<uint8_t>("T"),
    PackedDenseChainOp<uint8_t>);
REGISTER_KERNEL_BUILDER(
    Name("BnnPackedDenseChain").Device(DEVICE_CPU).TypeConstraint<float>("T"),
    PackedDenseChainOp<float>);
REGISTER_KERNEL_BUILDER(
    Name("BnnXorPopcountConv2d").Device(DEVICE_CPU).TypeConstraint<float>("T"),
    XorPopcountConv2dOp<float>);
REGISTER_KERNEL_BUILDER(
    Name("BnnXorPopcountConv2d").Device(DEVICE_CPU).TypeConstraint<::tensorflow::bfloat16>("T"),
    XorPopcountConv2dOp<::tensorflow::bfloat16>);
REGISTER_KERNEL_BUILDER(Name("BnnKernelVariants").Device(DEVICE_CPU), KernelVariantsOp);

}  // namespace
}  // namespace bnn
