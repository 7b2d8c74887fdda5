// What bnn's native kernels (xor_popcount.cc, adam_update.cc, sign_patches.cc, sign_matmul.cc,
// sign_pack.cc) share: TensorFlow's op and kernel headers, the names they use from them, whether
// the CPU has AVX2, and a 64x64 bit-matrix transpose.
#ifndef BNN_NATIVE_H_
#define BNN_NATIVE_H_

#include <cstdint>
#include <string>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/types.h"

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

// Whether the CPU running the kernels has AVX2 (false off x86).
inline bool HasAvx2() {
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2");
#else
  return false;
#endif
}

// Whether an op with an `isa` attribute ("auto", "generic", "avx2" or "avx512") runs its AVX2
// code: an error for a variant this CPU lacks, "generic" never, the others where it has AVX2.
inline Status UseAvx2(OpKernelConstruction* ctx, bool* avx2) {
  std::string isa;
  TF_RETURN_IF_ERROR(ctx->GetAttr("isa", &isa));
  if (isa != "auto" && isa != "generic" && !HasAvx2())
    return InvalidArgument("kernel variant '", isa, "' needs instructions this CPU lacks");
  *avx2 = isa != "generic" && HasAvx2();
  return Status();
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

}  // namespace bnn

#endif  // BNN_NATIVE_H_
