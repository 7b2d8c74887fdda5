// A 64x64 bit-matrix transpose shared by bnn's native kernels (sign_patches.cc, sign_matmul.cc).
#ifndef BNN_BIT_TRANSPOSE_H_
#define BNN_BIT_TRANSPOSE_H_

#include <cstdint>

namespace bnn {

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

}  // namespace bnn

#endif  // BNN_BIT_TRANSPOSE_H_
