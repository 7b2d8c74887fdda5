"""``PackedModel``: a packed model's stages as one TensorFlow inference graph, dispatched by
batch size and input dtype to the XLA kernels or bnn's native kernels."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from bnn.errors import NativeKernelsUnavailable
from bnn.native import dispatch
from bnn.ops.bitpack import pack, pack_xla
from bnn.packed.runtime import Stage

__all__ = ["PackedModel", "NativeKernelsUnavailable"]


class _Dispatch:
    """The entry ``tf.function`` s by batch kind (``"one"``, ``"small"``, ``"large"``) and input
    dtype name, each traced to a concrete function on first use (calling the concrete function
    skips tf.function's dispatch). Kept outside TensorFlow's object tracking, so SavedModel
    export saves only the serving signature."""

    def __init__(self, functions: dict[str, dict[str, Any]]):
        self.functions, self.concrete = functions, {}

    def get(self, batch: int, dtype: str):
        kind = dispatch.batch_kind(batch)
        if (kind, dtype) not in self.concrete:
            self.concrete[kind, dtype] = self.functions[kind][dtype].get_concrete_function()
        return self.concrete[kind, dtype]


class PackedModel(tf.Module):
    """A compiled TensorFlow inference graph over exported stages (:mod:`bnn.packed.stages`).

    Args:
        stages: stage specs (the ``"stages"`` of an export manifest).
        arrays: per stage, its named arrays (kernels, thresholds, batch-norm parameters).
        input_shape: the shape of one input example, without the batch axis.
        input_encoding: ``{"scale": s, "offset": o}`` when the first stage takes uint8 pixels
            ``u`` of normalized inputs ``x = s * u + o``; ``None`` for float inputs.

        native: use the native kernels of :mod:`bnn.native`; ``None`` (default): where
            :func:`bnn.native.dispatch.preferred`, for a model with packed convolutions only
            where :func:`bnn.native.dispatch.packed_convolutions_native`; ``True`` raises
            :class:`bnn.errors.NativeKernelsUnavailable` where they are unavailable.

    Calls dispatch by batch size and input dtype (:func:`bnn.native.dispatch.batch_kind`),
    with no retracing and no per-call Python work per layer. With native kernels, a model with
    an integer first stage and packed dense layers (the MLP) runs batches under
    :data:`~bnn.native.dispatch.EAGER_BATCH`, and every batch where the first layer does not
    take the int8 product (:func:`~bnn.native.dispatch.int8_first_layer_preferred`), as one
    eager native op (:meth:`bnn.native.ops.Ops.packed_dense_chain`: pixel-table first layer,
    xor-popcount layers, the logits' xor-popcount and affine map), with no graph call at all;
    larger batches, and other models' batches of :data:`~bnn.native.dispatch.LARGE_BATCH` or
    more, run one graph: the int8 first layer (where
    :func:`~bnn.native.dispatch.int8_matmul_available`), native packed dense layers and packed
    convolutions spread over the intra-op threads (a dense logits stage with its affine map in
    float64, rounded once as XLA's fused multiply-add; a convolution's thresholds, pooling and
    packing as one XLA call), and the other stages as XLA calls. Without native kernels,
    smaller batches run one XLA call (batch 1 with a static shape, where an integer first stage
    uses bit planes), larger ones two independent halves, each the int8 first layer and one XLA
    call for the rest, which TensorFlow can run on two cores at once. All paths compute the
    same integers and round the float logits alike (XLA's fused multiply-add), so they give
    identical logits. :meth:`save_savedmodel` exports the pure-TensorFlow XLA path.
    """

    def __init__(self, stages: Sequence[dict[str, Any]],
                 arrays: Sequence[dict[str, np.ndarray]], input_shape: Sequence[int],
                 input_encoding: dict[str, float] | None = None, native: bool | None = None):
        super().__init__(name="packed_model")
        self.input_shape = tuple(int(d) for d in input_shape)
        self.input_encoding = dict(input_encoding) if input_encoding else None
        self.stages = [Stage(spec, arr) for spec, arr in zip(stages, arrays)]
        integer = self.stages[0].integer_in
        if integer != (self.input_encoding is not None):
            raise ValueError("the first stage takes uint8 inputs exactly when the model has an "
                             "input encoding")
        in_dtype = tf.uint8 if integer else tf.float32
        first = self.stages[0]
        # a real-valued first stage's sign bits are computed outside XLA (see real_signs)
        self._real_first = not (first.integer_in or first.packed_in) and first.output == "bits"
        if self._real_first:
            s_shape = first.real_signs(tf.zeros([1, *self.input_shape])).shape[1:]
            self._body = tf.function(self._forward_from_signs, jit_compile=True,
                                     input_signature=[tf.TensorSpec([None, *s_shape], tf.bool)])
        else:
            self._body = tf.function(self._forward, jit_compile=True, input_signature=[
                tf.TensorSpec([None, *self.input_shape], in_dtype)])
        self._int8 = integer and dispatch.int8_matmul_available()
        if self._int8:
            self._body_z = tf.function(self._forward, jit_compile=True, input_signature=[
                tf.TensorSpec([None, self.stages[0].units], tf.int32)])
        dense_only = not any(st.packed_in and st.op == "conv2d" for st in self.stages)
        if native is None:
            native = dispatch.preferred() and (dense_only or dispatch.packed_convolutions_native())
        elif native and not dispatch.available():
            raise NativeKernelsUnavailable(
                f"native kernels cannot run this model: {dispatch.unavailable_reason()}")
        self.native = bool(native)
        # the int8 first layer for large batches; otherwise the MLP's first layer stays on the
        # pixel tables and the eager chain beats a graph at every batch size
        self._int8_large = bool(self.native and self._int8
                                and dispatch.int8_first_layer_preferred())
        functions: dict[str, dict[str, Any]] = {"one": {}, "small": {}, "large": {}}
        xla_entry = not self._real_first
        for dtype in ([tf.uint8, tf.float32] if integer else [tf.float32]):
            for kind, batch, mode in (("one", 1, "xla"), ("small", None, "xla"),
                                      ("large", None, "split")):
                if self.native and kind == "large":
                    mode = "native"
                functions[kind][dtype.name] = tf.function(
                    self._entry(in_dtype, mode), jit_compile=mode == "xla" and xla_entry,
                    input_signature=[tf.TensorSpec([batch, *self.input_shape], dtype)])
        self._dispatch = _Dispatch(functions)
        self._ops = dispatch.ops() if self.native else None
        self._chain = self._eager_chain() if self.native else None
        self.serve = tf.function(self._entry(in_dtype, "xla"), jit_compile=xla_entry,
                                 input_signature=[tf.TensorSpec([None, *self.input_shape])])

    def _entry(self, in_dtype: tf.DType, mode: str):
        """The traced entry point: encodes float inputs of a uint8 model to pixels, then runs
        the whole model as one XLA computation (``"xla"``), as :meth:`_large_batch`
        (``"split"``) or through the native kernels (``"native"``)."""
        run = {"xla": self._run_body if self._real_first else self._forward,
               "split": self._large_batch, "native": self._native}[mode]

        # the native pixel tables encode float inputs themselves, in the same float32 arithmetic
        tables = mode == "native" and not self._int8_large

        def entry(x):
            if x.dtype != in_dtype and not tables:
                x = self._encode(x)
            return run(x)
        return entry

    def _eager_chain(self) -> tuple | None:
        """Constants for running batches as one eager native op (no graph call,
        :meth:`bnn.native.ops.Ops.packed_dense_chain`): for an integer first stage, packed dense
        hidden stages and a packed dense logits stage without pooling, each stage's inputs the
        units of the one before it; ``None`` for other models."""
        first, middle, last = self.stages[0], self.stages[1:-1], self.stages[-1]
        if not (first.integer_in and first.output == "bits" and len(self.stages) >= 2
                and all(st.packed_in and st.op == "dense" and st.output == "bits"
                        for st in middle)
                and last.packed_in and last.op == "dense" and last.output == "logits"
                and not last.pool
                and all(int(np.prod(st.in_shape)) == before.units
                        for before, st in zip(self.stages, self.stages[1:]))):
            return None
        const = lambda v: tf.constant(v.numpy())  # noqa: E731
        return ((first.kernel_table, const(first.threshold), const(first.flip)),
                tuple((const(st.kernel), const(st.threshold), const(st.flip)) for st in middle),
                (const(last.kernel), last.logit_scale, last.logit_shift))

    def _eager(self, x: tf.Tensor) -> tf.Tensor:
        """A batch through :meth:`_eager_chain`'s constants: the whole model as one eager
        native op, whose logits are rounded as the XLA paths' fused multiply-add."""
        return self._ops.packed_dense_chain(x, *self._chain, encoding=(
            None if x.dtype == tf.uint8 else self.input_encoding))

    def _native(self, x: tf.Tensor) -> tf.Tensor:
        """Packed dense stages and an integer first stage on the native kernels (that stage's
        products by oneDNN's int8 inner product where
        :func:`~bnn.native.dispatch.int8_first_layer_preferred`), each other stage as one XLA
        call; the kernels use all intra-op threads."""
        if self._int8_large:
            x = self.stages[0].integer_product(x)
        for i, stage in enumerate(self.stages):
            if i == 0 and self._real_first:
                x = pack_xla(stage.real_signs(x))
                continue
            y = stage.native_call(x, self.input_encoding)
            x = stage.call_xla(x) if y is None else y
        return x

    def _forward(self, x: tf.Tensor) -> tf.Tensor:
        for stage in self.stages:
            x = stage(x)
        return x

    def _forward_from_signs(self, signs: tf.Tensor) -> tf.Tensor:
        """:meth:`_forward` given the first stage's unpacked sign bits."""
        x = pack(signs)
        for stage in self.stages[1:]:
            x = stage(x)
        return x

    def _run_body(self, x: tf.Tensor) -> tf.Tensor:
        """The whole model: a real-valued first stage's signs outside XLA, the rest in one XLA
        call."""
        if self._real_first:
            return self._body(self.stages[0].real_signs(x))
        return self._body(x)

    def _encode(self, x: tf.Tensor) -> tf.Tensor:
        """float ``x = scale * u + offset`` -> uint8 ``u = round((x - offset) / scale)``."""
        u = tf.round((x - self.input_encoding["offset"]) / self.input_encoding["scale"])
        return tf.cast(tf.clip_by_value(u, 0.0, 255.0), tf.uint8)

    def _large_batch(self, x: tf.Tensor) -> tf.Tensor:
        """Two independent halves of the batch, each the int8 first layer (when available)
        then one XLA call for the rest; TensorFlow's executor runs the halves concurrently."""
        half = tf.shape(x)[0] // 2
        outputs = []
        for part in (x[:half], x[half:]):
            if self._int8:
                outputs.append(self._body_z(self.stages[0].integer_product(part)))
            else:
                outputs.append(self._run_body(part))
        return tf.concat(outputs, axis=0)

    def __call__(self, x) -> tf.Tensor:
        """float32 logits ``(batch, classes)`` for a batch of normalized float32 inputs, or, for
        a model with an input encoding, of uint8 pixels."""
        x = tf.convert_to_tensor(x)
        if x.dtype != tf.uint8 or self.input_encoding is None:
            x = tf.cast(x, tf.float32)
        if self._chain is not None and (x.shape[0] < dispatch.EAGER_BATCH
                                        or not self._int8_large):
            return self._eager(x)
        return self._dispatch.get(x.shape[0], x.dtype.name)(x)

    def predict(self, x, batch_size: int = 256) -> np.ndarray:
        """Logits for ``x`` (numpy or tensor), computed ``batch_size`` examples at a time.

        ``x`` holds normalized float inputs or, for a model with an input encoding, uint8
        pixels; float inputs of such a model must lie on its pixel grid ``scale * u + offset``.
        """
        x = self.prepare(x)
        parts = [self(x[i:i + batch_size]).numpy() for i in range(0, len(x), batch_size)]
        return np.concatenate(parts) if parts else np.zeros((0, self.stages[-1].units), np.float32)

    def prepare(self, x) -> np.ndarray:
        """``x`` checked and converted for :meth:`__call__`: for a model with an input encoding,
        uint8 pixels (float inputs must lie on its pixel grid, and become the pixels they
        encode, which give identical logits); otherwise float32.

        Raises:
            ValueError: for inputs of the wrong shape, or float inputs of an encoded model that
                are not on its pixel grid.
        """
        x = np.asarray(x)
        if x.dtype != np.uint8 or self.input_encoding is None:
            x = x.astype(np.float32)
        if x.shape[1:] != self.input_shape:
            raise ValueError(f"inputs have shape {x.shape[1:]} per example but the packed model "
                             f"expects {self.input_shape}; reshape or normalize the data first")
        if self.input_encoding is not None and x.dtype == np.float32 and x.size:
            scale, offset = self.input_encoding["scale"], self.input_encoding["offset"]
            u = np.clip(np.rint((x - offset) / scale), 0, 255)
            error = float(np.abs(u * scale + offset - x).max())
            if error > 1e-3 * abs(scale):
                raise ValueError(f"inputs are not pixels u in [0, 255] normalized as "
                                 f"{scale:.6g} * u + {offset:.6g} (off by up to {error:.3g}); "
                                 "pass the uint8 pixels or inputs normalized the same way")
            return u.astype(np.uint8)
        return x

    def save_savedmodel(self, path: str) -> None:
        """Writes a TensorFlow SavedModel whose ``serving_default`` signature maps float32
        inputs ``(batch, *input_shape)`` to logits (one XLA call per batch)."""
        tf.saved_model.save(self, str(path),
                            signatures={"serving_default": self.serve.get_concrete_function()})
