// A native Adam update for bnn's optimizer (see bnn/optimizers.py), built into the same library as
// xor_popcount.cc by bnn/kernels.py.
//
//   BnnAdamUpdate(var, m, v: float32 resource variables, grad float32 or bfloat16, alpha, beta1,
//                 beta2, epsilon, clip: float32 scalars), in place:
//       m <- m + (grad - m) * (1 - beta1)
//       v <- v + (grad * grad - v) * (1 - beta2)
//       var <- min(max(var - (m * alpha) / (sqrt(v) + epsilon), -clip), clip)
//
// alpha is the step's bias-corrected rate, lr * sqrt(1 - beta2^t) / (1 - beta1^t). These are
// TensorFlow's ApplyAdam expressions in its order (so, built without contraction into fused
// multiply-adds, the same float32 results as ResourceApplyAdam), followed by the clip that
// bnn.constraints.WeightClip applies after the update (clip = inf: none); a bfloat16 gradient is
// widened as it is read. One pass over the variable, its two moments and its gradient replaces
// the update and the clip's own pass over the weights, in a train step that XLA does not compile.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "native.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"

namespace bnn {
namespace {

using ::tensorflow::TensorShapeUtils;
using ::tensorflow::Var;

REGISTER_OP("BnnAdamUpdate")
    .Input("var: resource")
    .Input("m: resource")
    .Input("v: resource")
    .Input("grad: T")
    .Input("alpha: float")
    .Input("beta1: float")
    .Input("beta2: float")
    .Input("epsilon: float")
    .Input("clip: float")
    .Attr("T: {float, bfloat16}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle scalar;
      for (int i = 4; i < 9; ++i) TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 0, &scalar));
      return Status();
    });

// The loop reads and writes each element of its arrays at one index only, so it has no dependence
// between iterations; this lets the compiler vectorize it without checks that they do not alias.
#if defined(__clang__)
#define BNN_INDEPENDENT _Pragma("clang loop vectorize(assume_safety)")
#elif defined(__GNUC__)
#define BNN_INDEPENDENT _Pragma("GCC ivdep")
#else
#define BNN_INDEPENDENT
#endif

inline float Widen(float g) { return g; }

inline float Widen(::tensorflow::bfloat16 g) {  // the high half of a float32
  uint16_t half;
  std::memcpy(&half, &g, sizeof(half));
  const uint32_t bits = static_cast<uint32_t>(half) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

// One update's operands: the gradient, the moments and the variable (in place), and its scalars.
template <typename T>
struct Range {
  const T* g;
  float *m, *v, *w;
  float alpha, keep1, keep2, epsilon, clip;
};

// The update of elements [first, last). Inlined into a variant per instruction set below.
template <typename T>
inline __attribute__((always_inline)) void Update(const Range<T>& r, int64_t first,
                                                  int64_t last) {
  const T* g = r.g;
  float* m = r.m;
  float* v = r.v;
  float* w = r.w;
  BNN_INDEPENDENT
  for (int64_t i = first; i < last; ++i) {
    const float gi = Widen(g[i]);
    const float mi = m[i] + (gi - m[i]) * r.keep1;
    const float vi = v[i] + (gi * gi - v[i]) * r.keep2;
    const float wi = w[i] - (mi * r.alpha) / (std::sqrt(vi) + r.epsilon);
    m[i] = mi;
    v[i] = vi;
    w[i] = std::min(std::max(wi, -r.clip), r.clip);
  }
}

#if defined(__x86_64__) || defined(__i386__)
// The same loop over 256-bit registers (twice the square roots and divisions per instruction).
template <typename T>
__attribute__((target("avx2"))) void UpdateAvx2(const Range<T>& r, int64_t first, int64_t last) {
  Update(r, first, last);
}
#else
template <typename T>
void UpdateAvx2(const Range<T>& r, int64_t first, int64_t last) {
  Update(r, first, last);
}
#endif

// Locks the variables' mutexes in address order (as TensorFlow's own training ops do, so that no
// two updates wait on each other) and unlocks them when it goes out of scope.
class LockedInOrder {
 public:
  explicit LockedInOrder(std::vector<::tensorflow::mutex*> mutexes) : mutexes_(mutexes) {
    std::sort(mutexes_.begin(), mutexes_.end());
    mutexes_.erase(std::unique(mutexes_.begin(), mutexes_.end()), mutexes_.end());
    for (auto* mu : mutexes_) mu->lock();
  }
  ~LockedInOrder() {
    for (auto it = mutexes_.rbegin(); it != mutexes_.rend(); ++it) (*it)->unlock();
  }

 private:
  std::vector<::tensorflow::mutex*> mutexes_;
};

// Updates the three variables in place, under their locks. A variable whose buffer is still
// shared with an earlier read gets a copy first (copy on write), so that read keeps its value.
template <typename T>
class AdamUpdateOp : public OpKernel {
 public:
  explicit AdamUpdateOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& grad = ctx->input(3);
    for (int i = 4; i < 9; ++i)
      OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(ctx->input(i).shape()),
                  InvalidArgument("alpha, beta1, beta2, epsilon and clip must be scalars"));
    ::tensorflow::core::RefCountPtr<Var> vars[3];
    for (int i = 0; i < 3; ++i)
      OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, i), &vars[i]));
    LockedInOrder locked({vars[0]->mu(), vars[1]->mu(), vars[2]->mu()});
    float* data[3];
    for (int i = 0; i < 3; ++i) {
      Tensor* t = vars[i]->tensor();
      OP_REQUIRES(ctx, t->IsInitialized() && t->dtype() == ::tensorflow::DT_FLOAT,
                  InvalidArgument("var, m and v must be initialized float32 variables"));
      OP_REQUIRES(ctx, t->shape() == grad.shape(),
                  InvalidArgument("var, m, v and grad must have one shape, got ",
                                  t->shape().DebugString(), " and ",
                                  grad.shape().DebugString()));
      if (vars[i]->copy_on_read_mode.load() || !t->RefCountIsOne()) {
        Tensor copy;
        OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_FLOAT, t->shape(), &copy));
        std::memcpy(copy.flat<float>().data(), t->flat<float>().data(),
                    t->NumElements() * sizeof(float));
        *t = copy;
      }
      data[i] = t->flat<float>().data();
    }
    const float alpha = ctx->input(4).scalar<float>()();
    const float keep1 = 1.0f - ctx->input(5).scalar<float>()();
    const float keep2 = 1.0f - ctx->input(6).scalar<float>()();
    const float epsilon = ctx->input(7).scalar<float>()();
    const float clip = ctx->input(8).scalar<float>()();
    float* w = data[0];
    float* m = data[1];
    float* v = data[2];
    const T* g = grad.flat<T>().data();
    const int64_t size = grad.NumElements();
    static const bool avx2 = HasAvx2();  // the CPU does not change
    auto work = [=](int64_t first, int64_t last) {
      const Range<T> range{g, m, v, w, alpha, keep1, keep2, epsilon, clip};
      if (avx2) {
        UpdateAvx2(range, first, last);
      } else {
        Update(range, first, last);
      }
    };
    constexpr int64_t kCyclesPerElement = 12;  // memory: 28 bytes moved per element
    ctx->device()->tensorflow_cpu_worker_threads()->workers->ParallelFor(size, kCyclesPerElement,
                                                                        work);
  }
};

REGISTER_KERNEL_BUILDER(Name("BnnAdamUpdate").Device(DEVICE_CPU).TypeConstraint<float>("T"),
                        AdamUpdateOp<float>);
REGISTER_KERNEL_BUILDER(
    Name("BnnAdamUpdate").Device(DEVICE_CPU).TypeConstraint<::tensorflow::bfloat16>("T"),
    AdamUpdateOp<::tensorflow::bfloat16>);

}  // namespace
}  // namespace bnn
