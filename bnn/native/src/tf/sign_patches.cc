// The ±1 patches of a packed image, for the kernel gradient of bnn's binary convolution (see
// bnn/bitops.py), built into the same library as xor_popcount.cc by bnn/kernels.py.
//
//   BnnSignPatches(words: int64 (batch, h, w, ceil(c / 64)), kh, kw, sh, sw, c, T, isa) ->
//       T (kh * kw * c, batch * ho * wo), ho = (h - kh) / sh + 1, wo = (w - kw) / sw + 1:
//       row (i * kw + j) * c + k, column (b * ho + y) * wo + x holds channel k of pixel
//       (b, y * sh + i, x * sw + j) as +1 (bit set) or -1 (bit clear), in float32 or bfloat16;
//       with T = int64, the rows' bits packed as bnn.bitops.pack packs them:
//       (kh * kw * c, ceil(batch * ho * wo / 64)), column t in bit t % 64 of word t / 64.
//
// These are the transposed "valid" patches of the image (im2col), so that one matrix product with
// the output gradient dy (batch * ho * wo, filters) gives the kernel's gradient (kh * kw * c,
// filters). oneDNN's bfloat16 products run this at the speed of the forward convolution, where
// its bfloat16 kernel-gradient convolution takes up to 2.5 times as long. The packed rows are
// the ±1 operand of sign_matmul.cc's table-lookup product, which needs no float patches at all.
//
// First, each image row is turned into bit planes, one per channel, a bit per pixel (64x64 bit
// transposes). Then each patch row is a stream of those plane bits, expanded to values eight at
// a time through a table, or, on CPUs with AVX-512, 32 (bfloat16) or 16 (float32) at a time by a
// masked blend ("avx512"; "auto" where the CPU has it; "avx2" and "generic" take the table);
// patches of 8 MiB or more are written past the caches.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define BNN_X86 1
#endif

#include "native.h"

namespace bnn {
namespace {

REGISTER_OP("BnnSignPatches")
    .Input("words: int64")
    .Output("patches: T")
    .Attr("kh: int >= 1")
    .Attr("kw: int >= 1")
    .Attr("sh: int >= 1")
    .Attr("sw: int >= 1")
    .Attr("c: int >= 1")
    .Attr("T: {float, bfloat16, int64}")
    .Attr("isa: {'auto', 'generic', 'avx2', 'avx512'} = 'auto'")
    .SetShapeFn([](InferenceContext* ctx) {
      ShapeHandle words;
      TF_RETURN_IF_ERROR(ctx->WithRank(ctx->input(0), 4, &words));
      int64_t kh, kw, sh, sw, c;
      ::tensorflow::DataType dtype;
      TF_RETURN_IF_ERROR(ctx->GetAttr("T", &dtype));
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
      if (dtype == ::tensorflow::DT_INT64 && ctx->ValueKnown(columns))
        columns = ctx->MakeDim((ctx->Value(columns) + 63) / 64);
      ctx->set_output(0, ctx->Matrix(kh * kw * c, columns));
      return Status();
    });

// Patches of at least this many bytes are written past the caches.
constexpr int64_t kStreamBytes = int64_t{8} << 20;

// The `n` <= 32 plane bits from bit `offset` on, every `step`-th (the plane row ends in a zero
// word, so reading one word past the bits is safe).
inline uint64_t PlaneBits(const uint64_t* row, int64_t offset, int64_t step, int64_t n) {
  if (step == 1) {
    const int64_t word = offset >> 6;
    const int shift = static_cast<int>(offset & 63);
    const uint64_t bits =
        shift == 0 ? row[word] : (row[word] >> shift) | (row[word + 1] << (64 - shift));
    return bits & ((uint64_t{1} << n) - 1);
  }
  uint64_t bits = 0;
  for (int64_t t = 0; t < n; ++t, offset += step)
    bits |= ((row[offset >> 6] >> (offset & 63)) & 1) << t;
  return bits;
}

template <typename T>
struct Element;  // how T's values are stored, and the bits of +1 and -1
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

template <>
struct Element<int64_t> {
  using Bits = uint32_t;  // a row's words, written as their 32-bit halves
};

// Writes the bits themselves, 32 at a time: a row of packed words, low half first.
struct BitWriter {
  static constexpr int kValues = 32;
  static int64_t Slots(int64_t n) { return n > 0; }  // output slots `n` values take
  void Write(uint32_t* dst, uint64_t bits, int64_t n, bool) const {
    *dst = static_cast<uint32_t>(bits & ((uint64_t{1} << n) - 1));
  }
};

// Writes values eight at a time: element t of each byte is +1 where bit t is set, else -1.
template <typename Bits>
struct TableWriter {
  static constexpr int kValues = 8;
  static int64_t Slots(int64_t n) { return n; }
  Bits table[256][8];
  TableWriter(Bits plus, Bits minus) {
    for (int byte = 0; byte < 256; ++byte)
      for (int t = 0; t < 8; ++t) table[byte][t] = (byte >> t) & 1 ? plus : minus;
  }
  // `n` <= kValues values of `bits` at `dst`, which is 16-byte aligned where `stream`.
  void Write(Bits* dst, uint64_t bits, int64_t n, bool stream) const {
    const Bits* values = table[bits & 0xFF];
#ifdef BNN_X86
    if (stream && n == kValues) {
      for (size_t i = 0; i < sizeof(table[0]); i += 16)
        _mm_stream_si128(reinterpret_cast<__m128i*>(reinterpret_cast<char*>(dst) + i),
                         _mm_loadu_si128(reinterpret_cast<const __m128i*>(
                             reinterpret_cast<const char*>(values) + i)));
      return;
    }
#endif
    std::memcpy(dst, values, n * sizeof(Bits));
  }
};

// Appends runs of bits to a patch row and writes them out kValues at a time.
template <typename Writer, typename Bits>
struct RowStream {
  const Writer& writer;
  Bits* dst;
  bool stream;
  uint64_t pending = 0;
  int64_t count = 0;

  void Append(uint64_t bits, int64_t n) {  // n <= 32
    pending |= bits << count;
    count += n;
    while (count >= Writer::kValues) {
      writer.Write(dst, pending, Writer::kValues, stream);
      dst += Writer::Slots(Writer::kValues);
      pending >>= Writer::kValues;  // kValues <= 32
      count -= Writer::kValues;
    }
  }
  void Finish() {
    if (count > 0) writer.Write(dst, pending, count, false);
  }
};

bool HasAvx512() {
#ifdef BNN_X86
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
#else
  return false;
#endif
}

#ifdef BNN_X86
#define BNN_TARGET_AVX512 __attribute__((target("avx512f,avx512bw")))

// 32 bfloat16 values (one cache line) per write, by a masked blend.
struct Avx512WriterBf16 {
  static constexpr int kValues = 32;
  static int64_t Slots(int64_t n) { return n; }
  BNN_TARGET_AVX512 void Write(uint16_t* dst, uint64_t bits, int64_t n, bool stream) const {
    const __m512i values = _mm512_mask_blend_epi16(static_cast<__mmask32>(bits),
                                                   _mm512_set1_epi16(static_cast<short>(0xBF80)),
                                                   _mm512_set1_epi16(0x3F80));
    if (stream && n == kValues) {
      _mm512_stream_si512(reinterpret_cast<__m512i*>(dst), values);
    } else {
      _mm512_mask_storeu_epi16(dst, static_cast<__mmask32>((uint64_t{1} << n) - 1), values);
    }
  }
};

// 16 float32 values (one cache line) per write.
struct Avx512WriterF32 {
  static constexpr int kValues = 16;
  static int64_t Slots(int64_t n) { return n; }
  BNN_TARGET_AVX512 void Write(uint32_t* dst, uint64_t bits, int64_t n, bool stream) const {
    const __m512i values = _mm512_mask_blend_epi32(static_cast<__mmask16>(bits),
                                                   _mm512_set1_epi32(static_cast<int>(0xBF800000u)),
                                                   _mm512_set1_epi32(0x3F800000));
    if (stream && n == kValues) {
      _mm512_stream_si512(reinterpret_cast<__m512i*>(dst), values);
    } else {
      _mm512_mask_storeu_epi32(dst, static_cast<__mmask16>((uint64_t{1} << n) - 1), values);
    }
  }
};

template <typename T>
struct Avx512Writer;
template <>
struct Avx512Writer<float> {
  using type = Avx512WriterF32;
};
template <>
struct Avx512Writer<::tensorflow::bfloat16> {
  using type = Avx512WriterBf16;
};
#endif

// The shape of one call.
struct Geometry {
  int64_t batch, h, w, words, kh, kw, sh, sw, c, ho, wo, columns, row_words;
  int64_t row_values;  // the Bits a patch row takes in the output
};

// Patch rows [first, last) from the planes, through `writer`.
template <typename Writer, typename Bits>
void WriteRows(const Writer& writer, const Geometry& g, const uint64_t* planes, Bits* out,
               bool stream, int64_t first, int64_t last) {
  for (int64_t r = first; r < last; ++r) {  // r = (i * kw + j) * c + k
    const int64_t k = r % g.c, tap = r / g.c, i = tap / g.kw, j = tap % g.kw;
    RowStream<Writer, Bits> row_stream{writer, out + r * g.row_values, stream};
    for (int64_t b = 0; b < g.batch; ++b) {
      for (int64_t y = 0; y < g.ho; ++y) {
        const uint64_t* row = planes + ((k * g.batch + b) * g.h + y * g.sh + i) * g.row_words;
        for (int64_t x0 = 0; x0 < g.wo; x0 += 32) {
          const int64_t n = std::min<int64_t>(32, g.wo - x0);
          row_stream.Append(PlaneBits(row, j + x0 * g.sw, g.sw, n), n);
        }
      }
    }
    row_stream.Finish();
    // zero words past a packed row's bits (value rows end where their values do)
    std::fill(row_stream.dst + Writer::Slots(row_stream.count), out + (r + 1) * g.row_values,
              Bits{0});
  }
#ifdef BNN_X86
  if (stream) _mm_sfence();
#endif
}

#ifdef BNN_X86
template <typename Writer, typename Bits>
BNN_TARGET_AVX512 void WriteRowsAvx512(const Writer& writer, const Geometry& g,
                                       const uint64_t* planes, Bits* out, bool stream,
                                       int64_t first, int64_t last) {
  WriteRows(writer, g, planes, out, stream, first, last);
}
#endif

template <typename T>
class SignPatchesOp : public OpKernel {
 public:
  explicit SignPatchesOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    for (const char* name : {"kh", "kw", "sh", "sw", "c"}) {
      int64_t value;
      OP_REQUIRES_OK(ctx, ctx->GetAttr(name, &value));
      attrs_.push_back(value);
    }
    std::string isa;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("isa", &isa));
    OP_REQUIRES(ctx, isa != "avx512" || HasAvx512(),
                InvalidArgument("kernel variant 'avx512' needs instructions this CPU lacks"));
    avx512_ = isa == "avx512" || (isa == "auto" && HasAvx512());
  }

  void Compute(OpKernelContext* ctx) override {
    using Bits = typename Element<T>::Bits;
    Geometry g;
    g.kh = attrs_[0], g.kw = attrs_[1], g.sh = attrs_[2], g.sw = attrs_[3], g.c = attrs_[4];
    const Tensor& input = ctx->input(0);
    OP_REQUIRES(ctx, input.dims() == 4,
                InvalidArgument("words must be (batch, h, w, words), got ",
                                input.shape().DebugString()));
    g.batch = input.dim_size(0), g.h = input.dim_size(1), g.w = input.dim_size(2);
    g.words = input.dim_size(3);
    OP_REQUIRES(ctx, g.words == (g.c + 63) / 64,
                InvalidArgument("c = ", g.c, " channels take ", (g.c + 63) / 64,
                                " words, got ", g.words));
    OP_REQUIRES(ctx, g.h >= g.kh && g.w >= g.kw,
                InvalidArgument("a ", g.kh, "x", g.kw, " kernel does not fit a ", g.h, "x", g.w,
                                " image"));
    g.ho = (g.h - g.kh) / g.sh + 1, g.wo = (g.w - g.kw) / g.sw + 1;
    g.columns = g.batch * g.ho * g.wo;
    constexpr bool kPacked = std::is_same<T, int64_t>::value;
    const int64_t row_length = kPacked ? (g.columns + 63) / 64 : g.columns;  // in T
    g.row_values = kPacked ? 2 * row_length : g.columns;                       // in Bits
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({g.kh * g.kw * g.c, row_length}),
                                             &output));
    if (g.columns == 0) return;

    // planes[((k * batch + b) * h + y) * row_words + ...]: channel k of image row (b, y), a bit
    // per pixel, then a zero word.
    g.row_words = (g.w + 63) / 64 + 1;
    Tensor planes_tensor;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_INT64,
                                           TensorShape({g.c * g.batch * g.h * g.row_words}),
                                           &planes_tensor));
    uint64_t* planes = reinterpret_cast<uint64_t*>(planes_tensor.flat<int64_t>().data());
    const uint64_t* in = reinterpret_cast<const uint64_t*>(input.flat<int64_t>().data());
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads()->workers;
    auto to_planes = [=](int64_t first, int64_t last) {
      uint64_t block[64];
      for (int64_t row = first; row < last; ++row) {  // row = b * h + y
        const uint64_t* pixels = in + row * g.w * g.words;
        for (int64_t word = 0; word < g.words; ++word) {
          const int64_t channels = std::min<int64_t>(64, g.c - word * 64);
          uint64_t* plane = planes + (word * 64 * g.batch * g.h + row) * g.row_words;
          const int64_t plane_step = g.batch * g.h * g.row_words;  // from channel to channel
          for (int64_t x0 = 0; x0 < g.w; x0 += 64) {
            const int64_t n = std::min<int64_t>(64, g.w - x0);
            for (int64_t x = 0; x < n; ++x) block[x] = pixels[(x0 + x) * g.words + word];
            std::fill(block + n, block + 64, 0);
            Transpose64(block);
            for (int64_t t = 0; t < channels; ++t) plane[t * plane_step + x0 / 64] = block[t];
          }
          for (int64_t t = 0; t < channels; ++t) plane[t * plane_step + g.row_words - 1] = 0;
        }
      }
    };
    workers->ParallelFor(g.batch * g.h, g.w * g.words * 40, to_planes);

    Bits* out = reinterpret_cast<Bits*>(output->flat<T>().data());
    const bool large = output->TotalBytes() >= kStreamBytes;
    // Streamed writes need each row to start on a cache line (64 bytes).
    const bool aligned = (g.row_values * sizeof(Bits)) % 64 == 0 &&
                         reinterpret_cast<uintptr_t>(out) % 64 == 0;
    const int64_t cost = g.columns * sizeof(Bits);
    if constexpr (kPacked) {
      workers->ParallelFor(g.kh * g.kw * g.c, g.columns, [&](int64_t first, int64_t last) {
        WriteRows(BitWriter(), g, planes, out, false, first, last);
      });
      return;
    } else {
      Write(ctx, g, planes, out, large && aligned, cost);
    }
  }

 private:
  void Write(OpKernelContext* ctx, const Geometry& g, const uint64_t* planes,
             typename Element<T>::Bits* out, bool stream, int64_t cost) {
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads()->workers;
#ifdef BNN_X86
    if (avx512_) {
      const typename Avx512Writer<T>::type writer;
      workers->ParallelFor(g.kh * g.kw * g.c, cost, [&](int64_t first, int64_t last) {
        WriteRowsAvx512(writer, g, planes, out, stream, first, last);
      });
      return;
    }
#endif
    using Bits = typename Element<T>::Bits;
    static const TableWriter<Bits> table(Element<T>::kPlus, Element<T>::kMinus);
    workers->ParallelFor(g.kh * g.kw * g.c, cost, [&](int64_t first, int64_t last) {
      WriteRows(table, g, planes, out, stream, first, last);
    });
  }

  std::vector<int64_t> attrs_;
  bool avx512_ = false;
};

REGISTER_KERNEL_BUILDER(Name("BnnSignPatches").Device(DEVICE_CPU).TypeConstraint<float>("T"),
                        SignPatchesOp<float>);
REGISTER_KERNEL_BUILDER(
    Name("BnnSignPatches").Device(DEVICE_CPU).TypeConstraint<::tensorflow::bfloat16>("T"),
    SignPatchesOp<::tensorflow::bfloat16>);
REGISTER_KERNEL_BUILDER(Name("BnnSignPatches").Device(DEVICE_CPU).TypeConstraint<int64_t>("T"),
                        SignPatchesOp<int64_t>);

}  // namespace
}  // namespace bnn
