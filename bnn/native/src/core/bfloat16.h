// bfloat16 storage for the core kernels: the high 16 bits of a float32, with the conversions the
// kernels use. The TensorFlow glue passes tensorflow::bfloat16 buffers as this type (the same 2
// bytes); nothing here depends on TensorFlow or Eigen.
#ifndef BNN_NATIVE_CORE_BFLOAT16_H_
#define BNN_NATIVE_CORE_BFLOAT16_H_

#include <cmath>
#include <cstdint>
#include <cstring>

namespace bnn {
namespace core {

// A bfloat16 value as its bits: sign, 8 exponent bits, 7 mantissa bits.
struct bfloat16 {
  uint16_t bits;
};
static_assert(sizeof(bfloat16) == 2, "bfloat16 is 2 bytes");

// The float32 of the same value (exact): the bits in the float's high half.
inline float Widen(bfloat16 v) {
  const uint32_t bits = static_cast<uint32_t>(v.bits) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}
inline float Widen(float v) { return v; }

// f rounded to the nearest bfloat16, ties to even; NaN to the quiet NaN of its sign (0x7FC0 or
// 0xFFC0). The conversion of Eigen's (and so TensorFlow's) float -> bfloat16 cast.
inline bfloat16 Narrow(float f) {
  if (std::isnan(f)) return bfloat16{static_cast<uint16_t>(std::signbit(f) ? 0xFFC0 : 0x7FC0)};
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  bits += 0x7FFF + ((bits >> 16) & 1);
  return bfloat16{static_cast<uint16_t>(bits >> 16)};
}

// A float as T: itself, or rounded to bfloat16.
template <typename T>
T FromFloat(float f);
template <>
inline float FromFloat<float>(float f) { return f; }
template <>
inline bfloat16 FromFloat<bfloat16>(float f) { return Narrow(f); }

}  // namespace core
}  // namespace bnn

#endif  // BNN_NATIVE_CORE_BFLOAT16_H_
