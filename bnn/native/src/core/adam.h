// The one-pass Adam update (and weight clip) of bnn's optimizer, in place on float32 arrays with a
// float32 or bfloat16 gradient; beside its plain reference kernel (reference::AdamUpdate) and
// with the dispatch function (Run) that maps an Isa to a variant.
//
//   m <- m + (grad - m) * (1 - beta1)
//   v <- v + (grad * grad - v) * (1 - beta2)
//   var <- min(max(var - (m * alpha) / (sqrt(v) + epsilon), -clip), clip)
//
// alpha is the step's bias-corrected rate, lr * sqrt(1 - beta2^t) / (1 - beta1^t). These are
// TensorFlow's ApplyAdam expressions in its order (so, built without contraction into fused
// multiply-adds, the same float32 results as ResourceApplyAdam), followed by the clip that
// bnn.layers.WeightClip applies after the update (clip = inf: none); a bfloat16 gradient is
// widened as it is read. Every variant computes each element with the same float32 operations
// (division and square root are correctly rounded in vector registers too), so all of them equal
// the reference bit for bit.
#ifndef BNN_NATIVE_CORE_ADAM_H_
#define BNN_NATIVE_CORE_ADAM_H_

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/bfloat16.h"
#include "core/cpu.h"

namespace bnn {
namespace core {
namespace reference {

// Elements [0, size) of the update, one at a time, keep1 = 1 - beta1 and keep2 = 1 - beta2.
template <typename T>
void AdamUpdate(const T* grad, float* var, float* m, float* v, int64_t size, float alpha,
                float keep1, float keep2, float epsilon, float clip) {
  for (int64_t i = 0; i < size; ++i) {
    const float g = Widen(grad[i]);
    m[i] = m[i] + (g - m[i]) * keep1;
    v[i] = v[i] + (g * g - v[i]) * keep2;
    const float updated = var[i] - (m[i] * alpha) / (std::sqrt(v[i]) + epsilon);
    var[i] = std::min(std::max(updated, -clip), clip);
  }
}

}  // namespace reference

namespace adam {

// The loop reads and writes each element of its arrays at one index only, so it has no dependence
// between iterations; this lets the compiler vectorize it without checks that they do not alias.
#if defined(__clang__)
#define BNN_INDEPENDENT _Pragma("clang loop vectorize(assume_safety)")
#elif defined(__GNUC__)
#define BNN_INDEPENDENT _Pragma("GCC ivdep")
#else
#define BNN_INDEPENDENT
#endif

// One update's operands: the gradient, the moments and the variable (in place), and its scalars.
template <typename T>
struct Range {
  const T* g;
  float *m, *v, *w;
  float alpha, keep1, keep2, epsilon, clip;
};

// The update of elements [first, last). Inlined into a variant per instruction set below.
// Reference: reference::AdamUpdate.
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
// Reference: reference::AdamUpdate.
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

// Whether this CPU runs what Run picks for `isa`: the AVX2 loop for kAvx2 and kAvx512.
inline bool CpuRuns(Isa isa) { return isa == kGeneric || HasAvx2(); }

// The variant for this CPU: kAvx2 where it has AVX2, else kGeneric.
inline Isa Best() { return HasAvx2() ? kAvx2 : kGeneric; }

// Elements [first, last) of the update, the dispatch of its variants: kAvx2 and kAvx512 to
// UpdateAvx2, kGeneric to Update (inlined here).
template <typename T>
inline void Run(Isa isa, const Range<T>& range, int64_t first, int64_t last) {
  if (isa != kGeneric) {
    UpdateAvx2(range, first, last);
  } else {
    Update(range, first, last);
  }
}

}  // namespace adam
}  // namespace core
}  // namespace bnn

#endif  // BNN_NATIVE_CORE_ADAM_H_
