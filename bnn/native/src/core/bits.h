// Bit layout of bnn's packed operands, and the bit-matrix helpers the kernels share.
//
// A packed +-1 vector (bnn.ops.bitpack) holds bit i of element i, 1 for
// +1 (or x >= 0) and 0 for -1, 64 bits to a 64-bit word, least significant bit first; the pad
// bits past its length are 0. WordsFor, GetBit and SetBit spell that layout out for the
// reference kernels; Transpose64 turns 64 rows of bits into 64 columns.
#ifndef BNN_NATIVE_CORE_BITS_H_
#define BNN_NATIVE_CORE_BITS_H_

#include <cstdint>

namespace bnn {
namespace core {

// Words that hold n bits.
constexpr int64_t WordsFor(int64_t n) { return (n + 63) / 64; }

// Bit i of the bits packed in words.
inline bool GetBit(const uint64_t* words, int64_t i) { return (words[i >> 6] >> (i & 63)) & 1; }
inline bool GetBit(const int64_t* words, int64_t i) {
  return GetBit(reinterpret_cast<const uint64_t*>(words), i);
}

// Sets bit i of the bits packed in words (which start cleared).
inline void SetBit(uint64_t* words, int64_t i) { words[i >> 6] |= uint64_t{1} << (i & 63); }
inline void SetBit(int64_t* words, int64_t i) { SetBit(reinterpret_cast<uint64_t*>(words), i); }

// Set bits of a word, counted one at a time (for the reference kernels; the optimized ones use
// the POPCNT instruction or vector lookups).
inline int Popcount(uint64_t v) {
  int count = 0;
  for (; v != 0; v >>= 1) count += static_cast<int>(v & 1);
  return count;
}

// A 64x64 bit matrix, row i in a[i] (bit t: column t), transposed in place: a[t] bit i holds it.
inline void Transpose64(uint64_t* a) {
  uint64_t m = 0x00000000FFFFFFFFULL;
  for (int j = 32; j != 0; j >>= 1, m ^= m << j) {
    for (int k = 0; k < 64; k = ((k | j) + 1) & ~j) {
      const uint64_t t = ((a[k] >> j) ^ a[k | j]) & m;
      a[k | j] ^= t;
      a[k] ^= t << j;
    }
  }
}

}  // namespace core
}  // namespace bnn

#endif  // BNN_NATIVE_CORE_BITS_H_
