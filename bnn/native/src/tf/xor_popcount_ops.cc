// TensorFlow ops of bnn's xor-popcount kernels for packed inference (see bnn/native/build.py, which
// compiles the glue with the host's compiler on first use and loads it with tf.load_op_library):
// their registration, shape functions, input checks, outputs and the split of their work over
// TensorFlow's intra-op threads. The kernels are in core/xor_popcount.h and core/pixel_table.h.
//
// Packed operands follow bnn.ops.bitpack: bit i of a +-1 vector is 1 for +1 and 0 for -1,
// 64 bits to an int64 word, least significant bit first, pad bits 0.
//
//   BnnXorPopcount(x (batch, words), w (words, units)) -> (batch, units) int32
//       mismatches[b, u] = sum_k popcount(x[b, k] XOR w[k, u]); the +-1 dot product is
//       n - 2 * mismatches.
//   BnnXorPopcountSign(x, w, threshold (units) int32, flip (ceil(units / 64)) int64, n)
//       -> (batch, ceil(units / 64)) int64: bit u of row b is [n - 2 * mismatches >= threshold[u]],
//       then XOR flip; pad bits past `units` are 0.
//   BnnXorPopcountAffine(x, w, scale (units) float32, shift (units) float32, n)
//       -> (batch, units) float32 logits: float32(double(n - 2 * mismatches) * scale + shift), the
//       product exact in double and the sum rounded once (as XLA's fused multiply-add on CPU).
//   BnnThresholdPack(a (batch, units) int32, threshold, flip) -> the same words for a >= threshold.
//   BnnPixelTableSign(u (batch, ...) uint8 or float, w (blocks, groups, 32) uint8, threshold,
//       flip) -> the same words for the exact integer product u . w of 8-bit pixels u (floats
//       encoded to pixels first) with +-1 weights, whose bits w holds by groups of 4 pixels.
//   BnnPackedDenseChain(u, table, threshold, flip, kernels, thresholds, flips, w, logit_scale,
//       logit_shift) -> float32 logits of a whole packed MLP in one call: BnnPixelTableSign, then
//       BnnXorPopcountSign for each hidden kernel (n: the units before it), then
//       BnnXorPopcountAffine, with the same results as those ops one after the other.
//   BnnXorPopcountConv2d(x (batch, h, w, words), w (kh * kw * words, units), kh, kw, sh, sw, n)
//       -> (batch, ho, wo, units) float32 or bfloat16 n - 2 * mismatches: the "valid" +-1
//       convolution of a padded input packed along its channels with a kernel packed along its
//       input channels, flattened over its taps (tap-major); each output position's row of taps
//       is gathered per block of rows, so no patch tensor is built.
//   BnnKernelVariants() -> the instruction-set variants this CPU runs, best last.
//
// Every op has an `isa` attribute: "generic" (plain C++), "avx2", "avx512" (AVX-512 with
// VPOPCNTDQ), or "auto" (the best this CPU runs). The vector variants are compiled with
// per-function target attributes, so one build serves every x86-64 CPU; an op refuses a variant
// the CPU lacks instead of faulting.
//
// Work is split over TensorFlow's intra-op threads in tiles of 64 units (one output word) by 36
// rows (8 examples for the first layer).

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/pixel_table.h"
#include "core/xor_popcount.h"
#include "tensorflow/core/util/work_sharder.h"
#include "tf/glue.h"

namespace bnn {
namespace {

using core::kAvx2;
using core::kAvx512;
using core::kGeneric;
using core::xor_popcount::Epilogue;
using core::xor_popcount::kAffine;
using core::xor_popcount::kCounts;
using core::xor_popcount::kGroup;
using core::xor_popcount::kSign;
using core::xor_popcount::Mode;

// The op's `isa` attribute as an Isa this CPU runs ("auto": the best one).
Status ResolveIsa(OpKernelConstruction* ctx, Isa* isa) {
  return ::bnn::ResolveIsa(ctx, core::xor_popcount::CpuRuns, isa);
}

// ---- registration and shapes ------------------------------------------------------------------

Status MatrixShapes(InferenceContext* c, ShapeHandle* x, ShapeHandle* w) {
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, x));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, w));
  DimensionHandle words;
  return c->Merge(c->Dim(*x, 1), c->Dim(*w, 0), &words);
}

DimensionHandle WordsOf(InferenceContext* c, DimensionHandle units) {
  if (!c->ValueKnown(units)) return c->UnknownDim();
  return c->MakeDim((c->Value(units) + kGroup - 1) / kGroup);
}

REGISTER_OP("BnnXorPopcount")
    .Input("x: int64")
    .Input("w: int64")
    .Output("mismatches: int32")
    .Attr(BNN_VARIANT_ATTR)
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle x, w;
      TF_RETURN_IF_ERROR(MatrixShapes(c, &x, &w));
      c->set_output(0, c->Matrix(c->Dim(x, 0), c->Dim(w, 1)));
      return Status();
    });

REGISTER_OP("BnnXorPopcountSign")
    .Input("x: int64")
    .Input("w: int64")
    .Input("threshold: int32")
    .Input("flip: int64")
    .Attr("n: int")
    .Attr(BNN_VARIANT_ATTR)
    .Output("words: int64")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle x, w;
      TF_RETURN_IF_ERROR(MatrixShapes(c, &x, &w));
      c->set_output(0, c->Matrix(c->Dim(x, 0), WordsOf(c, c->Dim(w, 1))));
      return Status();
    });

REGISTER_OP("BnnXorPopcountAffine")
    .Input("x: int64")
    .Input("w: int64")
    .Input("scale: float")
    .Input("shift: float")
    .Attr("n: int")
    .Attr(BNN_VARIANT_ATTR)
    .Output("logits: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle x, w;
      TF_RETURN_IF_ERROR(MatrixShapes(c, &x, &w));
      c->set_output(0, c->Matrix(c->Dim(x, 0), c->Dim(w, 1)));
      return Status();
    });

REGISTER_OP("BnnThresholdPack")
    .Input("a: int32")
    .Input("threshold: int32")
    .Input("flip: int64")
    .Attr(BNN_VARIANT_ATTR)
    .Output("words: int64")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle a;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &a));
      c->set_output(0, c->Matrix(c->Dim(a, 0), WordsOf(c, c->Dim(a, 1))));
      return Status();
    });

REGISTER_OP("BnnPixelTableSign")
    .Input("u: T")
    .Input("w: uint8")
    .Input("threshold: int32")
    .Input("flip: int64")
    .Attr("T: {uint8, float}")
    .Attr("scale: float = 1.0")
    .Attr("offset: float = 0.0")
    .Attr(BNN_VARIANT_ATTR)
    .Output("words: int64")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle u, w, threshold;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 2, &u));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 3, &w));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &threshold));
      c->set_output(0, c->Matrix(c->Dim(u, 0), WordsOf(c, c->Dim(threshold, 0))));
      return Status();
    });

REGISTER_OP("BnnPackedDenseChain")
    .Input("u: T")
    .Input("table: uint8")
    .Input("threshold: int32")
    .Input("flip: int64")
    .Input("kernels: N * int64")
    .Input("thresholds: N * int32")
    .Input("flips: N * int64")
    .Input("w: int64")
    .Input("logit_scale: float")
    .Input("logit_shift: float")
    .Attr("N: int >= 0")
    .Attr("T: {uint8, float}")
    .Attr("scale: float = 1.0")
    .Attr("offset: float = 0.0")
    .Attr(BNN_VARIANT_ATTR)
    .Output("logits: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle u, w;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 2, &u));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(c->num_inputs() - 3), 2, &w));
      c->set_output(0, c->Matrix(c->Dim(u, 0), c->Dim(w, 1)));
      return Status();
    });

REGISTER_OP("BnnXorPopcountConv2d")
    .Input("x: int64")
    .Input("w: int64")
    .Attr("kh: int >= 1")
    .Attr("kw: int >= 1")
    .Attr("sh: int >= 1")
    .Attr("sw: int >= 1")
    .Attr("n: int")
    .Attr("T: {float, bfloat16}")
    .Attr(BNN_VARIANT_ATTR)
    .Output("y: T")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle x, w;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 4, &x));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &w));
      int kh, kw, sh, sw;
      TF_RETURN_IF_ERROR(c->GetAttr("kh", &kh));
      TF_RETURN_IF_ERROR(c->GetAttr("kw", &kw));
      TF_RETURN_IF_ERROR(c->GetAttr("sh", &sh));
      TF_RETURN_IF_ERROR(c->GetAttr("sw", &sw));
      auto out = [c](DimensionHandle d, int k, int s) {
        if (!c->ValueKnown(d)) return c->UnknownDim();
        return c->MakeDim(std::max<int64_t>(0, (c->Value(d) - k) / s + 1));
      };
      c->set_output(0, c->MakeShape({c->Dim(x, 0), out(c->Dim(x, 1), kh, sh),
                                     out(c->Dim(x, 2), kw, sw), c->Dim(w, 1)}));
      return Status();
    });

REGISTER_OP("BnnKernelVariants")
    .Output("variants: string")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(c->UnknownDim()));
      return Status();
    });

// ---- kernels -----------------------------------------------------------------------------------

// Checks the shapes shared by the kernels; returns false after setting an error on ctx.
bool CheckThresholds(OpKernelContext* ctx, const Tensor& threshold, const Tensor& flip,
                     int64_t units) {
  const int64_t words = (units + kGroup - 1) / kGroup;
  if (threshold.dims() != 1 || threshold.dim_size(0) != units) {
    ctx->SetStatus(InvalidArgument("threshold must have shape (", units, "), got ",
                                   threshold.shape().DebugString()));
    return false;
  }
  if (flip.dims() != 1 || flip.dim_size(0) != words) {
    ctx->SetStatus(InvalidArgument("flip must have shape (", words, "), got ",
                                   flip.shape().DebugString()));
    return false;
  }
  return true;
}

// x (batch, words) times w (words, units), over the intra-op threads, into e.out.
void RunProduct(Workers* workers, Isa isa, const int64_t* x, int64_t batch, int64_t words,
                const int64_t* w, int64_t units, const Epilogue& e) {
  if (batch == 0 || units == 0) return;
  const core::xor_popcount::Rows rows_in(x, batch, words, isa);
  auto work = [&](int64_t first, int64_t last) {
    core::xor_popcount::ProductItems(isa, rows_in, w, batch, units, e, first, last);
  };
  workers->ParallelFor(core::xor_popcount::ProductItemCount(batch, units),
                       core::xor_popcount::ProductItemCost(isa, batch, words), work);
}

// Checks a product's operands, x (batch, words) and w (words, units); false after setting an
// error on ctx.
bool CheckProduct(OpKernelContext* ctx, const Tensor& x, const Tensor& w, const char* x_name,
                  const char* w_name) {
  if (x.dims() != 2 || w.dims() != 2) {
    ctx->SetStatus(InvalidArgument(x_name, " and ", w_name, " must be matrices, got ",
                                   x.shape().DebugString(), " and ", w.shape().DebugString()));
    return false;
  }
  if (w.dim_size(0) != x.dim_size(1)) {
    ctx->SetStatus(InvalidArgument(x_name, " has ", x.dim_size(1), " words per row but ", w_name,
                                   " has ", w.dim_size(0)));
    return false;
  }
  return true;
}

// Checks an affine map's scale and shift for `units` units; false after setting an error.
bool CheckAffine(OpKernelContext* ctx, const Tensor& scale, const Tensor& shift, int64_t units) {
  for (const Tensor* t : {&scale, &shift})
    if (t->dims() != 1 || t->dim_size(0) != units) {
      ctx->SetStatus(InvalidArgument(t == &scale ? "scale" : "shift", " must have shape (",
                                     units, "), got ", t->shape().DebugString()));
      return false;
    }
  return true;
}

class XorPopcountOp : public OpKernel {
 public:
  explicit XorPopcountOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ResolveIsa(ctx, &isa_));
    const std::string& op = type_string();
    mode_ = op == "BnnXorPopcountSign" ? kSign : op == "BnnXorPopcountAffine" ? kAffine : kCounts;
    if (mode_ != kCounts) OP_REQUIRES_OK(ctx, ctx->GetAttr("n", &n_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    const Tensor& w = ctx->input(1);
    if (!CheckProduct(ctx, x, w, "x", "w")) return;
    const int64_t batch = x.dim_size(0), units = w.dim_size(1);
    const int64_t out_words = (units + kGroup - 1) / kGroup;
    Epilogue e;
    e.mode = mode_;
    e.n = n_;
    if (mode_ == kSign) {
      if (!CheckThresholds(ctx, ctx->input(2), ctx->input(3), units)) return;
      e.threshold = ctx->input(2).flat<int32_t>().data();
      e.flip = ctx->input(3).flat<int64_t>().data();
    } else if (mode_ == kAffine) {
      if (!CheckAffine(ctx, ctx->input(2), ctx->input(3), units)) return;
      e.scale = ctx->input(2).flat<float>().data();
      e.shift = ctx->input(3).flat<float>().data();
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({batch, mode_ == kSign ? out_words : units}), &out));
    e.out = out->data();
    RunProduct(IntraOpThreads(ctx), isa_, x.flat<int64_t>().data(), batch, x.dim_size(1),
               w.flat<int64_t>().data(), units, e);
  }

 private:
  Isa isa_ = kGeneric;
  Mode mode_ = kCounts;
  int64_t n_ = 0;
};

class ThresholdPackOp : public OpKernel {
 public:
  explicit ThresholdPackOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ResolveIsa(ctx, &isa_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& a = ctx->input(0);
    OP_REQUIRES(ctx, a.dims() == 2,
                InvalidArgument("a must be a matrix, got ", a.shape().DebugString()));
    const int64_t batch = a.dim_size(0), units = a.dim_size(1);
    if (!CheckThresholds(ctx, ctx->input(1), ctx->input(2), units)) return;
    const int64_t out_words = (units + kGroup - 1) / kGroup;
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({batch, out_words}), &out));
    const int32_t* ap = a.flat<int32_t>().data();
    const int32_t* threshold = ctx->input(1).flat<int32_t>().data();
    const int64_t* flip = ctx->input(2).flat<int64_t>().data();
    int64_t* words_out = out->flat<int64_t>().data();
    const Isa isa = isa_;
    auto work = [&](int64_t first, int64_t last) {
      core::xor_popcount::ThresholdPackRows(isa, ap, units, threshold, flip, first, last,
                                            words_out);
    };
    // About one vector compare per 16 units: cheap enough that small batches stay on one
    // thread (waking another costs more than the work).
    IntraOpThreads(ctx)->ParallelFor(batch, std::max<int64_t>(1, units / 16), work);
  }

 private:
  Isa isa_ = kGeneric;
};

// Checks a first layer's pixels u (batch, ...) and weight table w (blocks, groups, 32) against
// its threshold and flip; sets *units and *n (values per example); false after setting an error.
bool CheckPixelTable(OpKernelContext* ctx, const Tensor& u, const Tensor& w,
                     const Tensor& threshold, const Tensor& flip, int64_t* units, int64_t* n) {
  if (u.dims() < 2 || w.dims() != 3 || w.dim_size(2) != 32) {
    ctx->SetStatus(InvalidArgument("u must have a batch axis and w the shape (blocks, groups, "
                                   "32), got ", u.shape().DebugString(), " and ",
                                   w.shape().DebugString()));
    return false;
  }
  const int64_t batch = u.dim_size(0), groups = w.dim_size(1);
  *units = threshold.dims() == 1 ? threshold.dim_size(0) : -1;
  *n = batch ? u.NumElements() / batch : 0;
  if (batch != 0 && groups != (*n + 3) / 4) {
    ctx->SetStatus(InvalidArgument("u has ", *n, " values per example, which make ",
                                   (*n + 3) / 4, " groups of 4, but w has ", groups));
    return false;
  }
  if (w.dim_size(0) != (*units + 63) / 64 * 2) {
    ctx->SetStatus(InvalidArgument("w has ", w.dim_size(0), " blocks of 32 units, but ", *units,
                                   " units (the threshold's length) need ",
                                   (*units + 63) / 64 * 2));
    return false;
  }
  return CheckThresholds(ctx, threshold, flip, *units);
}

// First layer on 8-bit pixels u (batch, n) (uint8, or floats encoded to them with scale and
// offset) and +-1 weights with bits b: z = u . w = 2 * (u . b) - sum(u), exact, with u . b from
// pixel tables (see core/pixel_table.h); output bits [z >= threshold] XOR flip, packed, into
// words_out (batch, ceil(units / 64)). w holds the weight bits of each group of 4 pixels and unit
// as one byte, (blocks, groups, 32) with blocks = 2 * ceil(units / 64) (whole output words) and
// groups = ceil(n / 4).
template <typename T>
void RunPixelTableSign(Workers* workers, Isa isa, const T* up, int64_t batch, int64_t n,
                       const uint8_t* wp, int64_t groups, int64_t units,
                       const int32_t* threshold, const int64_t* flip, float scale,
                       float offset, int64_t* words_out) {
  if (batch == 0 || units == 0) return;
  std::vector<uint8_t> tables(batch * groups * 32);
  std::vector<int32_t> totals(batch), live(batch * groups), counts(batch);
  auto prepare = [&](int64_t first, int64_t last) {
    core::pixel_table::PrepareExamples(isa, up, n, groups, scale, offset, first, last,
                                       tables.data(), totals.data(), live.data(), counts.data());
  };
  workers->ParallelFor(batch, groups * 64, prepare);
  auto work = [&](int64_t first, int64_t last) {
    core::pixel_table::SignItems(isa, tables.data(), live.data(), counts.data(), totals.data(),
                                 batch, wp, groups, units, threshold, flip, first, last,
                                 words_out);
  };
  workers->ParallelFor(core::pixel_table::SignItemCount(batch, units),
                       core::pixel_table::SignItemCost(isa, batch, groups), work);
}

// What the ops on pixels share: the encoding of float inputs (scale, offset) and the variant.
class PixelOp : public OpKernel {
 public:
  explicit PixelOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("scale", &scale_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("offset", &offset_));
    OP_REQUIRES_OK(ctx, ResolveIsa(ctx, &isa_));
  }

 protected:
  float scale_ = 1.0f, offset_ = 0.0f;
  Isa isa_ = kGeneric;
};

template <typename T>
class PixelTableSignOp : public PixelOp {
 public:
  using PixelOp::PixelOp;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& u = ctx->input(0);
    const Tensor& w = ctx->input(1);
    int64_t units = 0, n = 0;
    if (!CheckPixelTable(ctx, u, w, ctx->input(2), ctx->input(3), &units, &n)) return;
    const int64_t batch = u.dim_size(0);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({batch, (units + kGroup - 1) / kGroup}), &out));
    RunPixelTableSign(IntraOpThreads(ctx), isa_, u.flat<T>().data(), batch, n,
                      w.flat<uint8_t>().data(), w.dim_size(1), units,
                      ctx->input(2).flat<int32_t>().data(), ctx->input(3).flat<int64_t>().data(),
                      scale_, offset_, out->flat<int64_t>().data());
  }
};

// A packed MLP in one op: the pixel-table first layer, N hidden xor-popcount layers to packed
// signs (each reading the previous layer's units as its n), and the logits' affine layer. One
// call instead of N + 2 saves each op's dispatch, which dominates small batches.
template <typename T>
class PackedDenseChainOp : public PixelOp {
 public:
  using PixelOp::PixelOp;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& u = ctx->input(0);
    const Tensor& table = ctx->input(1);
    int64_t units = 0, n = 0;
    if (!CheckPixelTable(ctx, u, table, ctx->input(2), ctx->input(3), &units, &n)) return;
    ::tensorflow::OpInputList kernels, thresholds, flips;
    OP_REQUIRES_OK(ctx, ctx->input_list("kernels", &kernels));
    OP_REQUIRES_OK(ctx, ctx->input_list("thresholds", &thresholds));
    OP_REQUIRES_OK(ctx, ctx->input_list("flips", &flips));
    const Tensor& w_last = ctx->input(4 + 3 * kernels.size());
    const Tensor& scale = ctx->input(5 + 3 * kernels.size());
    const Tensor& shift = ctx->input(6 + 3 * kernels.size());
    const int64_t batch = u.dim_size(0);
    // shapes first, so that a mismatch fails before any work
    std::vector<int64_t> widths = {units};
    for (int i = 0; i <= kernels.size(); ++i) {
      const Tensor& w = i < kernels.size() ? kernels[i] : w_last;
      OP_REQUIRES(ctx, w.dims() == 2 && w.dim_size(0) == (widths.back() + kGroup - 1) / kGroup,
                  InvalidArgument(i < kernels.size() ? "kernels[" + std::to_string(i) + "]"
                                                     : std::string("w"),
                                  " must have ", (widths.back() + kGroup - 1) / kGroup,
                                  " rows of words for ", widths.back(), " inputs, got ",
                                  w.shape().DebugString()));
      widths.push_back(w.dim_size(1));
      if (i < kernels.size() && !CheckThresholds(ctx, thresholds[i], flips[i], widths.back()))
        return;
    }
    if (!CheckAffine(ctx, scale, shift, widths.back())) return;
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({batch, widths.back()}), &out));
    Workers* workers = IntraOpThreads(ctx);
    std::vector<int64_t> a(batch * ((units + kGroup - 1) / kGroup)), b;
    RunPixelTableSign(workers, isa_, u.flat<T>().data(), batch, n, table.flat<uint8_t>().data(),
                      table.dim_size(1), units, ctx->input(2).flat<int32_t>().data(),
                      ctx->input(3).flat<int64_t>().data(), scale_, offset_, a.data());
    for (int i = 0; i <= kernels.size(); ++i) {
      const Tensor& w = i < kernels.size() ? kernels[i] : w_last;
      const int64_t in = widths[i], width = widths[i + 1];
      Epilogue e;
      e.n = in;
      if (i < kernels.size()) {
        b.resize(batch * ((width + kGroup - 1) / kGroup));  // every word is written
        e.mode = kSign;
        e.threshold = thresholds[i].flat<int32_t>().data();
        e.flip = flips[i].flat<int64_t>().data();
        e.out = b.data();
      } else {
        e.mode = kAffine;
        e.scale = scale.flat<float>().data();
        e.shift = shift.flat<float>().data();
        e.out = out->data();
      }
      RunProduct(workers, isa_, a.data(), batch, (in + kGroup - 1) / kGroup,
                 w.flat<int64_t>().data(), width, e);
      a.swap(b);
    }
  }
};

// The "valid" +-1 convolution of packed operands as dot products n - 2 * mismatches in T. Work
// items are (block of 36 output positions, group of 64 units), block-major; a thread gathers a
// block's rows of kh * kw * words words (tap-major, as w is flattened) once for all the groups
// of that block it runs (core::xor_popcount::Conv2dItems).
template <typename T>
class XorPopcountConv2dOp : public OpKernel {
 public:
  explicit XorPopcountConv2dOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ResolveIsa(ctx, &isa_));
    int kh, kw, sh, sw;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("kh", &kh));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("kw", &kw));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("sh", &sh));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("sw", &sw));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("n", &n_));
    kh_ = kh, kw_ = kw, sh_ = sh, sw_ = sw;
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    const Tensor& w = ctx->input(1);
    OP_REQUIRES(ctx, x.dims() == 4 && w.dims() == 2,
                InvalidArgument("x must be (batch, h, w, words) and w a matrix, got ",
                                x.shape().DebugString(), " and ", w.shape().DebugString()));
    const int64_t batch = x.dim_size(0), h = x.dim_size(1), wd = x.dim_size(2);
    const int64_t words = x.dim_size(3), units = w.dim_size(1);
    const int64_t row_words = kh_ * kw_ * words;
    OP_REQUIRES(ctx, w.dim_size(0) == row_words,
                InvalidArgument("a ", kh_, "x", kw_, " kernel over ", words, " words per pixel "
                                "needs ", row_words, " rows of w, got ", w.dim_size(0)));
    const int64_t ho = h >= kh_ ? (h - kh_) / sh_ + 1 : 0;
    const int64_t wo = wd >= kw_ ? (wd - kw_) / sw_ + 1 : 0;
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({batch, ho, wo, units}), &out));
    const int64_t positions = batch * ho * wo;
    if (positions == 0 || units == 0) return;
    const int64_t* xp = x.flat<int64_t>().data();
    const int64_t* wp = w.flat<int64_t>().data();
    auto* yp = AsCore(out->flat<T>().data());
    const core::xor_popcount::ConvGeometry g{batch, h, wd, words, kh_, kw_, sh_, sw_,
                                             ho,    wo, units, n_};
    const Isa isa = isa_;
    auto work = [&](int64_t first, int64_t last) {
      core::xor_popcount::Conv2dItems(isa, g, xp, wp, yp, first, last);
    };
    IntraOpThreads(ctx)->ParallelFor(core::xor_popcount::ConvItemCount(g),
                                     core::xor_popcount::ConvItemCost(isa_, g), work);
  }

 private:
  Isa isa_ = kGeneric;
  int64_t kh_ = 1, kw_ = 1, sh_ = 1, sw_ = 1, n_ = 0;
};

class KernelVariantsOp : public OpKernel {
 public:
  explicit KernelVariantsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    std::vector<const char*> names;
    for (Isa isa : core::kIsas)
      if (core::Supported(isa)) names.push_back(core::kIsaNames[isa]);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({static_cast<int64_t>(names.size())}), &out));
    for (size_t i = 0; i < names.size(); ++i) out->flat<::tensorflow::tstring>()(i) = names[i];
  }
};

REGISTER_KERNEL_BUILDER(Name("BnnXorPopcount").Device(DEVICE_CPU), XorPopcountOp);
REGISTER_KERNEL_BUILDER(Name("BnnXorPopcountSign").Device(DEVICE_CPU), XorPopcountOp);
REGISTER_KERNEL_BUILDER(Name("BnnXorPopcountAffine").Device(DEVICE_CPU), XorPopcountOp);
REGISTER_KERNEL_BUILDER(Name("BnnThresholdPack").Device(DEVICE_CPU), ThresholdPackOp);
REGISTER_KERNEL_BUILDER(
    Name("BnnPixelTableSign").Device(DEVICE_CPU).TypeConstraint<uint8_t>("T"),
    PixelTableSignOp<uint8_t>);
REGISTER_KERNEL_BUILDER(
    Name("BnnPixelTableSign").Device(DEVICE_CPU).TypeConstraint<float>("T"),
    PixelTableSignOp<float>);
REGISTER_KERNEL_BUILDER(
    Name("BnnPackedDenseChain").Device(DEVICE_CPU).TypeConstraint<uint8_t>("T"),
    PackedDenseChainOp<uint8_t>);
REGISTER_KERNEL_BUILDER(
    Name("BnnPackedDenseChain").Device(DEVICE_CPU).TypeConstraint<float>("T"),
    PackedDenseChainOp<float>);
REGISTER_KERNEL_BUILDER(
    Name("BnnXorPopcountConv2d").Device(DEVICE_CPU).TypeConstraint<float>("T"),
    XorPopcountConv2dOp<float>);
REGISTER_KERNEL_BUILDER(
    Name("BnnXorPopcountConv2d").Device(DEVICE_CPU).TypeConstraint<::tensorflow::bfloat16>("T"),
    XorPopcountConv2dOp<::tensorflow::bfloat16>);
REGISTER_KERNEL_BUILDER(Name("BnnKernelVariants").Device(DEVICE_CPU), KernelVariantsOp);

}  // namespace
}  // namespace bnn
