// TensorFlow op of the products of a ±1 matrix held as sign bits with a float32 matrix, by table
// lookup, for the backward pass of bnn's binary dense layer (see bnn/bitops.py), built into the
// same library as xor_popcount_ops.cc by bnn/native/build.py: its registration, shape function, input
// checks, temporary buffers and the split of its work over TensorFlow's intra-op threads. The
// kernels are in core/sign_matmul.h.
//
//   BnnSignMatmul(signs: int64, f: float, rows, transpose_signs, transpose_f, transpose_output,
//                 isa) -> float (m, p), or (p, m) with transpose_output:
//       row r of the product is sum over k < q of s(r, k) * f[k], for f (q, p), given as
//       (p, q) with transpose_f; s(r, k) is +1 where its sign bit is set and -1 where it is
//       clear. `signs` holds s packed as bnn.ops.bitpack.pack does: along k, (m, ceil(q / 64)) words
//       with bit k % 64 of word [r, k / 64]; with transpose_signs, along r, (ceil(m / 64), q)
//       words with bit r % 64 of word [r / 64, k], and `rows` = m.
//
// Each group of 8 rows of f is expanded into a table of its 256 signed sums, so that an output
// value takes one table entry per byte of its row's signs (see core/sign_matmul.h). The work is
// split over the intra-op threads by column blocks where there are many of them, else by byte
// groups, whose partial products are then summed. The sums are float32 additions in another
// order than a matrix product's, so results agree with one to rounding, not bit for bit. "avx2"
// runs the loops on 256-bit registers (so does "avx512", and "auto" where the CPU has AVX2);
// "generic" is the same code for any CPU.

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/sign_matmul.h"
#include "tf/glue.h"

namespace bnn {
namespace {

REGISTER_OP("BnnSignMatmul")
    .Input("signs: int64")
    .Input("f: float")
    .Output("product: float")
    .Attr("rows: int >= -1 = -1")
    .Attr("transpose_signs: bool = false")
    .Attr("transpose_f: bool = false")
    .Attr("transpose_output: bool = false")
    .Attr(BNN_VARIANT_ATTR)
    .SetShapeFn([](InferenceContext* ctx) {
      ShapeHandle signs, f;
      TF_RETURN_IF_ERROR(ctx->WithRank(ctx->input(0), 2, &signs));
      TF_RETURN_IF_ERROR(ctx->WithRank(ctx->input(1), 2, &f));
      bool transpose_signs, transpose_f, transpose_output;
      int64_t rows;
      TF_RETURN_IF_ERROR(ctx->GetAttr("rows", &rows));
      TF_RETURN_IF_ERROR(ctx->GetAttr("transpose_signs", &transpose_signs));
      TF_RETURN_IF_ERROR(ctx->GetAttr("transpose_f", &transpose_f));
      TF_RETURN_IF_ERROR(ctx->GetAttr("transpose_output", &transpose_output));
      DimensionHandle m = transpose_signs ? ctx->MakeDim(rows) : ctx->Dim(signs, 0);
      DimensionHandle p = ctx->Dim(f, transpose_f ? 0 : 1);
      ctx->set_output(0, transpose_output ? ctx->Matrix(p, m) : ctx->Matrix(m, p));
      return Status();
    });

using core::sign_matmul::Problem;

class SignMatmulOp : public OpKernel {
 public:
  explicit SignMatmulOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("rows", &rows_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("transpose_signs", &transpose_signs_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("transpose_f", &transpose_f_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("transpose_output", &transpose_));
    OP_REQUIRES(ctx, !transpose_signs_ || rows_ >= 0,
                InvalidArgument("signs packed along the rows (transpose_signs) need `rows`"));
    OP_REQUIRES_OK(ctx, ResolveIsa(ctx, core::sign_matmul::CpuRuns, &isa_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& signs = ctx->input(0);
    const Tensor& f = ctx->input(1);
    OP_REQUIRES(ctx, signs.dims() == 2 && f.dims() == 2,
                InvalidArgument("signs and f must be matrices, got ",
                                signs.shape().DebugString(), " and ", f.shape().DebugString()));
    Problem pr;
    pr.f = f.flat<float>().data();
    pr.f_transposed = transpose_f_;
    pr.q = f.dim_size(transpose_f_ ? 1 : 0), pr.p = f.dim_size(transpose_f_ ? 0 : 1);
    const int64_t q_words = (pr.q + 63) / 64;
    const uint64_t* words = reinterpret_cast<const uint64_t*>(signs.flat<int64_t>().data());
    if (transpose_signs_) {
      pr.m = rows_;
      OP_REQUIRES(ctx, signs.dim_size(0) == (pr.m + 63) / 64 && signs.dim_size(1) == pr.q,
                  InvalidArgument("signs of ", pr.m, " rows by ", pr.q, " packed along the "
                                  "rows take (", (pr.m + 63) / 64, ", ", pr.q, ") words, got ",
                                  signs.shape().DebugString()));
    } else {
      pr.m = signs.dim_size(0);
      OP_REQUIRES(ctx, signs.dim_size(1) == q_words,
                  InvalidArgument("f has ", pr.q, " rows, whose signs take ", q_words,
                                  " words per row; signs have ", signs.dim_size(1)));
    }
    pr.bytes = 8 * q_words;
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, transpose_ ? TensorShape({pr.p, pr.m}) : TensorShape({pr.m, pr.p}),
                            &output));
    float* result = output->flat<float>().data();
    if (pr.m == 0 || pr.p == 0) return;
    if (pr.q == 0) {
      std::fill(result, result + pr.m * pr.p, 0.0f);
      return;
    }

    Workers* workers = IntraOpThreads(ctx);
    Tensor turned;  // signs packed along the rows, turned along k
    if (transpose_signs_) {
      const int64_t m_words = (pr.m + 63) / 64;
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_INT64,
                                             TensorShape({m_words * 64, q_words}), &turned));
      uint64_t* out = reinterpret_cast<uint64_t*>(turned.flat<int64_t>().data());
      workers->ParallelFor(m_words, q_words * 64 * 40, [&](int64_t first, int64_t last) {
        core::sign_matmul::TurnSigns(words, pr.q, first, last, out);
      });
      words = out;
    }
    pr.patterns = reinterpret_cast<const uint8_t*>(words);

    const int64_t threads = std::max(1, workers->NumThreads());
    const core::sign_matmul::Plan plan = core::sign_matmul::PlanFor(pr, threads, transpose_);
    Tensor partial_tensor;
    float* partial = result;
    if (!plan.direct) {
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_FLOAT,
                                             TensorShape({plan.partials(), pr.m, plan.stride}),
                                             &partial_tensor));
      partial = partial_tensor.flat<float>().data();
    }
    Tensor tables_tensor;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(
                            ::tensorflow::DT_FLOAT,
                            TensorShape({plan.parts, core::sign_matmul::kPartTables}),
                            &tables_tensor));
    float* all_tables = tables_tensor.flat<float>().data();
    const auto run = core::sign_matmul::Select(isa_);
    workers->ParallelFor(plan.parts, core::sign_matmul::PartCost(pr, plan),
                         [&](int64_t first, int64_t last) {
      core::sign_matmul::RunParts(run, pr, plan, partial, all_tables, first, last);
    });
    if (plan.direct) return;
    // Sums the partial products (and transposes them), a block of rows at a time.
    const int64_t rows = core::sign_matmul::kSumRows;
    workers->ParallelFor((pr.m + rows - 1) / rows, rows * pr.p * (plan.partials() + 1) * 4,
                         [&](int64_t first, int64_t last) {
      core::sign_matmul::SumPartials(pr, plan, partial, transpose_, result, first, last);
    });
  }

 private:
  int64_t rows_ = -1;
  bool transpose_signs_ = false, transpose_f_ = false, transpose_ = false;
  Isa isa_ = core::kGeneric;
};

REGISTER_KERNEL_BUILDER(Name("BnnSignMatmul").Device(DEVICE_CPU), SignMatmulOp);

}  // namespace
}  // namespace bnn
