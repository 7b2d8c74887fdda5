// TensorFlow op of bnn's native Adam update for its optimizer (see bnn/optimizers.py), built into
// the same library as xor_popcount_ops.cc by bnn/native/build.py: its registration, input checks, the
// locking of its variables and the split of its work over TensorFlow's intra-op threads. The
// kernel is in core/adam.h.
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
// bnn.layers.WeightClip applies after the update (clip = inf: none); a bfloat16 gradient is
// widened as it is read. One pass over the variable, its two moments and its gradient replaces
// the update and the clip's own pass over the weights, in a train step that XLA does not compile.
// The update runs on 256-bit registers where the CPU has AVX2 (the op has no `isa` attribute).

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/adam.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tf/glue.h"

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
    const auto* g = AsCore(grad.flat<T>().data());
    const int64_t size = grad.NumElements();
    static const Isa isa = core::adam::Best();  // the CPU does not change
    auto work = [=](int64_t first, int64_t last) {
      const core::adam::Range<typename CoreType<T>::type> range{
          g, m, v, w, alpha, keep1, keep2, epsilon, clip};
      core::adam::Run(isa, range, first, last);
    };
    constexpr int64_t kCyclesPerElement = 12;  // memory: 28 bytes moved per element
    IntraOpThreads(ctx)->ParallelFor(size, kCyclesPerElement, work);
  }
};

REGISTER_KERNEL_BUILDER(Name("BnnAdamUpdate").Device(DEVICE_CPU).TypeConstraint<float>("T"),
                        AdamUpdateOp<float>);
REGISTER_KERNEL_BUILDER(
    Name("BnnAdamUpdate").Device(DEVICE_CPU).TypeConstraint<::tensorflow::bfloat16>("T"),
    AdamUpdateOp<::tensorflow::bfloat16>);

}  // namespace
}  // namespace bnn
