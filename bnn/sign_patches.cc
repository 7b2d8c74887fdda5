// The ±1 patches of a packed image, for the kernel gradient of bnn's binary convolution (see
// bnn/bitops.py), built into the same library as xor_popcount.cc by bnn/kernels.py.
//
//   BnnSignPatches(words: int64 (batch, h, w, ceil(c / 64)), kh, kw, sh, sw, c, T) ->
//       T (kh * kw * c, batch * ho * wo), ho = (h - kh) / sh + 1, wo = (w - kw) / sw + 1:
//       row (i * kw + j) * c + k, column (b * ho + y) * wo + x holds channel k of pixel
//       (b, y * sh + i, x * sw + j) as +1 (bit set) or -1 (bit clear), in float32 or bfloat16.
//
// These are the transposed "valid" patches of the image (im2col), so that one matrix product with
// the output gradient dy (batch * ho * wo, filters) gives the kernel's gradient (kh * kw * c,
// filters). oneDNN's bfloat16 products run this at the speed of the forward convolution, where
// its bfloat16 kernel-gradient convolution takes up to 2.5 times as long.
//
// First, each image row is turned into bit planes, one per channel, a bit per pixel (8x8 bit
// transposes); then each patch row is a run of those plane bits, a byte at a time expanded to
// eight values through a table.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>
#define BNN_STREAM_STORES 1
#endif

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/types.h"

namespace bnn {
namespace {

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

REGISTER_OP("BnnSignPatches")
    .Input("words: int64")
    .Output("patches: T")
    .Attr("kh: int >= 1")
    .Attr("kw: int >= 1")
    .Attr("sh: int >= 1")
    .Attr("sw: int >= 1")
    .Attr("c: int >= 1")
    .Attr("T: {float, bfloat16}")
    .SetShapeFn([](InferenceContext* ctx) {
      ShapeHandle words;
      TF_RETURN_IF_ERROR(ctx->WithRank(ctx->input(0), 4, &words));
      int64_t kh, kw, sh, sw, c;
      TF_RETURN_IF_ERROR(ctx->GetAttr("kh", &kh));
      TF_RETURN_IF_ERROR(ctx->GetAttr("kw", &kw));
      TF_RETURN_IF_ERROR(ctx->GetAttr("sh", &sh));
      TF_RETURN_IF_ERROR(ctx->GetAttr("sw", &sw));
      TF_RETURN_IF_ERROR(ctx->GetAttr("c", &c));
      DimensionHandle columns = ctx->UnknownDim();
      const int64_t b = ctx->Value(ctx->Dim(words, 0));
      const int64_t h = ctx->Value(ctx->Dim(words, 1));
      const int64_t w = ctx->Value(ctx->Dim(words, 2));
      if (b >= 0 && h >= kh && w >= kw)
        columns = ctx->MakeDim(b * ((h - kh) / sh + 1) * ((w - kw) / sw + 1));
      ctx->set_output(0, ctx->Matrix(kh * kw * c, columns));
      return Status();
    });

// An 8x8 bit matrix, row r in byte r (bit t: column t), transposed: byte t holds column t.
inline uint64_t Transpose8(uint64_t x) {
  uint64_t t = (x ^ (x >> 7)) & 0x00AA00AA00AA00AAULL;
  x ^= t ^ (t << 7);
  t = (x ^ (x >> 14)) & 0x0000CCCC0000CCCCULL;
  x ^= t ^ (t << 14);
  t = (x ^ (x >> 28)) & 0x00000000F0F0F0F0ULL;
  return x ^ t ^ (t << 28);
}

// 64 plane bits from bit `offset` on (the plane row ends in a zero word).
inline uint64_t BitsAt(const uint64_t* row, int64_t offset) {
  const int64_t word = offset >> 6;
  const int shift = static_cast<int>(offset & 63);
  if (shift == 0) return row[word];
  return (row[word] >> shift) | (row[word + 1] << (64 - shift));
}

// The eight values of each byte: element t is +1 where bit t is set, else -1, as stored bits.
template <typename Bits>
struct ByteTable {
  Bits values[256][8];
  ByteTable(Bits plus, Bits minus) {
    for (int byte = 0; byte < 256; ++byte)
      for (int t = 0; t < 8; ++t) values[byte][t] = (byte >> t) & 1 ? plus : minus;
  }
};

// Patches of at least this many bytes are written past the caches (StoreEight).
constexpr int64_t kStreamBytes = int64_t{8} << 20;

template <typename T>
struct Element;  // the storage of T's values, and the bits of +1 and -1
template <>
struct Element<float> {
  using Bits = uint32_t;
  static constexpr Bits kPlus = 0x3F800000u, kMinus = 0xBF800000u;
};
template <>
struct Element<::tensorflow::bfloat16> {
  using Bits = uint16_t;
  static constexpr Bits kPlus = 0x3F80u, kMinus = 0xBF80u;
};

// Stores eight values (16 or 32 bytes) at a 16-byte aligned `dst`, past the caches where
// `stream` (the patches are read back from memory anyway when they are larger than the caches, and
// streaming them spares reading each line before it is written).
template <typename Bits>
inline void StoreEight(Bits* dst, const Bits* values, bool stream) {
#ifdef BNN_STREAM_STORES
  if (stream) {
    for (size_t i = 0; i < 8 * sizeof(Bits); i += 16)
      _mm_stream_si128(reinterpret_cast<__m128i*>(reinterpret_cast<char*>(dst) + i),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(
                           reinterpret_cast<const char*>(values) + i)));
    return;
  }
#endif
  std::memcpy(dst, values, 8 * sizeof(Bits));
}

template <typename T>
class SignPatchesOp : public OpKernel {
 public:
  explicit SignPatchesOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    for (const char* name : {"kh", "kw", "sh", "sw", "c"}) {
      int64_t value;
      OP_REQUIRES_OK(ctx, ctx->GetAttr(name, &value));
      attrs_.push_back(value);
    }
  }

  void Compute(OpKernelContext* ctx) override {
    using Bits = typename Element<T>::Bits;
    static const ByteTable<Bits> table(Element<T>::kPlus, Element<T>::kMinus);
    const int64_t kh = attrs_[0], kw = attrs_[1], sh = attrs_[2], sw = attrs_[3], c = attrs_[4];
    const Tensor& input = ctx->input(0);
    OP_REQUIRES(ctx, input.dims() == 4,
                InvalidArgument("words must be (batch, h, w, words), got ",
                                input.shape().DebugString()));
    const int64_t batch = input.dim_size(0), h = input.dim_size(1), w = input.dim_size(2);
    const int64_t words = input.dim_size(3);
    OP_REQUIRES(ctx, words == (c + 63) / 64,
                InvalidArgument("c = ", c, " channels take ", (c + 63) / 64, " words, got ",
                                words));
    OP_REQUIRES(ctx, h >= kh && w >= kw,
                InvalidArgument("a ", kh, "x", kw, " kernel does not fit a ", h, "x", w,
                                " image"));
    const int64_t ho = (h - kh) / sh + 1, wo = (w - kw) / sw + 1;
    const int64_t columns = batch * ho * wo;
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({kh * kw * c, columns}), &output));
    if (columns == 0) return;

    // planes[((k * batch + b) * h + y) * row_words + ...]: channel k of image row (b, y), a bit
    // per pixel, then a zero word for BitsAt.
    const int64_t row_words = (w + 63) / 64 + 1;
    Tensor planes_tensor;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_INT64,
                                           TensorShape({c * batch * h * row_words}),
                                           &planes_tensor));
    uint64_t* planes = reinterpret_cast<uint64_t*>(planes_tensor.flat<int64_t>().data());
    const uint64_t* in = reinterpret_cast<const uint64_t*>(input.flat<int64_t>().data());
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads()->workers;
    auto to_planes = [=](int64_t first, int64_t last) {
      for (int64_t row = first; row < last; ++row) {  // row = b * h + y
        for (int64_t k = 0; k < c; ++k)
          std::memset(planes + (k * batch * h + row) * row_words, 0, row_words * 8);
        const uint64_t* pixels = in + row * w * words;
        for (int64_t x0 = 0; x0 < w; x0 += 8) {
          const int64_t n = std::min<int64_t>(8, w - x0);
          for (int64_t word = 0; word < words; ++word) {
            for (int q = 0; q < 8; ++q) {
              const int64_t k0 = word * 64 + q * 8;
              if (k0 >= c) break;
              uint64_t m = 0;
              for (int64_t r = 0; r < n; ++r)
                m |= ((pixels[(x0 + r) * words + word] >> (8 * q)) & 0xFF) << (8 * r);
              m = Transpose8(m);
              for (int64_t t = 0; t < 8 && k0 + t < c; ++t)
                planes[((k0 + t) * batch * h + row) * row_words + (x0 >> 6)] |=
                    ((m >> (8 * t)) & 0xFF) << (x0 & 63);
            }
          }
        }
      }
    };
    workers->ParallelFor(batch * h, w * words * 80, to_planes);

    Bits* out = reinterpret_cast<Bits*>(output->flat<T>().data());
    const bool stream = wo % 8 == 0 && columns % 8 == 0 &&
                        reinterpret_cast<uintptr_t>(out) % 16 == 0 &&
                        output->TotalBytes() >= kStreamBytes;
    auto to_patches = [=](int64_t first, int64_t last) {
      for (int64_t r = first; r < last; ++r) {  // r = (i * kw + j) * c + k
        const int64_t k = r % c, tap = r / c, i = tap / kw, j = tap % kw;
        Bits* dst = out + r * columns;
        for (int64_t b = 0; b < batch; ++b) {
          for (int64_t y = 0; y < ho; ++y, dst += wo) {
            const uint64_t* row = planes + ((k * batch + b) * h + y * sh + i) * row_words;
            if (sw == 1 && wo <= 64) {  // the row's bits in one word
              const uint64_t bits = BitsAt(row, j);
              int64_t x0 = 0;
              for (; x0 + 8 <= wo; x0 += 8)
                StoreEight(dst + x0, table.values[(bits >> x0) & 0xFF], stream);
              if (x0 < wo)
                std::memcpy(dst + x0, table.values[(bits >> x0) & 0xFF], (wo - x0) * sizeof(Bits));
              continue;
            }
            for (int64_t x0 = 0; x0 < wo; x0 += 8) {
              uint64_t byte = 0;
              for (int64_t t = 0; t < 8 && x0 + t < wo; ++t) {
                const int64_t at = j + (x0 + t) * sw;
                byte |= ((row[at >> 6] >> (at & 63)) & 1) << t;
              }
              std::memcpy(dst + x0, table.values[byte],
                          std::min<int64_t>(8, wo - x0) * sizeof(Bits));
            }
          }
        }
      }
#ifdef BNN_STREAM_STORES
      if (stream) _mm_sfence();
#endif
    };
    workers->ParallelFor(kh * kw * c, columns * sizeof(Bits), to_patches);
  }

 private:
  std::vector<int64_t> attrs_;
};

REGISTER_KERNEL_BUILDER(Name("BnnSignPatches").Device(DEVICE_CPU).TypeConstraint<float>("T"),
                        SignPatchesOp<float>);
REGISTER_KERNEL_BUILDER(
    Name("BnnSignPatches").Device(DEVICE_CPU).TypeConstraint<::tensorflow::bfloat16>("T"),
    SignPatchesOp<::tensorflow::bfloat16>);

}  // namespace
}  // namespace bnn
