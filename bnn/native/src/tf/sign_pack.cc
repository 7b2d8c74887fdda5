// Sign bits of a float tensor packed into int64 words, for the operands of bnn's native training
// products (see bnn/bitops.py), built into the same library as xor_popcount.cc by bnn/kernels.py.
//
//   BnnPackSigns(x: T, along_rows, transpose_output, isa) -> int64 words, T float32 or bfloat16:
//       along the last axis (along_rows false): x (..., n) -> (..., ceil(n / 64));
//       along the rows (along_rows true): x (..., r, c) -> (..., ceil(r / 64), c), or, with
//       transpose_output, (..., c, ceil(r / 64)).
//   Bit t % 64 of word t / 64 is set where element t of its line is >= 0 (so -0 counts as +1,
//   NaN as -1) and pad bits past n (or r) are clear: bnn.bitops.pack's layout.
//
// The sign bits of 8 values come from one vector comparison and its mask ("avx2"; so does
// "avx512", and "auto" where the CPU has AVX2), or from scalar comparisons ("generic"). Packing
// along the rows takes tiles of 64 rows by 64 columns: each row's 64 bits, then one 64x64 bit
// transpose turns them into each column's 64 bits; the rows are read in order, 16 tiles at a
// time. One pass over x either way: a 2048x2048 float32 kernel packed along its rows took 0.53 ms
// on a 2-core Zen 4, XLA's equivalent (shifts and sums of 32-bit lanes) 1.17 ms.

#include <algorithm>
#include <cstdint>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#if defined(__GNUC__) || defined(__clang__)
#define BNN_X86 1
#endif
#endif

#include "native.h"

namespace bnn {
namespace {

using ::tensorflow::bfloat16;

REGISTER_OP("BnnPackSigns")
    .Input("x: T")
    .Output("words: int64")
    .Attr("T: {float, bfloat16}")
    .Attr("along_rows: bool = false")
    .Attr("transpose_output: bool = false")
    .Attr("isa: {'auto', 'generic', 'avx2', 'avx512'} = 'auto'")
    .SetShapeFn([](InferenceContext* ctx) {
      bool along_rows, transpose;
      TF_RETURN_IF_ERROR(ctx->GetAttr("along_rows", &along_rows));
      TF_RETURN_IF_ERROR(ctx->GetAttr("transpose_output", &transpose));
      ShapeHandle x;
      TF_RETURN_IF_ERROR(ctx->WithRankAtLeast(ctx->input(0), along_rows ? 2 : 1, &x));
      const int32_t rank = ctx->Rank(x);
      const int32_t axis = along_rows ? rank - 2 : rank - 1;
      DimensionHandle n = ctx->Dim(x, axis), words;
      if (ctx->ValueKnown(n)) {
        words = ctx->MakeDim((ctx->Value(n) + 63) / 64);
      } else {
        words = ctx->UnknownDim();
      }
      ShapeHandle out;
      TF_RETURN_IF_ERROR(ctx->ReplaceDim(x, axis, words, &out));
      if (along_rows && transpose) {
        ShapeHandle outer, tail;
        TF_RETURN_IF_ERROR(ctx->Subshape(x, 0, rank - 2, &outer));
        TF_RETURN_IF_ERROR(ctx->Concatenate(outer, ctx->Vector(ctx->Dim(x, rank - 1)), &tail));
        TF_RETURN_IF_ERROR(ctx->Concatenate(tail, ctx->Vector(words), &out));
      }
      ctx->set_output(0, out);
      return Status();
    });

inline float Widen(float v) { return v; }
inline float Widen(bfloat16 v) { return static_cast<float>(v); }

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

template <typename T>
void PackGeneric(const T* x, const Layout& l, int64_t first, int64_t last, uint64_t* out) {
  Pack<T, BitsGeneric<T>>(x, l, first, last, out);
}

#ifdef BNN_X86
template <typename T>
__attribute__((target("avx2"))) void PackAvx2(const T* x, const Layout& l, int64_t first,
                                              int64_t last, uint64_t* out) {
  Pack<T, BitsAvx2<T>>(x, l, first, last, out);
}
#endif

template <typename T>
class PackSignsOp : public OpKernel {
 public:
  explicit PackSignsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("along_rows", &along_rows_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("transpose_output", &transpose_));
    OP_REQUIRES_OK(ctx, UseAvx2(ctx, &avx2_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    const int rank = x.dims();
    OP_REQUIRES(ctx, rank >= (along_rows_ ? 2 : 1),
                InvalidArgument("packing signs along the ", along_rows_ ? "rows" : "last axis",
                                " needs a tensor of rank >= ", along_rows_ ? 2 : 1, ", got ",
                                x.shape().DebugString()));
    Layout l{1, 1, x.dim_size(rank - 1), along_rows_, along_rows_ && transpose_};
    for (int d = 0; d < rank - 1; ++d) l.outer *= x.dim_size(d);
    if (along_rows_) {
      l.rows = x.dim_size(rank - 2);
      l.outer /= std::max<int64_t>(l.rows, 1);
      if (l.rows == 0) l.outer = 0;
    }
    const int64_t words = ((along_rows_ ? l.rows : l.cols) + 63) / 64;
    TensorShape shape = x.shape();
    shape.set_dim(along_rows_ ? rank - 2 : rank - 1, words);
    if (l.transpose) {
      shape.set_dim(rank - 2, l.cols);
      shape.set_dim(rank - 1, words);
    }
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &output));
    if (output->NumElements() == 0) return;
    uint64_t* out = reinterpret_cast<uint64_t*>(output->flat<int64_t>().data());
    const T* in = x.flat<T>().data();
    const int64_t chunk_count = ((l.cols + 63) / 64 + kChunkTiles - 1) / kChunkTiles;
    const int64_t tasks = along_rows_ ? l.outer * words * chunk_count : l.outer;
    // Rough cycles per task, from the values it reads (a small tensor stays on one thread).
    const int64_t cost = along_rows_ ? 2 * std::min<int64_t>(l.rows, 64) *
                                           std::min<int64_t>(l.cols, 64 * kChunkTiles)
                                     : std::max<int64_t>(l.cols, 1);
    const auto run = Run(avx2_);
    ctx->device()->tensorflow_cpu_worker_threads()->workers->ParallelFor(
        tasks, cost, [&](int64_t first, int64_t last) { run(in, l, first, last, out); });
  }

 private:
  using Fn = void (*)(const T*, const Layout&, int64_t, int64_t, uint64_t*);
  static Fn Run(bool avx2) {
#ifdef BNN_X86
    if (avx2) return PackAvx2<T>;
#endif
    return PackGeneric<T>;
  }

  bool along_rows_ = false, transpose_ = false, avx2_ = false;
};

REGISTER_KERNEL_BUILDER(Name("BnnPackSigns").Device(DEVICE_CPU).TypeConstraint<float>("T"),
                        PackSignsOp<float>);
REGISTER_KERNEL_BUILDER(Name("BnnPackSigns").Device(DEVICE_CPU).TypeConstraint<bfloat16>("T"),
                        PackSignsOp<bfloat16>);

}  // namespace
}  // namespace bnn
