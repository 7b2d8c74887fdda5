// TensorFlow op of the packing of a float tensor's sign bits into int64 words, for the operands of
// bnn's native training products (see bnn/bitops.py), built into the same library as
// xor_popcount_ops.cc by bnn/native/build.py: its registration, shape function, input checks and the
// split of its work over TensorFlow's intra-op threads. The kernels are in core/sign_pack.h.
//
//   BnnPackSigns(x: T, along_rows, transpose_output, isa) -> int64 words, T float32 or bfloat16:
//       along the last axis (along_rows false): x (..., n) -> (..., ceil(n / 64));
//       along the rows (along_rows true): x (..., r, c) -> (..., ceil(r / 64), c), or, with
//       transpose_output, (..., c, ceil(r / 64)).
//   Bit t % 64 of word t / 64 is set where element t of its line is >= 0 (so -0 counts as +1,
//   NaN as -1) and pad bits past n (or r) are clear: bnn.ops.bitpack's layout.
//
// The sign bits of 8 values come from one vector comparison and its mask ("avx2"; so does
// "avx512", and "auto" where the CPU has AVX2), or from scalar comparisons ("generic"). Packing
// along the rows takes tiles of 64 rows by 64 columns, transposed by 64x64 bit transposes; one
// pass over x either way (see core/sign_pack.h).

#include <algorithm>
#include <cstdint>

#include "core/sign_pack.h"
#include "tf/glue.h"

namespace bnn {
namespace {

using ::tensorflow::bfloat16;
using core::sign_pack::Layout;

REGISTER_OP("BnnPackSigns")
    .Input("x: T")
    .Output("words: int64")
    .Attr("T: {float, bfloat16}")
    .Attr("along_rows: bool = false")
    .Attr("transpose_output: bool = false")
    .Attr(BNN_VARIANT_ATTR)
    .SetShapeFn([](InferenceContext* ctx) {
      bool along_rows, transpose;
      TF_RETURN_IF_ERROR(ctx->GetAttr("along_rows", &along_rows));
      TF_RETURN_IF_ERROR(ctx->GetAttr("transpose_output", &transpose));
      ShapeHandle x;
      TF_RETURN_IF_ERROR(ctx->WithRankAtLeast(ctx->input(0), along_rows ? 2 : 1, &x));
      const int32_t rank = ctx->Rank(x);
      const int32_t axis = along_rows ? rank - 2 : rank - 1;
      DimensionHandle n = ctx->Dim(x, axis), words;
      if (ctx->ValueKnown(n)) {
        words = ctx->MakeDim((ctx->Value(n) + 63) / 64);
      } else {
        words = ctx->UnknownDim();
      }
      ShapeHandle out;
      TF_RETURN_IF_ERROR(ctx->ReplaceDim(x, axis, words, &out));
      if (along_rows && transpose) {
        ShapeHandle outer, tail;
        TF_RETURN_IF_ERROR(ctx->Subshape(x, 0, rank - 2, &outer));
        TF_RETURN_IF_ERROR(ctx->Concatenate(outer, ctx->Vector(ctx->Dim(x, rank - 1)), &tail));
        TF_RETURN_IF_ERROR(ctx->Concatenate(tail, ctx->Vector(words), &out));
      }
      ctx->set_output(0, out);
      return Status();
    });

template <typename T>
class PackSignsOp : public OpKernel {
 public:
  explicit PackSignsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("along_rows", &along_rows_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("transpose_output", &transpose_));
    OP_REQUIRES_OK(ctx, ResolveIsa(ctx, core::sign_pack::CpuRuns, &isa_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    const int rank = x.dims();
    OP_REQUIRES(ctx, rank >= (along_rows_ ? 2 : 1),
                InvalidArgument("packing signs along the ", along_rows_ ? "rows" : "last axis",
                                " needs a tensor of rank >= ", along_rows_ ? 2 : 1, ", got ",
                                x.shape().DebugString()));
    Layout l{1, 1, x.dim_size(rank - 1), along_rows_, along_rows_ && transpose_};
    for (int d = 0; d < rank - 1; ++d) l.outer *= x.dim_size(d);
    if (along_rows_) {
      l.rows = x.dim_size(rank - 2);
      l.outer /= std::max<int64_t>(l.rows, 1);
      if (l.rows == 0) l.outer = 0;
    }
    const int64_t words = ((along_rows_ ? l.rows : l.cols) + 63) / 64;
    TensorShape shape = x.shape();
    shape.set_dim(along_rows_ ? rank - 2 : rank - 1, words);
    if (l.transpose) {
      shape.set_dim(rank - 2, l.cols);
      shape.set_dim(rank - 1, words);
    }
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &output));
    if (output->NumElements() == 0) return;
    uint64_t* out = reinterpret_cast<uint64_t*>(output->flat<int64_t>().data());
    const auto* in = AsCore(x.flat<T>().data());
    const auto run = core::sign_pack::Select<typename CoreType<T>::type>(isa_);
    IntraOpThreads(ctx)->ParallelFor(
        core::sign_pack::TaskCount(l), core::sign_pack::TaskCost(l),
        [&](int64_t first, int64_t last) { run(in, l, first, last, out); });
  }

 private:
  bool along_rows_ = false, transpose_ = false;
  Isa isa_ = core::kGeneric;
};

REGISTER_KERNEL_BUILDER(Name("BnnPackSigns").Device(DEVICE_CPU).TypeConstraint<float>("T"),
                        PackSignsOp<float>);
REGISTER_KERNEL_BUILDER(Name("BnnPackSigns").Device(DEVICE_CPU).TypeConstraint<bfloat16>("T"),
                        PackSignsOp<bfloat16>);

}  // namespace
}  // namespace bnn
