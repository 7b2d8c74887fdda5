"""Binary layers: Keras' Dense, Conv2D, DepthwiseConv2D and SeparableConv2D with quantized inputs
and kernels, and the per-channel activations of modern binary ResNets.

The binary layers keep real-valued *latent* kernels that the optimizer updates; the forward pass
uses ``kernel_quantizer(kernel)`` (±1 by default) on ``input_quantizer(inputs)``. With
``precision="float"`` the same layer is an ordinary float layer of the same shape, which is how
bnn builds a binary model's float twin. ``layer.binary_kernels()`` lists the latent kernels that
a layer binarizes; optimizers, metrics and the model summary find binary weights through it.

``RSign`` (a sign with a learnable per-channel threshold) and ``RPReLU`` (a PReLU with learnable
per-channel shifts) are ReActNet's activations (Liu et al. 2020).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from bnn import bitops
from bnn import quantizers as quantizers_lib
from bnn.constraints import WeightClip
from bnn.xla import compiled

# Keras' scope that sets the dtype variables are read in inside a layer's call (not public API:
# where a Keras lacks it, kernels are read autocast, as Keras reads them).
_AUTOCAST_SCOPE = getattr(getattr(getattr(keras, "src", None), "backend", None), "AutocastScope",
                          None)

__all__ = ["BinaryDense", "BinaryConv2D", "BinaryDepthwiseConv2D", "BinarySeparableConv2D",
           "RSign", "RPReLU", "PRECISIONS"]

PRECISIONS = ("binary", "float")
_DEFAULT = "default"


def _same_padding(layer, inputs) -> list[list[int]]:
    """The amounts a 2-D convolution ``layer`` with ``padding="same"`` pads ``inputs`` by, per
    axis as ``[before, after]`` (TensorFlow's convention: the odd one goes after)."""
    spatial = (1, 2) if layer.data_format == "channels_last" else (2, 3)
    pads = [[0, 0], [0, 0], [0, 0], [0, 0]]
    for axis, k, s, d in zip(spatial, layer.kernel_size, layer.strides, layer.dilation_rate):
        pads[axis] = list(bitops.same_pads(int(inputs.shape[axis]), (k - 1) * d + 1, s))
    return pads


def _padded(layer, x):
    """``(x, padding)`` for a convolution of ``layer`` on quantized inputs ``x``: with
    ``padding="same"`` and ``pad_values != 0``, x padded explicitly with ``pad_values`` and
    ``"valid"``; otherwise x and the layer's padding unchanged."""
    if layer.padding == "same" and layer.pad_values != 0.0 and layer.quantized:
        return ops.pad(x, _same_padding(layer, x), constant_values=layer.pad_values), "valid"
    return x, layer.padding


def _depthwise(layer, x, kernel, padding):
    """``ops.depthwise_conv`` of ``x`` with ``layer``'s strides and dilation. Unequal strides
    run as stride 1 on explicitly padded input, then every ``strides``-th output (the same
    windows): TensorFlow's CPU kernel refuses unequal strides where oneDNN does not run it (on
    CPUs without AVX-512, such as AMD Zen 3)."""
    if layer.strides[0] == layer.strides[1]:
        return ops.depthwise_conv(x, kernel, strides=layer.strides, padding=padding,
                                  dilation_rate=layer.dilation_rate,
                                  data_format=layer.data_format)
    if padding == "same":
        x = ops.pad(x, _same_padding(layer, x))
    y = ops.depthwise_conv(x, kernel, strides=1, padding="valid",
                           dilation_rate=layer.dilation_rate, data_format=layer.data_format)
    sh, sw = layer.strides
    if layer.data_format == "channels_last":
        return y[:, ::sh, ::sw, :]
    return y[:, :, ::sh, ::sw]


def _quantized(variable, quantizer):
    return variable if quantizer is None else quantizer(variable)


class _Quantization:
    """What every binary layer shares: the precision switch and input quantization."""

    def _init_precision(self, precision, input_quantizer):
        if precision not in PRECISIONS:
            raise ValueError(
                f"{type(self).__name__} precision must be one of {PRECISIONS}, got {precision!r}"
            )
        self.precision = precision
        self.input_quantizer = quantizers_lib.get(input_quantizer)

    @staticmethod
    def _default_constraint(precision, kernel_constraint):
        if kernel_constraint == _DEFAULT:
            return WeightClip(1.0) if precision == "binary" else None
        return kernel_constraint

    @property
    def quantized(self) -> bool:
        """True when this layer quantizes (``precision="binary"``)."""
        return self.precision == "binary"

    def _quantize_inputs(self, inputs):
        if self.quantized and self.input_quantizer is not None:
            return self.input_quantizer(inputs)
        return inputs


class _QuantizedLayer(_Quantization):
    """Shared part of the single-kernel binary layers: kernel quantization and scaling."""

    def _init_quantization(self, precision, input_quantizer, kernel_quantizer, scale_kernel):
        self._init_precision(precision, input_quantizer)
        self.kernel_quantizer = quantizers_lib.get(kernel_quantizer)
        self.scale_kernel = bool(scale_kernel)

    def binary_kernels(self) -> list:
        """The latent kernels this layer quantizes in its forward pass: ``[kernel]`` when
        ``quantized`` and a ``kernel_quantizer`` is set, else ``[]``."""
        if self.quantized and self.kernel_quantizer is not None:
            return [self.kernel]
        return []

    def binary_kernel(self) -> tf.Tensor:
        """The quantized kernel the forward pass uses: ``kernel_quantizer(kernel)`` (±1 for
        ``ste_sign``), without the optional per-channel scale."""
        if not self.quantized or self.kernel_quantizer is None:
            raise ValueError(
                f"layer {self.name!r} has precision={self.precision!r} and kernel_quantizer="
                f"{self.kernel_quantizer!r}, so it has no binary kernel; read layer.kernel instead"
            )
        return self.kernel_quantizer(self.kernel)

    def kernel_scale(self) -> tf.Tensor | None:
        """Per-output-channel scale ``mean(|W|)`` (XNOR-Net), or None when ``scale_kernel`` is off."""
        if not (self.quantized and self.scale_kernel):
            return None
        axes = list(range(len(self.kernel.shape) - 1))
        return ops.mean(ops.abs(self.kernel), axis=axes)

    def _kernel_kept_in_range(self) -> bool:
        """True for an ``ste_sign`` kernel whose ``WeightClip`` keeps every latent weight inside
        the quantizer's ``clip_value``: its straight-through mask is then all ones."""
        q, c = self.kernel_quantizer, self.kernel_constraint
        return (isinstance(q, quantizers_lib.SteSign) and isinstance(c, WeightClip)
                and c.clip_value <= q.get_config()["clip_value"])

    def _clip_initial_kernel(self):
        """Applies ``WeightClip`` to the initial kernel, so it holds from the first step on."""
        if self.quantized and isinstance(self.kernel_constraint, WeightClip):
            self.kernel.assign(self.kernel_constraint(self.kernel))

    def _quantized_kernel(self):
        """``kernel_quantizer(kernel)``; for a kernel kept in range by its ``WeightClip``, the
        same sign with the mask skipped (it is all ones): no extra pass over the weights."""
        if self._kernel_kept_in_range():
            return quantizers_lib.ste_sign(self.kernel, clip_value=float("inf"))
        return self.kernel_quantizer(self.kernel)

    def _latent_kernel(self) -> tf.Tensor:
        """The latent kernel in its own dtype (float32), not autocast to a mixed-precision
        policy's compute dtype: its sign needs no cast, which would be a pass over the weights
        (under XLA a slow one, fused into the packing)."""
        with contextlib.nullcontext() if _AUTOCAST_SCOPE is None else _AUTOCAST_SCOPE(None):
            return tf.convert_to_tensor(self.kernel)

    def _effective_kernel(self):
        if not self.quantized:
            return self.kernel
        kernel = self.kernel if self.kernel_quantizer is None else self._quantized_kernel()
        scale = self.kernel_scale()
        return kernel if scale is None else kernel * ops.cast(scale, kernel.dtype)

    def _sign_kernel(self) -> bool:
        """True when the kernel the product uses is exactly ±1 (a ``plus_minus_one`` quantizer,
        no kernel scale) and binary layers computing in this dtype take packed products
        (:func:`bnn.bitops.packed_training_enabled`)."""
        return (self.quantized and not self.scale_kernel
                and getattr(self.kernel_quantizer, "plus_minus_one", False)
                and bitops.packed_training_enabled(self.compute_dtype))

    def _packed_product(self) -> bool:
        """True when both operands of the product are exactly ±1 (``plus_minus_one`` quantizers,
        no kernel scale), so the forward product can run by xor-popcount (:mod:`bnn.bitops`)."""
        return self._sign_kernel() and getattr(self.input_quantizer, "plus_minus_one", False)

    def _sign_operand(self):
        """The kernel a product of its signs takes: the latent kernel itself where it is kept in
        range (its sign happens inside the packing, and its straight-through mask is all ones),
        else the quantized kernel."""
        return self._latent_kernel() if self._kernel_kept_in_range() else self._effective_kernel()

    def _quantization_config(self) -> dict[str, Any]:
        return {
            "precision": self.precision,
            "input_quantizer": quantizers_lib.serialize(self.input_quantizer),
            "kernel_quantizer": quantizers_lib.serialize(self.kernel_quantizer),
            "scale_kernel": self.scale_kernel,
        }


@keras.saving.register_keras_serializable(package="bnn")
class BinaryDense(_QuantizedLayer, keras.layers.Dense):
    """Fully connected layer with binary inputs and kernel.

    ``outputs = activation(input_quantizer(x) @ kernel_quantizer(W) [* scale] [+ b])``

    Args:
        units: output size.
        input_quantizer: quantizer for the inputs (default ``"ste_sign"``); ``None`` for a first
            layer that sees real-valued data.
        kernel_quantizer: quantizer for the latent kernel (default ``"ste_sign"``).
        kernel_constraint: default ``WeightClip(1.0)`` when binary, none when float.
        precision: ``"binary"`` or ``"float"`` (quantizers off: the float twin).
        scale_kernel: multiply the binary kernel by ``mean(|W|)`` per output unit (XNOR-Net).
        use_bias: default False (batch normalization usually follows).
        **kwargs: any other argument of ``keras.layers.Dense``.
    """

    def __init__(self, units: int, input_quantizer: Any = "ste_sign",
                 kernel_quantizer: Any = "ste_sign", kernel_constraint: Any = _DEFAULT,
                 precision: str = "binary", scale_kernel: bool = False, use_bias: bool = False,
                 **kwargs):
        self._init_quantization(precision, input_quantizer, kernel_quantizer, scale_kernel)
        super().__init__(units, use_bias=use_bias,
                         kernel_constraint=self._default_constraint(precision, kernel_constraint),
                         **kwargs)

    def build(self, input_shape):
        super().build(input_shape)
        self._clip_initial_kernel()

    def call(self, inputs, training=None):
        x = self._quantize_inputs(inputs)
        if self._packed_product() and len(x.shape) == 2:
            x = bitops.binary_matmul(x, self._sign_operand(), training=training is True)
        elif (native := self._native_sign_kernel(x, training)) is not None:
            x = bitops.sign_kernel_matmul(x, self._sign_operand(), native)
        else:
            x = ops.matmul(x, self._effective_kernel())
        if self.bias is not None:
            x = ops.add(x, self.bias)
        if self.activation is not None:
            x = self.activation(x)
        return x

    def _native_sign_kernel(self, x, training):
        """The native kernels for a training step's product of real-valued float32 inputs (a
        first layer's) with a ±1 kernel (:func:`bnn.bitops.sign_kernel_matmul`), where they
        apply; else ``None``."""
        if (training is not True or self.input_quantizer is not None or len(x.shape) != 2
                or x.dtype != tf.float32 or not self._sign_kernel()):
            return None
        return bitops.native_training_ops(x.dtype)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), **self._quantization_config()}


@keras.saving.register_keras_serializable(package="bnn")
class BinaryConv2D(_QuantizedLayer, keras.layers.Conv2D):
    """2-D convolution with binary inputs and kernel.

    Same arguments as :class:`BinaryDense` plus those of ``keras.layers.Conv2D`` and:

    Args:
        pad_values: value that ``padding="same"`` pads the quantized inputs with. Keras pads with 0,
            which is not a binary value; ``pad_values=1.0`` keeps every operand ±1, so the layer
            can run as pure xor-popcount after export.
    """

    def __init__(self, filters: int, kernel_size, input_quantizer: Any = "ste_sign",
                 kernel_quantizer: Any = "ste_sign", kernel_constraint: Any = _DEFAULT,
                 precision: str = "binary", scale_kernel: bool = False, use_bias: bool = False,
                 pad_values: float = 0.0, **kwargs):
        self._init_quantization(precision, input_quantizer, kernel_quantizer, scale_kernel)
        super().__init__(filters, kernel_size, use_bias=use_bias,
                         kernel_constraint=self._default_constraint(precision, kernel_constraint),
                         **kwargs)
        self.pad_values = float(pad_values)

    def build(self, input_shape):
        super().build(input_shape)
        self._clip_initial_kernel()

    def _same_padding(self, inputs):
        """Explicit 'same' padding amounts, as ``[[0,0],[top,bottom],[left,right],[0,0]]``."""
        return _same_padding(self, inputs)

    def _padding_correction(self, x, kernel):
        """``conv(pad(x, v)) - conv(pad(x, 0))``: the kernel taps that fall in the padding, times
        ``v``, summed per output position and filter. It does not depend on ``x``, so it is one
        convolution of a single padding-indicator image; ``None`` where shapes are not static."""
        if self.data_format != "channels_last" or None in tuple(x.shape[1:]):
            return None
        pads = self._same_padding(x)
        h, w, c = (int(d) for d in x.shape[1:])
        border = np.full((1, h + sum(pads[1]), w + sum(pads[2]), c), self.pad_values, "float32")
        border[:, pads[1][0]:pads[1][0] + h, pads[2][0]:pads[2][0] + w, :] = 0.0
        return ops.conv(ops.cast(border, kernel.dtype), kernel, strides=list(self.strides),
                        padding="valid", dilation_rate=self.dilation_rate)

    def _packed_convolution(self, x, kernel, training=None):
        """The convolution by xor-popcount, or None where that does not apply: operands not
        both ±1, channels first, dilation, groups, unknown input sizes, or 'same' padding
        with a value other than ±1."""
        if not (self._packed_product() and self.data_format == "channels_last"
                and tuple(self.dilation_rate) == (1, 1) and self.groups == 1
                and None not in tuple(x.shape[1:])):
            return None
        if self.padding == "valid" or self.pad_values in (1.0, -1.0):
            return bitops.binary_conv2d(x, kernel, self.strides, self.padding, self.pad_values,
                                        training=training is True)
        return None

    def call(self, inputs, training=None):
        x = self._quantize_inputs(inputs)
        kernel = self._effective_kernel()
        packed = self._packed_convolution(x, kernel, training)
        if packed is not None:
            outputs = packed
        elif not (self.padding == "same" and self.pad_values != 0.0 and self.quantized):
            outputs = self.convolution_op(x, kernel)
        else:
            # ±1 inputs: the zero-padded convolution plus the padding's share, exact in integers
            # and cheaper than padding the batch; real inputs: pad explicitly, rounding as export
            correction = (self._padding_correction(x, kernel)
                          if self.input_quantizer is not None else None)
            if correction is not None:
                outputs = ops.add(self.convolution_op(x, kernel), correction)
            else:
                x = ops.pad(x, self._same_padding(x), constant_values=self.pad_values)
                outputs = ops.conv(x, kernel, strides=list(self.strides), padding="valid",
                                   dilation_rate=self.dilation_rate, data_format=self.data_format)
        if self.use_bias:
            shape = (1, 1, 1, self.filters) if self.data_format == "channels_last" else (
                1, self.filters, 1, 1)
            outputs = ops.add(outputs, ops.reshape(self.bias, shape))
        if self.activation is not None:
            return self.activation(outputs)
        return outputs

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), **self._quantization_config(),
                "pad_values": self.pad_values}


class _DepthwiseQuantization(_Quantization):
    """Argument handling shared by the depthwise and separable layers; ``quantizers`` maps
    attribute names (``depthwise_quantizer``, ...) to quantizer identifiers."""

    def _init_depthwise(self, precision, input_quantizer, pad_values, **quantizers):
        self._init_precision(precision, input_quantizer)
        for name, quantizer in quantizers.items():
            setattr(self, name, quantizers_lib.get(quantizer))
        self._quantizer_names = tuple(quantizers)
        self.pad_values = float(pad_values)

    def _clip_initial(self, variables, constraints):
        """Applies ``WeightClip`` constraints to the initial kernels."""
        if self.quantized:
            for variable, constraint in zip(variables, constraints):
                if isinstance(constraint, WeightClip):
                    variable.assign(constraint(variable))

    def _depthwise_config(self) -> dict[str, Any]:
        return {"precision": self.precision,
                "input_quantizer": quantizers_lib.serialize(self.input_quantizer),
                **{name: quantizers_lib.serialize(getattr(self, name))
                   for name in self._quantizer_names},
                "pad_values": self.pad_values}

    def _add_bias(self, outputs):
        if not self.use_bias:
            return outputs
        shape = [1, 1, 1, 1]
        shape[-1 if self.data_format == "channels_last" else 1] = int(self.bias.shape[0])
        return ops.add(outputs, ops.reshape(self.bias, shape))


@keras.saving.register_keras_serializable(package="bnn")
class BinaryDepthwiseConv2D(_DepthwiseQuantization, keras.layers.DepthwiseConv2D):
    """Depthwise 2-D convolution (each input channel convolved with its own
    ``depth_multiplier`` filters) with binary inputs and kernel.

    ``outputs = activation(depthwise_conv(input_quantizer(x), depthwise_quantizer(K)) [+ b])``

    Args:
        kernel_size: height and width of the filters.
        input_quantizer: quantizer for the inputs (default ``"ste_sign"``); ``None`` for real
            inputs.
        depthwise_quantizer: quantizer for the latent depthwise kernel (default ``"ste_sign"``).
        depthwise_constraint: default ``WeightClip(1.0)`` when binary, none when float.
        precision: ``"binary"`` or ``"float"`` (quantizers off: the float twin).
        pad_values: value that ``padding="same"`` pads the quantized inputs with (Keras: 0).
        use_bias: default False.
        **kwargs: any other argument of ``keras.layers.DepthwiseConv2D``.
    """

    def __init__(self, kernel_size, input_quantizer: Any = "ste_sign",
                 depthwise_quantizer: Any = "ste_sign", depthwise_constraint: Any = _DEFAULT,
                 precision: str = "binary", pad_values: float = 0.0, use_bias: bool = False,
                 **kwargs):
        self._init_depthwise(precision, input_quantizer, pad_values,
                             depthwise_quantizer=depthwise_quantizer)
        super().__init__(kernel_size, use_bias=use_bias,
                         depthwise_constraint=self._default_constraint(precision,
                                                                       depthwise_constraint),
                         **kwargs)

    def build(self, input_shape):
        super().build(input_shape)
        self._clip_initial([self.kernel], [self.depthwise_constraint])

    def binary_kernels(self) -> list:
        """``[kernel]`` (the depthwise kernel) when quantized with a ``depthwise_quantizer``."""
        return [self.kernel] if self.quantized and self.depthwise_quantizer is not None else []

    def call(self, inputs):
        x = self._quantize_inputs(inputs)
        kernel = _quantized(self.kernel, self.depthwise_quantizer if self.quantized else None)
        x, padding = _padded(self, x)
        outputs = _depthwise(self, x, kernel, padding)
        outputs = self._add_bias(outputs)
        return outputs if self.activation is None else self.activation(outputs)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), **self._depthwise_config()}


@keras.saving.register_keras_serializable(package="bnn")
class BinarySeparableConv2D(_DepthwiseQuantization, keras.layers.SeparableConv2D):
    """Depthwise separable 2-D convolution (a depthwise convolution, then a 1x1 pointwise one)
    with binary inputs and kernels.

    ``outputs = activation(pointwise(depthwise(input_quantizer(x), depthwise_quantizer(D)),
    pointwise_quantizer(P)) [+ b])``. The pointwise convolution sees the depthwise outputs
    unquantized (real values).

    Args:
        filters: output channels.
        kernel_size: height and width of the depthwise filters.
        input_quantizer: quantizer for the inputs (default ``"ste_sign"``); ``None`` for real
            inputs.
        depthwise_quantizer, pointwise_quantizer: quantizers for the two latent kernels (default
            ``"ste_sign"``).
        depthwise_constraint, pointwise_constraint: default ``WeightClip(1.0)`` when binary,
            none when float.
        precision: ``"binary"`` or ``"float"`` (quantizers off: the float twin).
        pad_values: value that ``padding="same"`` pads the quantized inputs with (Keras: 0).
        use_bias: default False.
        **kwargs: any other argument of ``keras.layers.SeparableConv2D``.
    """

    def __init__(self, filters: int, kernel_size, input_quantizer: Any = "ste_sign",
                 depthwise_quantizer: Any = "ste_sign", pointwise_quantizer: Any = "ste_sign",
                 depthwise_constraint: Any = _DEFAULT, pointwise_constraint: Any = _DEFAULT,
                 precision: str = "binary", pad_values: float = 0.0, use_bias: bool = False,
                 **kwargs):
        self._init_depthwise(precision, input_quantizer, pad_values,
                             depthwise_quantizer=depthwise_quantizer,
                             pointwise_quantizer=pointwise_quantizer)
        super().__init__(
            filters, kernel_size, use_bias=use_bias,
            depthwise_constraint=self._default_constraint(precision, depthwise_constraint),
            pointwise_constraint=self._default_constraint(precision, pointwise_constraint),
            **kwargs)

    def build(self, input_shape):
        super().build(input_shape)
        self._clip_initial([self.depthwise_kernel, self.pointwise_kernel],
                           [self.depthwise_constraint, self.pointwise_constraint])

    def binary_kernels(self) -> list:
        """The depthwise and pointwise kernels that have a quantizer, when quantized."""
        if not self.quantized:
            return []
        pairs = ((self.depthwise_kernel, self.depthwise_quantizer),
                 (self.pointwise_kernel, self.pointwise_quantizer))
        return [kernel for kernel, quantizer in pairs if quantizer is not None]

    def call(self, inputs):
        x = self._quantize_inputs(inputs)
        quantize = self.quantized
        depthwise = _quantized(self.depthwise_kernel, self.depthwise_quantizer if quantize else None)
        pointwise = _quantized(self.pointwise_kernel, self.pointwise_quantizer if quantize else None)
        x, padding = _padded(self, x)
        outputs = ops.conv(_depthwise(self, x, depthwise, padding), pointwise, strides=1,
                           padding="valid", data_format=self.data_format)
        outputs = self._add_bias(outputs)
        return outputs if self.activation is None else self.activation(outputs)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), **self._depthwise_config()}


def _channel_shape(rank: int) -> tuple[int, ...]:
    """Broadcast shape of a per-channel vector: ``(1, ..., 1, channels)``."""
    return (1,) * (rank - 1) + (-1,)


def _channel_sum(t: tf.Tensor) -> tf.Tensor:
    """Sum over every axis but the last, as a TensorFlow op of its own: XLA's CPU compiler turns
    such a column sum into a windowed loop several times slower than TensorFlow's kernel."""
    return tf.reduce_sum(t, axis=list(range(t.shape.rank - 1)))


@compiled
def _shift(x: tf.Tensor, t: tf.Tensor) -> tf.Tensor:
    return x - tf.reshape(t, _channel_shape(x.shape.rank))


@tf.custom_gradient
def _channel_shift(x: tf.Tensor, t: tf.Tensor):
    """``x - t`` with ``t`` per channel, in one pass; gradients ``dy`` and ``-sum(dy)``."""
    return _shift(x, t), lambda dy: (tf.identity(dy), -_channel_sum(dy))


def _shifted_activation(activation: Callable) -> Callable:
    """``activation(x - t)`` with ``t`` per channel, one fused pass forward and one backward
    (the activation's derivative by automatic differentiation inside that pass), and the
    threshold's gradient ``-sum(dx)`` as a TensorFlow sum."""

    @compiled
    def forward(x, t):
        return activation(x - tf.reshape(t, _channel_shape(x.shape.rank)))

    @compiled
    def backward(dy, x, t):
        z = x - tf.reshape(t, _channel_shape(x.shape.rank))
        with tf.GradientTape() as tape:
            tape.watch(z)
            y = activation(z)
        return tape.gradient(y, z, output_gradients=dy)

    @tf.custom_gradient
    def op(x, t):
        def grad(dy):
            dx = backward(dy, x, t)
            return dx, -_channel_sum(dx)

        return forward(x, t), grad

    return op


@compiled
def _rprelu_forward(xs, gamma, beta, zeta):
    shape = _channel_shape(xs[0].shape.rank)
    z = tf.add_n(xs) - tf.reshape(gamma, shape)
    return tf.where(z > 0, z, tf.reshape(beta, shape) * z) + tf.reshape(zeta, shape)


@compiled
def _rprelu_backward(dy, xs, gamma, beta):
    """``dy/dx * dy`` and ``dy/dbeta * dy``, elementwise, in one pass."""
    shape = _channel_shape(dy.shape.rank)
    z = tf.add_n(xs) - tf.reshape(gamma, shape)
    positive = z > 0
    return (tf.where(positive, dy, tf.reshape(beta, shape) * dy),
            tf.where(positive, tf.zeros_like(dy), dy * z))


@tf.custom_gradient
def _rprelu(gamma, beta, zeta, *xs):
    """RPReLU of ``sum(xs)`` in one pass forward and one backward, plus the three per-channel
    sums; every summand gets the same gradient."""
    def grad(dy):
        dx, dbeta = _rprelu_backward(dy, list(xs), gamma, beta)
        return (-_channel_sum(dx), _channel_sum(dbeta), _channel_sum(dy), *([dx] * len(xs)))

    return _rprelu_forward(list(xs), gamma, beta, zeta), grad


@keras.saving.register_keras_serializable(package="bnn")
class RSign(keras.layers.Layer):
    r"""Sign with a learnable threshold per channel (ReActNet's RSign).

    ``y = quantizer(x - t_c)`` for channel ``c`` (the last axis), ``t`` initialized to 0 and
    trained. With ``ste_sign`` the gradients are ``dy/dx = 1{|x - t_c| <= 1}`` and
    ``dL/dt_c = -sum(dL/dy * 1{|x - t_c| <= 1})`` over every position of channel ``c``.

    ``quantizer=None`` keeps only the shift, ``y = x - t_c``, for a binary layer whose own input
    quantizer then takes the sign: ``BinaryConv2D(input_quantizer=q)(RSign(None)(x))`` computes
    ``conv(q(x - t), sign(W))``, and its product still runs by xor-popcount. bnn's models use it
    that way.

    ``precision="float"`` (the float twin) has no sign: ``y = float_activation(x - t_c)``, the real
    activation the float twin has where the binary model takes the sign (default ``None``: the
    shift alone). Shift and activation are one fused pass forward and one backward, and the
    threshold's gradient one per-channel sum.
    """

    def __init__(self, quantizer: Any = "ste_sign", precision: str = "binary",
                 float_activation: str | None = None, **kwargs):
        super().__init__(**kwargs)
        if precision not in PRECISIONS:
            raise ValueError(f"RSign precision must be one of {PRECISIONS}, got {precision!r}")
        self.quantizer = quantizers_lib.get(quantizer)
        self.precision = precision
        self.float_activation = float_activation
        self._float_op = (None if float_activation is None else
                          _shifted_activation(keras.activations.get(float_activation)))

    def build(self, input_shape):
        self.threshold = self.add_weight(name="threshold", shape=(int(input_shape[-1]),),
                                         initializer="zeros")

    def call(self, inputs):
        t = ops.cast(self.threshold, inputs.dtype)
        if self.precision == "float" and self._float_op is not None:
            return self._float_op(inputs, t)
        shifted = _channel_shift(inputs, t)
        if self.precision == "binary" and self.quantizer is not None:
            return self.quantizer(shifted)
        return shifted

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "precision": self.precision,
                "quantizer": quantizers_lib.serialize(self.quantizer),
                "float_activation": self.float_activation}


@keras.saving.register_keras_serializable(package="bnn")
class RPReLU(keras.layers.Layer):
    r"""PReLU with learnable shifts before and after, per channel (ReActNet's RPReLU).

    ``y = z + zeta_c`` where ``z = x - gamma_c`` if ``x > gamma_c``, else ``beta_c (x - gamma_c)``,
    for channel ``c`` (the last axis). ``gamma`` and ``zeta`` start at 0, the slope ``beta`` at
    ``slope`` (PReLU's 0.25). Gradients: ``dy/dx = 1`` where ``x > gamma_c``, else ``beta_c``;
    ``dy/dgamma_c = -dy/dx``; ``dy/dzeta_c = 1``; ``dy/dbeta_c = min(x - gamma_c, 0)``.
    Real-valued in both twins; one fused pass forward and one backward.

    Called on a list of tensors of one shape, it is the RPReLU of their sum, with the addition
    in the same pass (a residual block's ``RPReLU(shortcut + y)`` without a pass of its own).
    """

    def __init__(self, slope: float = 0.25, **kwargs):
        super().__init__(**kwargs)
        self.slope = float(slope)

    def build(self, input_shape):
        if input_shape and isinstance(input_shape[0], (list, tuple)):  # a list of shapes
            input_shape = input_shape[0]
        channels = (int(input_shape[-1]),)
        self.gamma = self.add_weight(name="gamma", shape=channels, initializer="zeros")
        self.beta = self.add_weight(name="beta", shape=channels,
                                    initializer=keras.initializers.Constant(self.slope))
        self.zeta = self.add_weight(name="zeta", shape=channels, initializer="zeros")

    def call(self, inputs):
        xs = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
        return _rprelu(*(ops.cast(v, xs[0].dtype) for v in (self.gamma, self.beta, self.zeta)),
                       *xs)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "slope": self.slope}
