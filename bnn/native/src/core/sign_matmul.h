// Products of a +-1 matrix held as sign bits with a float32 matrix, by table lookup (the backward
// pass of bnn's binary dense layer), beside their plain reference kernel (reference::SignMatmul)
// and with the Select function that maps an Isa to a variant.
//
//   s (m, q) +-1, f (q, p) float32 (or stored as (p, q)) -> s @ f (m, p) float32: row r of the
//   product is sum over k < q of s(r, k) * f[k]; s(r, k) is +1 where its sign bit is set and -1
//   where it is clear. The signs come packed as bnn.ops.bitpack.pack packs them: along k, (m,
//   ceil(q / 64)) words with bit k % 64 of word [r, k / 64]; or along r, (ceil(m / 64), q) words
//   with bit r % 64 of word [r / 64, k], which TurnSigns turns along k first.
//
// A matrix product costs q multiply-adds per output value. Here each group of 8 rows of f is
// first expanded into a table of its 256 signed sums (every choice of +1 or -1 for the 8 rows,
// built from two 16-entry tables of 4 rows each), so that an output value takes one table entry
// per byte of its row's signs: q / 8 additions. The tables of up to 16 byte groups (32 KiB per
// group for a block of 32 columns) stay in the core's level-2 cache while every output row
// reads them. Columns are taken 32 at a time; the work is split (PlanFor) over the caller's
// threads by column blocks where there are many of them, else by byte groups, whose partial
// products are then summed (and transposed, with transpose_output: SumPartials). Signs packed
// along r are first turned along k by 64x64 bit transposes.
//
// The sums are float32 additions in another order than a matrix product's, so results agree
// with one to rounding, not bit for bit (exactly where every partial sum is exact, as for small
// integers). "avx2" runs the loops on 256-bit registers (so does "avx512"); "generic" is the same
// code for any CPU.
#ifndef BNN_NATIVE_CORE_SIGN_MATMUL_H_
#define BNN_NATIVE_CORE_SIGN_MATMUL_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/bits.h"
#include "core/cpu.h"

namespace bnn {
namespace core {
namespace reference {

// out = s @ f, float32, for s (m, q) given by `signs` (+1 where a bit is set, else -1) packed
// along q, (m, ceil(q / 64)) words, or, with signs_along_m, along m, (ceil(m / 64), q) words;
// f (q, p), or stored as (p, q) with f_transposed; out (m, p), or (p, m) with transpose_output.
// Each value is summed in double over k in order and rounded once to float.
inline void SignMatmul(const int64_t* signs, bool signs_along_m, const float* f,
                       bool f_transposed, int64_t m, int64_t q, int64_t p,
                       bool transpose_output, float* out) {
  const int64_t q_words = WordsFor(q);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < p; ++c) {
      double sum = 0.0;
      for (int64_t k = 0; k < q; ++k) {
        const bool plus = signs_along_m ? GetBit(signs + (r / 64) * q + k, r % 64)
                                        : GetBit(signs + r * q_words, k);
        const double value = f_transposed ? f[c * q + k] : f[k * p + c];
        sum += plus ? value : -value;
      }
      out[transpose_output ? c * m + r : r * p + c] = static_cast<float>(sum);
    }
}

}  // namespace reference

namespace sign_matmul {

constexpr int64_t kLanes = 8;                // floats per vector
constexpr int64_t kBlock = 32;               // columns per block: 4 vectors
constexpr int64_t kGroupBytes = 16;          // byte groups whose tables are held at once
constexpr int64_t kTable = 256 * kBlock;     // floats in one byte group's table

typedef float Vec __attribute__((vector_size(32)));

BNN_ALWAYS_INLINE Vec Load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

BNN_ALWAYS_INLINE void Store(float* p, Vec v) { std::memcpy(p, &v, sizeof(v)); }

struct Problem {
  const uint8_t* patterns;
  int64_t m, bytes;     // patterns: (m, bytes), byte k / 8 of row r holding s(r, k) in bit k % 8
  const float* f;
  int64_t q, p;         // f: (q, p)
  bool f_transposed;    // f stored as (p, q)
  int64_t groups() const { return (q + 7) / 8; }
  int64_t blocks() const { return (p + kBlock - 1) / kBlock; }
};

// The 256 signed sums of rows 8 * g ... 8 * g + 7 of f (rows past q count as zero), columns
// col ... col + kBlock (past p: zero), into table[byte * kBlock + column].
BNN_ALWAYS_INLINE void BuildTable(const Problem& pr, int64_t g, int64_t col, float* table) {
  alignas(64) float halves[2][16 * kBlock];
  alignas(64) float rows[4][kBlock];
  const int64_t width = std::min(kBlock, pr.p - col);
  for (int half = 0; half < 2; ++half) {
    for (int i = 0; i < 4; ++i) {
      const int64_t row = 8 * g + 4 * half + i;
      std::fill(rows[i], rows[i] + kBlock, 0.0f);
      if (row >= pr.q) continue;
      if (!pr.f_transposed) {
        std::memcpy(rows[i], pr.f + row * pr.p + col, width * sizeof(float));
      } else {
        for (int64_t c = 0; c < width; ++c) rows[i][c] = pr.f[(col + c) * pr.q + row];
      }
    }
    BNN_UNROLL8
    for (int64_t v = 0; v < kBlock; v += kLanes) {
      Vec t[16];
      const Vec first = Load(rows[0] + v);
      t[0] = -first;
      t[1] = first;
      BNN_UNROLL8
      for (int i = 1; i < 4; ++i) {
        const Vec r = Load(rows[i] + v);
        const int h = 1 << i;
        BNN_UNROLL8
        for (int e = 0; e < h; ++e) {
          t[e + h] = t[e] + r;
          t[e] = t[e] - r;
        }
      }
      BNN_UNROLL8
      for (int e = 0; e < 16; ++e) Store(halves[half] + e * kBlock + v, t[e]);
    }
  }
  for (int hi = 0; hi < 16; ++hi)
    for (int lo = 0; lo < 16; ++lo) {
      float* out = table + (hi * 16 + lo) * kBlock;
      BNN_UNROLL8
      for (int64_t v = 0; v < kBlock; v += kLanes)
        Store(out + v, Load(halves[1] + hi * kBlock + v) + Load(halves[0] + lo * kBlock + v));
    }
}

// out rows first ... last (row stride `stride`, kBlock columns from `out`) += (or =, where
// `fresh`) the sums of the tables of byte groups g0 ... g0 + n.
BNN_ALWAYS_INLINE void Accumulate(const Problem& pr, const float* tables, int64_t g0, int64_t n,
                                  float* out, int64_t stride, int64_t first, int64_t last,
                                  bool fresh) {
  int64_t r = first;
  for (; r + 2 <= last; r += 2) {
    const uint8_t* a0 = pr.patterns + r * pr.bytes + g0;
    const uint8_t* a1 = a0 + pr.bytes;
    float* o0 = out + r * stride;
    float* o1 = o0 + stride;
    Vec x[4], y[4];
    BNN_UNROLL8
    for (int v = 0; v < 4; ++v) {
      x[v] = fresh ? Vec{} : Load(o0 + v * kLanes);
      y[v] = fresh ? Vec{} : Load(o1 + v * kLanes);
    }
    for (int64_t g = 0; g < n; ++g) {
      const float* t0 = tables + g * kTable + a0[g] * kBlock;
      const float* t1 = tables + g * kTable + a1[g] * kBlock;
      BNN_UNROLL8
      for (int v = 0; v < 4; ++v) {
        x[v] += Load(t0 + v * kLanes);
        y[v] += Load(t1 + v * kLanes);
      }
    }
    BNN_UNROLL8
    for (int v = 0; v < 4; ++v) {
      Store(o0 + v * kLanes, x[v]);
      Store(o1 + v * kLanes, y[v]);
    }
  }
  for (; r < last; ++r) {
    const uint8_t* a0 = pr.patterns + r * pr.bytes + g0;
    float* o0 = out + r * stride;
    Vec x[4];
    BNN_UNROLL8
    for (int v = 0; v < 4; ++v) x[v] = fresh ? Vec{} : Load(o0 + v * kLanes);
    for (int64_t g = 0; g < n; ++g) {
      const float* t0 = tables + g * kTable + a0[g] * kBlock;
      BNN_UNROLL8
      for (int v = 0; v < 4; ++v) x[v] += Load(t0 + v * kLanes);
    }
    BNN_UNROLL8
    for (int v = 0; v < 4; ++v) Store(o0 + v * kLanes, x[v]);
  }
}

// Column blocks b0 ... b1 over byte groups g_first ... g_last, into `out` (rows of `stride`
// floats, every block whole: stride >= blocks() * kBlock).
BNN_ALWAYS_INLINE void Blocks(const Problem& pr, int64_t b0, int64_t b1, int64_t g_first,
                              int64_t g_last, float* out, int64_t stride, float* tables) {
  for (int64_t b = b0; b < b1; ++b)
    for (int64_t g0 = g_first; g0 < g_last; g0 += kGroupBytes) {
      const int64_t n = std::min(kGroupBytes, g_last - g0);
      for (int64_t g = 0; g < n; ++g) BuildTable(pr, g0 + g, b * kBlock, tables + g * kTable);
      Accumulate(pr, tables, g0, n, out + b * kBlock, stride, 0, pr.m, g0 == g_first);
    }
}

// Blocks for any CPU. Reference: reference::SignMatmul.
inline void BlocksGeneric(const Problem& pr, int64_t b0, int64_t b1, int64_t g_first,
                          int64_t g_last, float* out, int64_t stride, float* tables) {
  Blocks(pr, b0, b1, g_first, g_last, out, stride, tables);
}

#ifdef BNN_X86
// Blocks on 256-bit registers. Reference: reference::SignMatmul.
BNN_TARGET_AVX2 inline void BlocksAvx2(const Problem& pr, int64_t b0, int64_t b1,
                                       int64_t g_first, int64_t g_last, float* out,
                                       int64_t stride, float* tables) {
  Blocks(pr, b0, b1, g_first, g_last, out, stride, tables);
}
#endif

// The variant that `isa` runs: BlocksAvx2 for kAvx2 and kAvx512, BlocksGeneric for kGeneric.
using BlocksFn = void (*)(const Problem&, int64_t, int64_t, int64_t, int64_t, float*, int64_t,
                          float*);
inline BlocksFn Select(Isa isa) {
#ifdef BNN_X86
  if (isa != kGeneric) return BlocksAvx2;
#endif
  return BlocksGeneric;
}

// Whether this CPU runs what Select picks for `isa`: the AVX2 code for kAvx2 and kAvx512.
inline bool CpuRuns(Isa isa) { return isa == kGeneric || HasAvx2(); }

// Signs packed along the rows, (ceil(m / 64), q) words, turned along k: row words rw in [first,
// last) into out (ceil(m / 64) * 64, ceil(q / 64)), row r's bits in out[r * ceil(q / 64) ...].
inline void TurnSigns(const uint64_t* words, int64_t q, int64_t first, int64_t last,
                      uint64_t* out) {
  const int64_t q_words = (q + 63) / 64;
  uint64_t block[64];
  for (int64_t rw = first; rw < last; ++rw)
    for (int64_t kw = 0; kw < q_words; ++kw) {
      const int64_t n = std::min<int64_t>(64, q - kw * 64);
      for (int64_t t = 0; t < n; ++t) block[t] = words[rw * q + kw * 64 + t];
      std::fill(block + n, block + 64, 0);
      Transpose64(block);
      for (int64_t i = 0; i < 64; ++i) out[(rw * 64 + i) * q_words + kw] = block[i];
    }
}

// How a product's work is split over `threads` threads, in `parts` parts. Many column blocks:
// each part takes whole blocks over every byte group (by_blocks), straight into the output where
// its rows are whole blocks and untransposed (direct). Else each takes a range of byte groups
// over every block, into its own partial product of (m, stride) floats, which SumPartials adds.
struct Plan {
  bool by_blocks, direct;
  int64_t parts, stride;
  int64_t partials() const { return by_blocks ? 1 : parts; }  // partial products to sum
};

inline Plan PlanFor(const Problem& pr, int64_t threads, bool transpose_output) {
  const int64_t blocks = pr.blocks(), groups = pr.groups();
  Plan plan;
  plan.by_blocks = blocks >= 2 * threads;
  plan.parts = plan.by_blocks ? std::min(threads, blocks) : std::min(threads, groups);
  plan.stride = blocks * kBlock;
  plan.direct = plan.by_blocks && !transpose_output && pr.p == plan.stride;
  return plan;
}

// Floats of table space per part (one part's tables start on a cache line within it).
constexpr int64_t kPartTables = kGroupBytes * kTable + 16;

// Rough cycles per part: a lookup-add per row, byte group and column and 256 table entries per
// byte group and column, 8 columns to a vector (a small product stays on one thread).
inline int64_t PartCost(const Problem& pr, const Plan& plan) {
  return (pr.m + 256) * pr.groups() * plan.stride / 8 / plan.parts + 1;
}

inline float* Aligned(float* p) {
  return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t{63});
}

// Parts [first, last) of the product with `run` (from Select), into `partial` (the output where
// plan.direct, else plan.partials() products of (m, plan.stride)), each with its tables in
// all_tables + part * kPartTables.
inline void RunParts(BlocksFn run, const Problem& pr, const Plan& plan, float* partial,
                     float* all_tables, int64_t first, int64_t last) {
  const int64_t blocks = pr.blocks(), groups = pr.groups();
  const int64_t parts = plan.parts, stride = plan.stride;
  for (int64_t part = first; part < last; ++part) {
    float* tables = Aligned(all_tables + part * kPartTables);
    if (plan.by_blocks)
      run(pr, blocks * part / parts, blocks * (part + 1) / parts, 0, groups, partial, stride,
          tables);
    else
      run(pr, 0, blocks, groups * part / parts, groups * (part + 1) / parts,
          partial + part * pr.m * stride, stride, tables);
  }
}

constexpr int64_t kSumRows = 64;  // rows per task of SumPartials

// Sums the partial products (and transposes them), a block of kSumRows rows per task: blocks
// [first, last) into result (m, p), or (p, m) with transpose_output.
inline void SumPartials(const Problem& pr, const Plan& plan, const float* partial,
                        bool transpose_output, float* result, int64_t first, int64_t last) {
  const int64_t summed = plan.partials(), stride = plan.stride, rows = kSumRows;
  for (int64_t block = first; block < last; ++block) {
    const int64_t r0 = block * rows, r1 = std::min(pr.m, r0 + rows);
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = 0; c < pr.p; ++c) {
        float sum = partial[r * stride + c];
        for (int64_t s = 1; s < summed; ++s) sum += partial[(s * pr.m + r) * stride + c];
        result[transpose_output ? c * pr.m + r : r * pr.p + c] = sum;
      }
    }
  }
}

}  // namespace sign_matmul
}  // namespace core
}  // namespace bnn

#endif  // BNN_NATIVE_CORE_SIGN_MATMUL_H_
