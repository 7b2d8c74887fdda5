// Products of a ±1 matrix held as sign bits with a float32 matrix, by table lookup, for the
// backward pass of bnn's binary dense layer (see bnn/bitops.py), built into the same library as
// xor_popcount.cc by bnn/kernels.py.
//
//   BnnSignMatmul(signs: int64, f: float, rows, transpose_signs, transpose_f, transpose_output,
//                 isa) -> float (m, p), or (p, m) with transpose_output:
//       row r of the product is sum over k < q of s(r, k) * f[k], for f (q, p), given as
//       (p, q) with transpose_f; s(r, k) is +1 where its sign bit is set and -1 where it is
//       clear. `signs` holds s packed as bnn.bitops.pack does: along k, (m, ceil(q / 64)) words
//       with bit k % 64 of word [r, k / 64]; with transpose_signs, along r, (ceil(m / 64), q)
//       words with bit r % 64 of word [r / 64, k], and `rows` = m.
//
// A matrix product costs q multiply-adds per output value. Here each group of 8 rows of f is
// first expanded into a table of its 256 signed sums (every choice of +1 or -1 for the 8 rows,
// built from two 16-entry tables of 4 rows each), so that an output value takes one table entry
// per byte of its row's signs: q / 8 additions. The tables of up to 16 byte groups (32 KiB per
// group for a block of 32 columns) stay in the core's level-2 cache while every output row
// reads them. Columns are taken 32 at a time; the work is split over TensorFlow's intra-op
// threads by column blocks where there are many of them, else by byte groups, whose partial
// products are then summed (and transposed, with transpose_output). Signs packed along r are
// first turned along k by 64x64 bit transposes.
//
// The sums are float32 additions in another order than a matrix product's, so results agree
// with one to rounding, not bit for bit. "avx2" runs the loops on 256-bit registers (so does
// "avx512", and "auto" where the CPU has AVX2); "generic" is the same code for any CPU.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#define BNN_X86 1
#define BNN_TARGET_AVX2 __attribute__((target("avx2")))
#endif

#include "native.h"

namespace bnn {
namespace {

REGISTER_OP("BnnSignMatmul")
    .Input("signs: int64")
    .Input("f: float")
    .Output("product: float")
    .Attr("rows: int >= -1 = -1")
    .Attr("transpose_signs: bool = false")
    .Attr("transpose_f: bool = false")
    .Attr("transpose_output: bool = false")
    .Attr("isa: {'auto', 'generic', 'avx2', 'avx512'} = 'auto'")
    .SetShapeFn([](InferenceContext* ctx) {
      ShapeHandle signs, f;
      TF_RETURN_IF_ERROR(ctx->WithRank(ctx->input(0), 2, &signs));
      TF_RETURN_IF_ERROR(ctx->WithRank(ctx->input(1), 2, &f));
      bool transpose_signs, transpose_f, transpose_output;
      int64_t rows;
      TF_RETURN_IF_ERROR(ctx->GetAttr("rows", &rows));
      TF_RETURN_IF_ERROR(ctx->GetAttr("transpose_signs", &transpose_signs));
      TF_RETURN_IF_ERROR(ctx->GetAttr("transpose_f", &transpose_f));
      TF_RETURN_IF_ERROR(ctx->GetAttr("transpose_output", &transpose_output));
      DimensionHandle m = transpose_signs ? ctx->MakeDim(rows) : ctx->Dim(signs, 0);
      DimensionHandle p = ctx->Dim(f, transpose_f ? 0 : 1);
      ctx->set_output(0, transpose_output ? ctx->Matrix(p, m) : ctx->Matrix(m, p));
      return Status();
    });

constexpr int64_t kLanes = 8;                // floats per vector
constexpr int64_t kBlock = 32;               // columns per block: 4 vectors
constexpr int64_t kGroupBytes = 16;          // byte groups whose tables are held at once
constexpr int64_t kTable = 256 * kBlock;     // floats in one byte group's table

typedef float Vec __attribute__((vector_size(32)));

#if defined(__clang__)
#define BNN_ALWAYS_INLINE inline __attribute__((always_inline))
#define BNN_UNROLL _Pragma("unroll")
#else
#define BNN_ALWAYS_INLINE inline __attribute__((always_inline))
#define BNN_UNROLL _Pragma("GCC unroll 8")
#endif

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
    BNN_UNROLL
    for (int64_t v = 0; v < kBlock; v += kLanes) {
      Vec t[16];
      const Vec first = Load(rows[0] + v);
      t[0] = -first;
      t[1] = first;
      BNN_UNROLL
      for (int i = 1; i < 4; ++i) {
        const Vec r = Load(rows[i] + v);
        const int h = 1 << i;
        BNN_UNROLL
        for (int e = 0; e < h; ++e) {
          t[e + h] = t[e] + r;
          t[e] = t[e] - r;
        }
      }
      BNN_UNROLL
      for (int e = 0; e < 16; ++e) Store(halves[half] + e * kBlock + v, t[e]);
    }
  }
  for (int hi = 0; hi < 16; ++hi)
    for (int lo = 0; lo < 16; ++lo) {
      float* out = table + (hi * 16 + lo) * kBlock;
      BNN_UNROLL
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
    BNN_UNROLL
    for (int v = 0; v < 4; ++v) {
      x[v] = fresh ? Vec{} : Load(o0 + v * kLanes);
      y[v] = fresh ? Vec{} : Load(o1 + v * kLanes);
    }
    for (int64_t g = 0; g < n; ++g) {
      const float* t0 = tables + g * kTable + a0[g] * kBlock;
      const float* t1 = tables + g * kTable + a1[g] * kBlock;
      BNN_UNROLL
      for (int v = 0; v < 4; ++v) {
        x[v] += Load(t0 + v * kLanes);
        y[v] += Load(t1 + v * kLanes);
      }
    }
    BNN_UNROLL
    for (int v = 0; v < 4; ++v) {
      Store(o0 + v * kLanes, x[v]);
      Store(o1 + v * kLanes, y[v]);
    }
  }
  for (; r < last; ++r) {
    const uint8_t* a0 = pr.patterns + r * pr.bytes + g0;
    float* o0 = out + r * stride;
    Vec x[4];
    BNN_UNROLL
    for (int v = 0; v < 4; ++v) x[v] = fresh ? Vec{} : Load(o0 + v * kLanes);
    for (int64_t g = 0; g < n; ++g) {
      const float* t0 = tables + g * kTable + a0[g] * kBlock;
      BNN_UNROLL
      for (int v = 0; v < 4; ++v) x[v] += Load(t0 + v * kLanes);
    }
    BNN_UNROLL
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

void BlocksGeneric(const Problem& pr, int64_t b0, int64_t b1, int64_t g_first, int64_t g_last,
                   float* out, int64_t stride, float* tables) {
  Blocks(pr, b0, b1, g_first, g_last, out, stride, tables);
}

#ifdef BNN_X86
BNN_TARGET_AVX2 void BlocksAvx2(const Problem& pr, int64_t b0, int64_t b1, int64_t g_first,
                                int64_t g_last, float* out, int64_t stride, float* tables) {
  Blocks(pr, b0, b1, g_first, g_last, out, stride, tables);
}
#endif

class SignMatmulOp : public OpKernel {
 public:
  explicit SignMatmulOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("rows", &rows_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("transpose_signs", &transpose_signs_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("transpose_f", &transpose_f_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("transpose_output", &transpose_));
    OP_REQUIRES(ctx, !transpose_signs_ || rows_ >= 0,
                InvalidArgument("signs packed along the rows (transpose_signs) need `rows`"));
    OP_REQUIRES_OK(ctx, UseAvx2(ctx, &avx2_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& signs = ctx->input(0);
    const Tensor& f = ctx->input(1);
    OP_REQUIRES(ctx, signs.dims() == 2 && f.dims() == 2,
                InvalidArgument("signs and f must be matrices, got ",
                                signs.shape().DebugString(), " and ", f.shape().DebugString()));
    Problem pr;
    pr.f = f.flat<float>().data();
    pr.f_transposed = transpose_f_;
    pr.q = f.dim_size(transpose_f_ ? 1 : 0), pr.p = f.dim_size(transpose_f_ ? 0 : 1);
    const int64_t q_words = (pr.q + 63) / 64;
    const uint64_t* words = reinterpret_cast<const uint64_t*>(signs.flat<int64_t>().data());
    if (transpose_signs_) {
      pr.m = rows_;
      OP_REQUIRES(ctx, signs.dim_size(0) == (pr.m + 63) / 64 && signs.dim_size(1) == pr.q,
                  InvalidArgument("signs of ", pr.m, " rows by ", pr.q, " packed along the "
                                  "rows take (", (pr.m + 63) / 64, ", ", pr.q, ") words, got ",
                                  signs.shape().DebugString()));
    } else {
      pr.m = signs.dim_size(0);
      OP_REQUIRES(ctx, signs.dim_size(1) == q_words,
                  InvalidArgument("f has ", pr.q, " rows, whose signs take ", q_words,
                                  " words per row; signs have ", signs.dim_size(1)));
    }
    pr.bytes = 8 * q_words;
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, transpose_ ? TensorShape({pr.p, pr.m}) : TensorShape({pr.m, pr.p}),
                            &output));
    float* result = output->flat<float>().data();
    if (pr.m == 0 || pr.p == 0) return;
    if (pr.q == 0) {
      std::fill(result, result + pr.m * pr.p, 0.0f);
      return;
    }

    auto* workers = ctx->device()->tensorflow_cpu_worker_threads()->workers;
    Tensor turned;  // signs packed along the rows, turned along k
    if (transpose_signs_) {
      const int64_t m_words = (pr.m + 63) / 64;
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_INT64,
                                             TensorShape({m_words * 64, q_words}), &turned));
      uint64_t* out = reinterpret_cast<uint64_t*>(turned.flat<int64_t>().data());
      workers->ParallelFor(m_words, q_words * 64 * 40, [&](int64_t first, int64_t last) {
        uint64_t block[64];
        for (int64_t rw = first; rw < last; ++rw)
          for (int64_t kw = 0; kw < q_words; ++kw) {
            const int64_t n = std::min<int64_t>(64, pr.q - kw * 64);
            for (int64_t t = 0; t < n; ++t) block[t] = words[rw * pr.q + kw * 64 + t];
            std::fill(block + n, block + 64, 0);
            Transpose64(block);
            for (int64_t i = 0; i < 64; ++i) out[(rw * 64 + i) * q_words + kw] = block[i];
          }
      });
      words = out;
    }
    pr.patterns = reinterpret_cast<const uint8_t*>(words);

    const int64_t threads = std::max(1, workers->NumThreads());
    const int64_t blocks = pr.blocks(), groups = pr.groups();
    // Many column blocks: each thread takes whole blocks over every byte group. Else each takes
    // a range of byte groups over every block, into its own partial product.
    const bool by_blocks = blocks >= 2 * threads;
    const int64_t parts = by_blocks ? std::min(threads, blocks) : std::min(threads, groups);
    const int64_t stride = blocks * kBlock;
    const bool direct = by_blocks && !transpose_ && pr.p == stride;
    Tensor partial_tensor;
    float* partial = result;
    if (!direct) {
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(
                              ::tensorflow::DT_FLOAT,
                              TensorShape({by_blocks ? 1 : parts, pr.m, stride}),
                              &partial_tensor));
      partial = partial_tensor.flat<float>().data();
    }
    Tensor tables_tensor;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_FLOAT,
                                           TensorShape({parts, kGroupBytes * kTable + 16}),
                                           &tables_tensor));
    float* all_tables = tables_tensor.flat<float>().data();
    const auto run = Run(avx2_);
    // Rough cycles per part: a lookup-add per row, byte group and column and 256 table entries
    // per byte group and column, 8 columns to a vector (a small product stays on one thread).
    const int64_t cost = (pr.m + 256) * groups * stride / 8 / parts + 1;
    workers->ParallelFor(parts, cost, [&](int64_t first, int64_t last) {
      for (int64_t part = first; part < last; ++part) {
        float* tables = Aligned(all_tables + part * (kGroupBytes * kTable + 16));
        if (by_blocks)
          run(pr, blocks * part / parts, blocks * (part + 1) / parts, 0, groups, partial,
              stride, tables);
        else
          run(pr, 0, blocks, groups * part / parts, groups * (part + 1) / parts,
              partial + part * pr.m * stride, stride, tables);
      }
    });
    if (direct) return;
    const int64_t summed = by_blocks ? 1 : parts;
    // Sums the partial products (and transposes them), a block of rows at a time.
    const int64_t rows = 64;
    workers->ParallelFor((pr.m + rows - 1) / rows, rows * pr.p * (summed + 1) * 4,
                         [&](int64_t first, int64_t last) {
      for (int64_t block = first; block < last; ++block) {
        const int64_t r0 = block * rows, r1 = std::min(pr.m, r0 + rows);
        for (int64_t r = r0; r < r1; ++r) {
          for (int64_t c = 0; c < pr.p; ++c) {
            float sum = partial[r * stride + c];
            for (int64_t s = 1; s < summed; ++s) sum += partial[(s * pr.m + r) * stride + c];
            result[transpose_ ? c * pr.m + r : r * pr.p + c] = sum;
          }
        }
      }
    });
  }

 private:
  using Fn = void (*)(const Problem&, int64_t, int64_t, int64_t, int64_t, float*, int64_t,
                      float*);
  static Fn Run(bool avx2) {
#ifdef BNN_X86
    if (avx2) return BlocksAvx2;
#endif
    return BlocksGeneric;
  }
  static float* Aligned(float* p) {
    return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t{63});
  }

  int64_t rows_ = -1;
  bool transpose_signs_ = false, transpose_f_ = false, transpose_ = false;
  bool avx2_ = false;
};

REGISTER_KERNEL_BUILDER(Name("BnnSignMatmul").Device(DEVICE_CPU), SignMatmulOp);

}  // namespace
}  // namespace bnn
