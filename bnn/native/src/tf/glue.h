// What bnn's TensorFlow op glue (the *_op(s).cc files next to this header) shares: TensorFlow's
// op and kernel headers and the names it uses from them, the `isa` attribute resolved into the
// core kernels' Isa, the intra-op thread pool, and the views of TensorFlow's bfloat16 buffers as
// the core kernels' bfloat16.
#ifndef BNN_NATIVE_TF_GLUE_H_
#define BNN_NATIVE_TF_GLUE_H_

#include <cstdint>
#include <string>

#include "core/bfloat16.h"
#include "core/cpu.h"
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
using core::Isa;

using Workers = ::tensorflow::thread::ThreadPool;

// The `isa` attribute of every op that has one.
#define BNN_VARIANT_ATTR "isa: {'auto', 'generic', 'avx2', 'avx512'} = 'auto'"

// The op's `isa` attribute ("auto", "generic", "avx2" or "avx512") as an Isa, for a kernel family
// whose `CpuRuns` says whether this CPU runs what the family picks for an Isa: "auto" is the best
// Isa it runs, a named variant is that Isa, an error where the CPU lacks its instructions.
inline Status ResolveIsa(OpKernelConstruction* ctx, bool (*cpu_runs)(Isa), Isa* isa) {
  std::string name;
  TF_RETURN_IF_ERROR(ctx->GetAttr("isa", &name));
  if (name == "auto") {
    *isa = cpu_runs(core::kAvx512) ? core::kAvx512
           : cpu_runs(core::kAvx2) ? core::kAvx2
                                   : core::kGeneric;
    return Status();
  }
  *isa = name == "avx512" ? core::kAvx512 : name == "avx2" ? core::kAvx2 : core::kGeneric;
  if (!cpu_runs(*isa))
    return InvalidArgument("kernel variant '", name, "' needs instructions this CPU lacks");
  return Status();
}

// The intra-op threads that an op's work is split over.
inline Workers* IntraOpThreads(OpKernelContext* ctx) {
  return ctx->device()->tensorflow_cpu_worker_threads()->workers;
}

// The core kernels' element type for T: tensorflow::bfloat16 is core::bfloat16 (the same 2 bytes
// of float32's high half), other types are themselves.
template <typename T>
struct CoreType {
  using type = T;
};
template <>
struct CoreType<::tensorflow::bfloat16> {
  using type = core::bfloat16;
};
static_assert(sizeof(::tensorflow::bfloat16) == sizeof(core::bfloat16),
              "tensorflow::bfloat16 and core::bfloat16 must have one layout");

template <typename T>
typename CoreType<T>::type* AsCore(T* p) {
  return reinterpret_cast<typename CoreType<T>::type*>(p);
}
template <typename T>
const typename CoreType<T>::type* AsCore(const T* p) {
  return reinterpret_cast<const typename CoreType<T>::type*>(p);
}

}  // namespace bnn

#endif  // BNN_NATIVE_TF_GLUE_H_
