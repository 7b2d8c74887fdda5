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
//   BnnThresholdPack(a (batch, units) int32, threshold, flip) -> the same words for a >= threshold.
//   BnnBitplaneSign(u (batch, ...) uint8 or float, w, threshold, flip) -> the same words for the
//       exact integer product u . w of 8-bit pixels (floats are encoded to pixels first).
//
// With AVX-512 VPOPCNTDQ, one 512-bit register holds word k of 8 neighbouring units (w is stored
// units-minor), so a broadcast x word, an xor, a popcount and an add advance 8 dot products; a tile
// of 6 rows x 32 units keeps 24 accumulators in registers. Work is split over TensorFlow's
// intra-op threads in tiles of 64 units (one output word) by 36 rows (3 examples, 24 bit-plane
// rows, for the first layer).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512VPOPCNTDQ__)
#include <immintrin.h>
#define BNN_AVX512 1
#endif

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"

namespace bnn {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::errors::InvalidArgument;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

constexpr int64_t kGroup = 64;  // units per output word and per unit of parallel work
constexpr int kRows = 6;        // batch rows per register tile (6 x 4 accumulators)

#ifdef BNN_AVX512
// Fully unrolled loops let the compiler keep a tile's accumulators in registers (without it,
// GCC keeps a copy of the accumulator array on the stack and stores to it every iteration).
#if defined(__clang__)
#define BNN_UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define BNN_UNROLL _Pragma("GCC unroll 32")
#else
#define BNN_UNROLL
#endif

// Counts for exactly R rows of x starting at row xr (row stride `words`) against the (up to) 32
// units of w starting at column col whose load masks are `mask`, into counts[r * 64 + half + u].
// R is a compile-time constant so that the R x 4 accumulators stay in registers.
template <bool kAnd, int R>
inline void CountTile(const int64_t* xr, const int64_t* w, int64_t words, int64_t units,
                      int64_t col, const __mmask8* mask, int32_t* counts, int64_t half) {
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
            acc[r][j], _mm512_popcnt_epi64(kAnd ? _mm512_and_si512(xv, wv[j])
                                                : _mm512_xor_si512(xv, wv[j])));
    }
  }
  BNN_UNROLL for (int r = 0; r < R; ++r)
    BNN_UNROLL for (int j = 0; j < 4; ++j)
      _mm256_mask_storeu_epi32(counts + r * kGroup + half + 8 * j, mask[j],
                               _mm512_cvtepi64_epi32(acc[r][j]));
}
#endif

// Mismatch counts (kAnd: counts of common set bits) for rows [row0, row0 + rows) of x and
// units [u0, u0 + width), width <= 64, into counts[r * 64 + (u - u0)].
template <bool kAnd>
void CountGroup(const int64_t* x, const int64_t* w, int64_t rows, int64_t words, int64_t units,
                int64_t u0, int64_t width, int32_t* counts, int64_t row0) {
#ifdef BNN_AVX512
  for (int64_t half = 0; half < width; half += 32) {
    const int64_t n_here = std::min<int64_t>(32, width - half);
    __mmask8 mask[4];
    for (int j = 0; j < 4; ++j) {
      const int64_t live = std::max<int64_t>(0, std::min<int64_t>(8, n_here - 8 * j));
      mask[j] = static_cast<__mmask8>((1u << live) - 1u);
    }
    const int64_t col = u0 + half;
    int64_t r0 = 0;
    for (; r0 + kRows <= rows; r0 += kRows)
      CountTile<kAnd, kRows>(x + (row0 + r0) * words, w, words, units, col, mask,
                             counts + r0 * kGroup, half);
    const int64_t* xr = x + (row0 + r0) * words;
    int32_t* tail = counts + r0 * kGroup;
    switch (rows - r0) {  // the last rows, fewer than a tile
      case 5: CountTile<kAnd, 5>(xr, w, words, units, col, mask, tail, half); break;
      case 4: CountTile<kAnd, 4>(xr, w, words, units, col, mask, tail, half); break;
      case 3: CountTile<kAnd, 3>(xr, w, words, units, col, mask, tail, half); break;
      case 2: CountTile<kAnd, 2>(xr, w, words, units, col, mask, tail, half); break;
      case 1: CountTile<kAnd, 1>(xr, w, words, units, col, mask, tail, half); break;
      default: break;
    }
  }
#else
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t* xr = x + (row0 + r) * words;
    for (int64_t u = 0; u < width; ++u) {
      int32_t c = 0;
      for (int64_t k = 0; k < words; ++k)
        c += __builtin_popcountll(static_cast<uint64_t>(
            kAnd ? xr[k] & w[k * units + u0 + u] : xr[k] ^ w[k * units + u0 + u]));
      counts[r * kGroup + u] = c;
    }
  }
#endif
}

// Bit u of the word: scale * values[u] + offset >= threshold[u] for u < width (scale is 1 or -2,
// which turns mismatch counts into dot products), XOR flip.
int64_t PackWord(const int32_t* values, const int32_t* threshold, int64_t width, int32_t scale,
                 int32_t offset, int64_t flip) {
#ifdef BNN_AVX512
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
#else
  uint64_t bits = 0;
  for (int64_t u = 0; u < width; ++u)
    bits |= static_cast<uint64_t>(scale * values[u] + offset >= threshold[u]) << u;
#endif
  return static_cast<int64_t>(bits) ^ flip;
}

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
    .Output("words: int64")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle x, w;
      TF_RETURN_IF_ERROR(MatrixShapes(c, &x, &w));
      c->set_output(0, c->Matrix(c->Dim(x, 0), WordsOf(c, c->Dim(w, 1))));
      return Status();
    });

REGISTER_OP("BnnThresholdPack")
    .Input("a: int32")
    .Input("threshold: int32")
    .Input("flip: int64")
    .Output("words: int64")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle a;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &a));
      c->set_output(0, c->Matrix(c->Dim(a, 0), WordsOf(c, c->Dim(a, 1))));
      return Status();
    });

REGISTER_OP("BnnBitplaneSign")
    .Input("u: T")
    .Input("w: int64")
    .Input("threshold: int32")
    .Input("flip: int64")
    .Attr("T: {uint8, float}")
    .Attr("scale: float = 1.0")
    .Attr("offset: float = 0.0")
    .Output("words: int64")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle u, w;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 2, &u));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &w));
      c->set_output(0, c->Matrix(c->Dim(u, 0), WordsOf(c, c->Dim(w, 1))));
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

class XorPopcountOp : public OpKernel {
 public:
  explicit XorPopcountOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    sign_ = ctx->HasAttr("n");
    if (sign_) OP_REQUIRES_OK(ctx, ctx->GetAttr("n", &n_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    const Tensor& w = ctx->input(1);
    OP_REQUIRES(ctx, x.dims() == 2 && w.dims() == 2,
                InvalidArgument("x and w must be matrices, got ", x.shape().DebugString(),
                                " and ", w.shape().DebugString()));
    const int64_t batch = x.dim_size(0), words = x.dim_size(1), units = w.dim_size(1);
    OP_REQUIRES(ctx, w.dim_size(0) == words,
                InvalidArgument("x has ", words, " words per row but w has ", w.dim_size(0)));
    const int64_t out_words = (units + kGroup - 1) / kGroup;
    const int32_t* threshold = nullptr;
    const int64_t* flip = nullptr;
    if (sign_) {
      if (!CheckThresholds(ctx, ctx->input(2), ctx->input(3), units)) return;
      threshold = ctx->input(2).flat<int32_t>().data();
      flip = ctx->input(3).flat<int64_t>().data();
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({batch, sign_ ? out_words : units}), &out));
    if (batch == 0 || units == 0) return;
    const int64_t* xp = x.flat<int64_t>().data();
    const int64_t* wp = w.flat<int64_t>().data();
    int32_t* counts_out = sign_ ? nullptr : out->flat<int32_t>().data();
    int64_t* words_out = sign_ ? out->flat<int64_t>().data() : nullptr;
    const int64_t n = n_;
    const bool sign = sign_;

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
        CountGroup<false>(xp, wp, rows, words, units, u0, width, counts, r0);
        for (int64_t r = 0; r < rows; ++r) {
          const int32_t* c = counts + r * kGroup;
          if (sign)
            words_out[(r0 + r) * out_words + g] = PackWord(
                c, threshold + u0, width, -2, static_cast<int32_t>(n), flip[g]);
          else
            std::memcpy(counts_out + (r0 + r) * units + u0, c, width * sizeof(int32_t));
        }
      }
    };
    // Cost per item in rough cycles, for the real rows (one example is not worth a thread).
    const int64_t cost = std::max<int64_t>(1, std::min(kChunk, batch) * words * kGroup / 4);
    ctx->device()->tensorflow_cpu_worker_threads()->workers->ParallelFor(
        chunks * out_words, cost, work);
  }

 private:
  bool sign_ = false;
  int64_t n_ = 0;
};

class ThresholdPackOp : public OpKernel {
 public:
  explicit ThresholdPackOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

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
    auto work = [&](int64_t first, int64_t last) {
      for (int64_t b = first; b < last; ++b)
        for (int64_t g = 0; g < out_words; ++g) {
          const int64_t u0 = g * kGroup;
          words_out[b * out_words + g] = PackWord(ap + b * units + u0, threshold + u0,
                                                  std::min(kGroup, units - u0), 1, 0, flip[g]);
        }
    };
    // About one vector compare per 16 units: cheap enough that small batches stay on one
    // thread (waking another costs more than the work).
    ctx->device()->tensorflow_cpu_worker_threads()->workers->ParallelFor(
        batch, std::max<int64_t>(1, units / 16), work);
  }
};

// Pixel u in [0, 255]: uint8 as is; float x encoded as clip(round_half_even((x - offset) / scale)),
// the float32 arithmetic of bnn.packing's encoder.
inline uint32_t Pixel(uint8_t u, float, float) { return u; }
inline uint32_t Pixel(float x, float scale, float offset) {
  const float u = std::nearbyint((x - offset) / scale);
  return static_cast<uint32_t>(std::min(std::max(u, 0.0f), 255.0f));
}

// First layer on 8-bit pixels u (batch, ...) (uint8, or floats encoded to them; each example
// flattened) and +-1 kernel bits w: z = u . w = 2 * sum_p 2^p popcount(plane_p AND w) - sum(u),
// exact; output bits [z >= threshold] XOR flip, packed. Each row's 8 bit planes are packed words,
// counted against w like rows of the xor kernel.
template <typename T>
class BitplaneSignOp : public OpKernel {
 public:
  explicit BitplaneSignOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("scale", &scale_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("offset", &offset_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& u = ctx->input(0);
    const Tensor& w = ctx->input(1);
    OP_REQUIRES(ctx, u.dims() >= 2 && w.dims() == 2,
                InvalidArgument("u must have a batch axis and w must be a matrix, got ",
                                u.shape().DebugString(), " and ", w.shape().DebugString()));
    const int64_t batch = u.dim_size(0), words = w.dim_size(0), units = w.dim_size(1);
    const int64_t n = batch ? u.NumElements() / batch : 0;
    OP_REQUIRES(ctx, batch == 0 || words == (n + kGroup - 1) / kGroup,
                InvalidArgument("u has ", n, " values per example, which pack into ",
                                (n + kGroup - 1) / kGroup, " words, but w has ", words));
    if (!CheckThresholds(ctx, ctx->input(2), ctx->input(3), units)) return;
    const int64_t out_words = (units + kGroup - 1) / kGroup;
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({batch, out_words}), &out));
    if (batch == 0 || units == 0) return;
    std::vector<int64_t> planes(batch * 8 * words, 0);  // row b * 8 + p: bit p of each pixel
    std::vector<int32_t> totals(batch, 0);
    std::vector<uint8_t> pixels(words * kGroup, 0);  // one example, zero-padded to whole words
    const T* up = u.flat<T>().data();
    for (int64_t b = 0; b < batch; ++b) {
      int64_t* row = planes.data() + b * 8 * words;
      int32_t total = 0;
      for (int64_t i = 0; i < n; ++i) {
        pixels[i] = static_cast<uint8_t>(Pixel(up[b * n + i], scale_, offset_));
        total += pixels[i];
      }
      totals[b] = total;
      for (int64_t k = 0; k < words; ++k) {
        const uint8_t* chunk = pixels.data() + k * kGroup;
#ifdef BNN_AVX512
        const __m512i v = _mm512_loadu_si512(chunk);
        for (int p = 0; p < 8; ++p)
          row[p * words + k] = static_cast<int64_t>(
              _mm512_test_epi8_mask(v, _mm512_set1_epi8(static_cast<char>(1 << p))));
#else
        for (int64_t i = 0; i < kGroup; ++i)
          for (int p = 0; p < 8; ++p)
            row[p * words + k] |= static_cast<int64_t>(uint64_t{(chunk[i] >> p) & 1u} << i);
#endif
      }
    }
    const int64_t* wp = w.flat<int64_t>().data();
    const int32_t* threshold = ctx->input(2).flat<int32_t>().data();
    const int64_t* flip = ctx->input(3).flat<int64_t>().data();
    int64_t* words_out = out->flat<int64_t>().data();
    constexpr int64_t kChunk = 3;  // examples (24 plane rows, 4 tiles) per unit of work
    const int64_t chunks = (batch + kChunk - 1) / kChunk;
    auto work = [&](int64_t first, int64_t last) {
      int32_t counts[kChunk * 8 * kGroup];
      int32_t sums[kGroup];
      for (int64_t item = first; item < last; ++item) {
        const int64_t g = item % out_words, b0 = (item / out_words) * kChunk;
        const int64_t u0 = g * kGroup, width = std::min(kGroup, units - u0);
        const int64_t rows = std::min(kChunk, batch - b0);
        CountGroup<true>(planes.data(), wp, rows * 8, words, units, u0, width, counts, b0 * 8);
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t j = 0; j < width; ++j) {
            int32_t sum = 0;
            for (int p = 0; p < 8; ++p) sum += counts[(r * 8 + p) * kGroup + j] << p;
            sums[j] = sum;
          }
          words_out[(b0 + r) * out_words + g] =
              PackWord(sums, threshold + u0, width, 2, -totals[b0 + r], flip[g]);
        }
      }
    };
    const int64_t cost = std::max<int64_t>(1, std::min(kChunk, batch) * 8 * words * kGroup / 4);
    ctx->device()->tensorflow_cpu_worker_threads()->workers->ParallelFor(
        chunks * out_words, cost, work);
  }

 private:
  float scale_ = 1.0f, offset_ = 0.0f;
};

REGISTER_KERNEL_BUILDER(Name("BnnXorPopcount").Device(DEVICE_CPU), XorPopcountOp);
REGISTER_KERNEL_BUILDER(
    Name("BnnBitplaneSign").Device(DEVICE_CPU).TypeConstraint<uint8_t>("T"),
    BitplaneSignOp<uint8_t>);
REGISTER_KERNEL_BUILDER(
    Name("BnnBitplaneSign").Device(DEVICE_CPU).TypeConstraint<float>("T"),
    BitplaneSignOp<float>);
REGISTER_KERNEL_BUILDER(Name("BnnXorPopcountSign").Device(DEVICE_CPU), XorPopcountOp);
REGISTER_KERNEL_BUILDER(Name("BnnThresholdPack").Device(DEVICE_CPU), ThresholdPackOp);

}  // namespace bnn
