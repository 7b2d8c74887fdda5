// The +-1 patches of a packed image (im2col), for the kernel gradient of bnn's binary
// convolution, as float32 or bfloat16 values or as packed bits; beside their plain reference
// kernels (reference::SignPatches, reference::SignPatchesPacked) and with the dispatch function
// (Rows) that maps an Isa to a variant.
//
//   words (batch, h, w, ceil(c / 64)) int64, kh, kw, sh, sw, c -> T (kh * kw * c, batch * ho *
//       wo), ho = (h - kh) / sh + 1, wo = (w - kw) / sw + 1: row (i * kw + j) * c + k, column
//       (b * ho + y) * wo + x holds channel k of pixel (b, y * sh + i, x * sw + j) as +1 (bit set)
//       or -1 (bit clear), in float32 or bfloat16; with T = int64, the rows' bits packed as
//       bnn.ops.bitpack.pack packs them: (kh * kw * c, ceil(batch * ho * wo / 64)), column t in bit
//       t % 64 of word t / 64.
//
// These are the transposed "valid" patches of the image, so that one matrix product with the
// output gradient dy (batch * ho * wo, filters) gives the kernel's gradient (kh * kw * c,
// filters). oneDNN's bfloat16 products run this at the speed of the forward convolution, where
// its bfloat16 kernel-gradient convolution takes up to 2.5 times as long. The packed rows are the
// +-1 operand of sign_matmul.h's table-lookup product, which needs no float patches at all.
//
// First, each image row is turned into bit planes, one per channel, a bit per pixel (64x64 bit
// transposes: ToPlanes). Then each patch row is a stream of those plane bits, expanded to values
// eight at a time through a table, or, on CPUs with AVX-512, 32 (bfloat16) or 16 (float32) at a
// time by a masked blend (kAvx512; kAvx2 and kGeneric take the table); patches of 8 MiB or more
// are written past the caches.
#ifndef BNN_NATIVE_CORE_SIGN_PATCHES_H_
#define BNN_NATIVE_CORE_SIGN_PATCHES_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/bfloat16.h"
#include "core/bits.h"
#include "core/cpu.h"

namespace bnn {
namespace core {
namespace reference {

// The shape shared by the reference patches: ho, wo and the columns batch * ho * wo.
inline int64_t PatchColumns(int64_t batch, int64_t h, int64_t w, int64_t kh, int64_t kw,
                            int64_t sh, int64_t sw, int64_t* ho, int64_t* wo) {
  *ho = (h - kh) / sh + 1;
  *wo = (w - kw) / sw + 1;
  return batch * *ho * *wo;
}

// Whether channel k of pixel (b, y, x) of words (batch, h, w, ceil(c / 64)) is set.
inline bool PixelBit(const int64_t* words, int64_t h, int64_t w, int64_t c, int64_t b,
                     int64_t y, int64_t x, int64_t k) {
  return GetBit(words + ((b * h + y) * w + x) * WordsFor(c), k);
}

// out (kh * kw * c, batch * ho * wo) T (float or bfloat16): row (i * kw + j) * c + k, column
// (b * ho + y) * wo + x is +1 where channel k of pixel (b, y * sh + i, x * sw + j) is set, else -1.
template <typename T>
void SignPatches(const int64_t* words, int64_t batch, int64_t h, int64_t w, int64_t c,
                 int64_t kh, int64_t kw, int64_t sh, int64_t sw, T* out) {
  int64_t ho, wo;
  const int64_t columns = PatchColumns(batch, h, w, kh, kw, sh, sw, &ho, &wo);
  for (int64_t i = 0; i < kh; ++i)
    for (int64_t j = 0; j < kw; ++j)
      for (int64_t k = 0; k < c; ++k)
        for (int64_t b = 0; b < batch; ++b)
          for (int64_t y = 0; y < ho; ++y)
            for (int64_t x = 0; x < wo; ++x) {
              const bool set = PixelBit(words, h, w, c, b, y * sh + i, x * sw + j, k);
              out[((i * kw + j) * c + k) * columns + (b * ho + y) * wo + x] =
                  FromFloat<T>(set ? 1.0f : -1.0f);
            }
}

// The same rows packed: out (kh * kw * c, ceil(batch * ho * wo / 64)) words, column t in bit
// t % 64 of word t / 64, pad bits 0.
inline void SignPatchesPacked(const int64_t* words, int64_t batch, int64_t h, int64_t w,
                              int64_t c, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                              int64_t* out) {
  int64_t ho, wo;
  const int64_t columns = PatchColumns(batch, h, w, kh, kw, sh, sw, &ho, &wo);
  const int64_t row_words = WordsFor(columns);
  for (int64_t t = 0; t < kh * kw * c * row_words; ++t) out[t] = 0;
  for (int64_t i = 0; i < kh; ++i)
    for (int64_t j = 0; j < kw; ++j)
      for (int64_t k = 0; k < c; ++k)
        for (int64_t b = 0; b < batch; ++b)
          for (int64_t y = 0; y < ho; ++y)
            for (int64_t x = 0; x < wo; ++x)
              if (PixelBit(words, h, w, c, b, y * sh + i, x * sw + j, k))
                SetBit(out + ((i * kw + j) * c + k) * row_words, (b * ho + y) * wo + x);
}

}  // namespace reference

namespace sign_patches {

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
struct Element<bfloat16> {
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

#ifdef BNN_X86
// 32 bfloat16 values (one cache line) per write, by a masked blend.
struct Avx512WriterBf16 {
  static constexpr int kValues = 32;
  static int64_t Slots(int64_t n) { return n; }
  BNN_TARGET_AVX512BW void Write(uint16_t* dst, uint64_t bits, int64_t n, bool stream) const {
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
  BNN_TARGET_AVX512BW void Write(uint32_t* dst, uint64_t bits, int64_t n, bool stream) const {
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
struct Avx512Writer<bfloat16> {
  using type = Avx512WriterBf16;
};
#endif

// The shape of one call.
struct Geometry {
  int64_t batch, h, w, words, kh, kw, sh, sw, c, ho, wo, columns, row_words;
  int64_t row_values;  // the Bits a patch row takes in the output
};

// The geometry of the patches of a kh x kw kernel at strides sh, sw over images (batch, h, w) of
// c channels (h >= kh, w >= kw); `packed`: rows of packed bits (T = int64), else values.
inline Geometry MakeGeometry(int64_t batch, int64_t h, int64_t w, int64_t c, int64_t kh,
                             int64_t kw, int64_t sh, int64_t sw, bool packed) {
  Geometry g;
  g.batch = batch, g.h = h, g.w = w, g.words = (c + 63) / 64;
  g.kh = kh, g.kw = kw, g.sh = sh, g.sw = sw, g.c = c;
  g.ho = (g.h - g.kh) / g.sh + 1, g.wo = (g.w - g.kw) / g.sw + 1;
  g.columns = g.batch * g.ho * g.wo;
  const int64_t row_length = packed ? (g.columns + 63) / 64 : g.columns;  // in T
  g.row_values = packed ? 2 * row_length : g.columns;                       // in Bits
  g.row_words = (g.w + 63) / 64 + 1;
  return g;
}

// The bit planes the patch rows are read from: planes[((k * batch + b) * h + y) * row_words +
// ...] holds channel k of image row (b, y), a bit per pixel, then a zero word; c * batch * h *
// row_words words in all.
inline int64_t PlaneWords(const Geometry& g) { return g.c * g.batch * g.h * g.row_words; }

// Image rows [first, last) (row = b * h + y) of the packed image `in` (batch, h, w, words) turned
// into their bit planes, one 64x64 bit transpose per 64 pixels and word of channels.
inline void ToPlanes(const Geometry& g, const uint64_t* in, int64_t first, int64_t last,
                     uint64_t* planes) {
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
}

// Patch rows [first, last) from the planes, through `writer`. Reference: reference::SignPatches
// and reference::SignPatchesPacked.
template <typename Writer, typename Bits>
inline void WriteRows(const Writer& writer, const Geometry& g, const uint64_t* planes, Bits* out,
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
// WriteRows compiled for AVX-512 F and BW, for the Avx512 writers. Reference:
// reference::SignPatches.
template <typename Writer, typename Bits>
BNN_TARGET_AVX512BW void WriteRowsAvx512(const Writer& writer, const Geometry& g,
                                         const uint64_t* planes, Bits* out, bool stream,
                                         int64_t first, int64_t last) {
  WriteRows(writer, g, planes, out, stream, first, last);
}
#endif

// Whether this CPU runs what Rows picks for `isa`: kAvx512 needs AVX-512 F and BW; the table
// that kAvx2 and kGeneric take runs anywhere.
inline bool CpuRuns(Isa isa) { return isa != kAvx512 || HasAvx512Bw(); }

// Whether patches of `bytes` at `out`, rows of `row_bytes`, are written past the caches: large
// ones whose rows all start on a cache line (64 bytes).
inline bool StreamWrites(int64_t bytes, int64_t row_bytes, const void* out) {
  return bytes >= kStreamBytes && row_bytes % 64 == 0 &&
         reinterpret_cast<uintptr_t>(out) % 64 == 0;
}

// Patch rows [first, last) of T (float, bfloat16 or int64: packed bits) into out (the Bits of
// kh * kw * c rows of g.row_values each), the dispatch of the writers: for values, kAvx512 to
// WriteRowsAvx512 with the masked-blend writer, kAvx2 and kGeneric to WriteRows with the table
// (`stream`: written past the caches, see StreamWrites); for bits, WriteRows with BitWriter (never
// streamed). Reference: reference::SignPatches, reference::SignPatchesPacked.
template <typename T>
void Rows(Isa isa, const Geometry& g, const uint64_t* planes, typename Element<T>::Bits* out,
          bool stream, int64_t first, int64_t last) {
  if constexpr (std::is_same<T, int64_t>::value) {
    WriteRows(BitWriter(), g, planes, out, false, first, last);
  } else {
    using Bits = typename Element<T>::Bits;
#ifdef BNN_X86
    if (isa == kAvx512) {
      const typename Avx512Writer<T>::type writer;
      WriteRowsAvx512(writer, g, planes, out, stream, first, last);
      return;
    }
#endif
    static const TableWriter<Bits> table(Element<T>::kPlus, Element<T>::kMinus);
    WriteRows(table, g, planes, out, stream, first, last);
  }
}

}  // namespace sign_patches
}  // namespace core
}  // namespace bnn

#endif  // BNN_NATIVE_CORE_SIGN_PATCHES_H_
