// TensorFlow op of the ±1 patches of a packed image, for the kernel gradient of bnn's binary
// convolution (see bnn/bitops.py), built into the same library as xor_popcount_ops.cc by
// bnn/native/build.py: its registration, shape function, input checks, temporary buffers and the split
// of its work over TensorFlow's intra-op threads. The kernels are in core/sign_patches.h.
//
//   BnnSignPatches(words: int64 (batch, h, w, ceil(c / 64)), kh, kw, sh, sw, c, T, isa) ->
//       T (kh * kw * c, batch * ho * wo), ho = (h - kh) / sh + 1, wo = (w - kw) / sw + 1:
//       row (i * kw + j) * c + k, column (b * ho + y) * wo + x holds channel k of pixel
//       (b, y * sh + i, x * sw + j) as +1 (bit set) or -1 (bit clear), in float32 or bfloat16;
//       with T = int64, the rows' bits packed as bnn.ops.bitpack.pack packs them:
//       (kh * kw * c, ceil(batch * ho * wo / 64)), column t in bit t % 64 of word t / 64.
//
// Each image row is first turned into bit planes, one per channel; each patch row is then a stream
// of those plane bits, expanded to values through a table, or, on CPUs with AVX-512, by a masked
// blend ("avx512"; "auto" where the CPU has it; "avx2" and "generic" take the table); patches of
// 8 MiB or more are written past the caches (see core/sign_patches.h).

#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/sign_patches.h"
#include "tf/glue.h"

namespace bnn {
namespace {

REGISTER_OP("BnnSignPatches")
    .Input("words: int64")
    .Output("patches: T")
    .Attr("kh: int >= 1")
    .Attr("kw: int >= 1")
    .Attr("sh: int >= 1")
    .Attr("sw: int >= 1")
    .Attr("c: int >= 1")
    .Attr("T: {float, bfloat16, int64}")
    .Attr(BNN_VARIANT_ATTR)
    .SetShapeFn([](InferenceContext* ctx) {
      ShapeHandle words;
      TF_RETURN_IF_ERROR(ctx->WithRank(ctx->input(0), 4, &words));
      int64_t kh, kw, sh, sw, c;
      ::tensorflow::DataType dtype;
      TF_RETURN_IF_ERROR(ctx->GetAttr("T", &dtype));
      TF_RETURN_IF_ERROR(ctx->GetAttr("kh", &kh));
      TF_RETURN_IF_ERROR(ctx->GetAttr("kw", &kw));
      TF_RETURN_IF_ERROR(ctx->GetAttr("sh", &sh));
      TF_RETURN_IF_ERROR(ctx->GetAttr("sw", &sw));
      TF_RETURN_IF_ERROR(ctx->GetAttr("c", &c));
      DimensionHandle columns = ctx->UnknownDim();
      const int64_t b = ctx->Value(ctx->Dim(words, 0));
      const int64_t h = ctx->Value(ctx->Dim(words, 1));
      const int64_t w = ctx->Value(ctx->Dim(words, 2));
      if (b >= 0 && h >= kh && w >= kw)
        columns = ctx->MakeDim(b * ((h - kh) / sh + 1) * ((w - kw) / sw + 1));
      if (dtype == ::tensorflow::DT_INT64 && ctx->ValueKnown(columns))
        columns = ctx->MakeDim((ctx->Value(columns) + 63) / 64);
      ctx->set_output(0, ctx->Matrix(kh * kw * c, columns));
      return Status();
    });

using core::sign_patches::Element;
using core::sign_patches::Geometry;

template <typename T>
class SignPatchesOp : public OpKernel {
 public:
  explicit SignPatchesOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    for (const char* name : {"kh", "kw", "sh", "sw", "c"}) {
      int64_t value;
      OP_REQUIRES_OK(ctx, ctx->GetAttr(name, &value));
      attrs_.push_back(value);
    }
    OP_REQUIRES_OK(ctx, ResolveIsa(ctx, core::sign_patches::CpuRuns, &isa_));
  }

  void Compute(OpKernelContext* ctx) override {
    using Bits = typename Element<typename CoreType<T>::type>::Bits;
    const int64_t kh = attrs_[0], kw = attrs_[1], sh = attrs_[2], sw = attrs_[3], c = attrs_[4];
    const Tensor& input = ctx->input(0);
    OP_REQUIRES(ctx, input.dims() == 4,
                InvalidArgument("words must be (batch, h, w, words), got ",
                                input.shape().DebugString()));
    const int64_t batch = input.dim_size(0), h = input.dim_size(1), w = input.dim_size(2);
    const int64_t words = input.dim_size(3);
    OP_REQUIRES(ctx, words == (c + 63) / 64,
                InvalidArgument("c = ", c, " channels take ", (c + 63) / 64, " words, got ",
                                words));
    OP_REQUIRES(ctx, h >= kh && w >= kw,
                InvalidArgument("a ", kh, "x", kw, " kernel does not fit a ", h, "x", w,
                                " image"));
    constexpr bool kPacked = std::is_same<T, int64_t>::value;
    const Geometry g =
        core::sign_patches::MakeGeometry(batch, h, w, c, kh, kw, sh, sw, kPacked);
    const int64_t row_length = kPacked ? (g.columns + 63) / 64 : g.columns;  // in T
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({g.kh * g.kw * g.c, row_length}),
                                             &output));
    if (g.columns == 0) return;

    Tensor planes_tensor;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_INT64,
                                           TensorShape({core::sign_patches::PlaneWords(g)}),
                                           &planes_tensor));
    uint64_t* planes = reinterpret_cast<uint64_t*>(planes_tensor.flat<int64_t>().data());
    const uint64_t* in = reinterpret_cast<const uint64_t*>(input.flat<int64_t>().data());
    Workers* workers = IntraOpThreads(ctx);
    workers->ParallelFor(g.batch * g.h, g.w * g.words * 40, [&](int64_t first, int64_t last) {
      core::sign_patches::ToPlanes(g, in, first, last, planes);
    });

    Bits* out = reinterpret_cast<Bits*>(output->flat<T>().data());
    const bool stream = !kPacked && core::sign_patches::StreamWrites(
                                        output->TotalBytes(), g.row_values * sizeof(Bits), out);
    const int64_t cost = kPacked ? g.columns : g.columns * sizeof(Bits);
    const Isa isa = isa_;
    workers->ParallelFor(g.kh * g.kw * g.c, cost, [&](int64_t first, int64_t last) {
      core::sign_patches::Rows<typename CoreType<T>::type>(isa, g, planes, out, stream, first,
                                                           last);
    });
  }

 private:
  std::vector<int64_t> attrs_;
  Isa isa_ = core::kGeneric;
};

REGISTER_KERNEL_BUILDER(Name("BnnSignPatches").Device(DEVICE_CPU).TypeConstraint<float>("T"),
                        SignPatchesOp<float>);
REGISTER_KERNEL_BUILDER(
    Name("BnnSignPatches").Device(DEVICE_CPU).TypeConstraint<::tensorflow::bfloat16>("T"),
    SignPatchesOp<::tensorflow::bfloat16>);
REGISTER_KERNEL_BUILDER(Name("BnnSignPatches").Device(DEVICE_CPU).TypeConstraint<int64_t>("T"),
                        SignPatchesOp<int64_t>);

}  // namespace
}  // namespace bnn
