"""Binary 2-D convolutions: Keras' ``Conv2D``, ``DepthwiseConv2D`` and ``SeparableConv2D`` with
binary inputs and kernels, and ``padding="same"`` that may pad with ±1 (``pad_values``), so that
every operand stays binary."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
from keras import ops

from bnn.layers.base import DEFAULT_CONSTRAINT, BinaryKernelLayer, QuantizedLayer
from bnn.ops import xnor

__all__ = ["BinaryConv2D", "BinaryDepthwiseConv2D", "BinarySeparableConv2D"]


def _same_padding(layer, inputs) -> list[list[int]]:
    """The amounts a 2-D convolution ``layer`` with ``padding="same"`` pads ``inputs`` by, per
    axis as ``[before, after]`` (TensorFlow's convention: the odd one goes after)."""
    spatial = (1, 2) if layer.data_format == "channels_last" else (2, 3)
    pads = [[0, 0], [0, 0], [0, 0], [0, 0]]
    for axis, k, s, d in zip(spatial, layer.kernel_size, layer.strides, layer.dilation_rate):
        pads[axis] = list(xnor.same_pads(int(inputs.shape[axis]), (k - 1) * d + 1, s))
    return pads


def _padded(layer, x):
    """``(x, padding)`` for a convolution of ``layer`` on quantized inputs ``x``: with
    ``padding="same"`` and ``pad_values != 0``, x padded explicitly with ``pad_values`` and
    ``"valid"``; otherwise x and the layer's padding unchanged."""
    if layer.padding == "same" and layer.pad_values != 0.0 and layer.quantized:
        return ops.pad(x, _same_padding(layer, x), constant_values=layer.pad_values), "valid"
    return x, layer.padding


def _add_bias(layer, outputs):
    """``outputs`` plus the layer's per-channel bias, where it has one."""
    if not layer.use_bias:
        return outputs
    shape = [1, 1, 1, 1]
    shape[-1 if layer.data_format == "channels_last" else 1] = int(layer.bias.shape[0])
    return ops.add(outputs, ops.reshape(layer.bias, shape))


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


@keras.saving.register_keras_serializable(package="bnn")
class BinaryConv2D(BinaryKernelLayer, keras.layers.Conv2D):
    """2-D convolution with binary inputs and kernel.

    Same arguments as :class:`bnn.layers.BinaryDense` plus those of ``keras.layers.Conv2D`` and:

    Args:
        pad_values: value that ``padding="same"`` pads the quantized inputs with. Keras pads with 0,
            which is not a binary value; ``pad_values=1.0`` keeps every operand ±1, so the layer
            can run as pure xor-popcount after export.
    """

    def __init__(self, filters: int, kernel_size, input_quantizer: Any = "ste_sign",
                 kernel_quantizer: Any = "ste_sign", kernel_constraint: Any = DEFAULT_CONSTRAINT,
                 precision: str = "binary", scale_kernel: bool = False, use_bias: bool = False,
                 pad_values: float = 0.0, **kwargs):
        self._init_quantization(precision, input_quantizer, kernel_quantizer, scale_kernel)
        super().__init__(filters, kernel_size, use_bias=use_bias,
                         kernel_constraint=self._constraint(precision, kernel_constraint),
                         **kwargs)
        self.pad_values = float(pad_values)

    def call(self, inputs, training=None):
        x = self._quantize_inputs(inputs)
        kernel = self._product_kernel()
        if self._product(x, training) == "packed":
            outputs = xnor.binary_conv2d(x, kernel, self.strides, self.padding, self.pad_values,
                                         training=training is True)
        else:
            outputs = self._float_convolution(x, kernel)
        outputs = _add_bias(self, outputs)
        return outputs if self.activation is None else self.activation(outputs)

    def _packs(self, x) -> bool:
        """Channels last, no dilation or groups, known input sizes, and padding that keeps every
        operand ±1."""
        return (self.data_format == "channels_last" and tuple(self.dilation_rate) == (1, 1)
                and self.groups == 1 and None not in tuple(x.shape[1:])
                and (self.padding == "valid" or self.pad_values in (1.0, -1.0)))

    def _float_convolution(self, x, kernel):
        """Keras' convolution, padded with ``pad_values``: for ±1 inputs, the zero-padded
        convolution plus the padding's share (exact in integers, and cheaper than padding the
        batch); for real inputs, padded explicitly, rounding as the exported model does."""
        if not (self.padding == "same" and self.pad_values != 0.0 and self.quantized):
            return self.convolution_op(x, kernel)
        correction = (self._padding_correction(x, kernel)
                      if self.input_quantizer is not None else None)
        if correction is not None:
            return ops.add(self.convolution_op(x, kernel), correction)
        x = ops.pad(x, _same_padding(self, x), constant_values=self.pad_values)
        return ops.conv(x, kernel, strides=list(self.strides), padding="valid",
                        dilation_rate=self.dilation_rate, data_format=self.data_format)

    def _padding_correction(self, x, kernel):
        """``conv(pad(x, v)) - conv(pad(x, 0))``: the kernel taps that fall in the padding, times
        ``v``, summed per output position and filter. It does not depend on ``x``, so it is one
        convolution of a single padding-indicator image; ``None`` where shapes are not static."""
        if self.data_format != "channels_last" or None in tuple(x.shape[1:]):
            return None
        pads = _same_padding(self, x)
        h, w, c = (int(d) for d in x.shape[1:])
        border = np.full((1, h + sum(pads[1]), w + sum(pads[2]), c), self.pad_values, "float32")
        border[:, pads[1][0]:pads[1][0] + h, pads[2][0]:pads[2][0] + w, :] = 0.0
        return ops.conv(ops.cast(border, kernel.dtype), kernel, strides=list(self.strides),
                        padding="valid", dilation_rate=self.dilation_rate)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "pad_values": self.pad_values}


@keras.saving.register_keras_serializable(package="bnn")
class BinaryDepthwiseConv2D(QuantizedLayer, keras.layers.DepthwiseConv2D):
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

    quantized_kernels = (("depthwise_quantizer", "kernel", "depthwise_constraint"),)

    def __init__(self, kernel_size, input_quantizer: Any = "ste_sign",
                 depthwise_quantizer: Any = "ste_sign",
                 depthwise_constraint: Any = DEFAULT_CONSTRAINT, precision: str = "binary",
                 pad_values: float = 0.0, use_bias: bool = False, **kwargs):
        self._init_quantization(precision, input_quantizer,
                                depthwise_quantizer=depthwise_quantizer)
        super().__init__(kernel_size, use_bias=use_bias,
                         depthwise_constraint=self._constraint(precision, depthwise_constraint),
                         **kwargs)
        self.pad_values = float(pad_values)

    def call(self, inputs):
        x, padding = _padded(self, self._quantize_inputs(inputs))
        outputs = _depthwise(self, x, self._quantize("depthwise_quantizer", self.kernel), padding)
        outputs = _add_bias(self, outputs)
        return outputs if self.activation is None else self.activation(outputs)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "pad_values": self.pad_values}


@keras.saving.register_keras_serializable(package="bnn")
class BinarySeparableConv2D(QuantizedLayer, keras.layers.SeparableConv2D):
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

    quantized_kernels = (
        ("depthwise_quantizer", "depthwise_kernel", "depthwise_constraint"),
        ("pointwise_quantizer", "pointwise_kernel", "pointwise_constraint"))

    def __init__(self, filters: int, kernel_size, input_quantizer: Any = "ste_sign",
                 depthwise_quantizer: Any = "ste_sign", pointwise_quantizer: Any = "ste_sign",
                 depthwise_constraint: Any = DEFAULT_CONSTRAINT,
                 pointwise_constraint: Any = DEFAULT_CONSTRAINT,
                 precision: str = "binary", pad_values: float = 0.0, use_bias: bool = False,
                 **kwargs):
        self._init_quantization(precision, input_quantizer,
                                depthwise_quantizer=depthwise_quantizer,
                                pointwise_quantizer=pointwise_quantizer)
        super().__init__(
            filters, kernel_size, use_bias=use_bias,
            depthwise_constraint=self._constraint(precision, depthwise_constraint),
            pointwise_constraint=self._constraint(precision, pointwise_constraint),
            **kwargs)
        self.pad_values = float(pad_values)

    def call(self, inputs):
        x, padding = _padded(self, self._quantize_inputs(inputs))
        depthwise = self._quantize("depthwise_quantizer", self.depthwise_kernel)
        pointwise = self._quantize("pointwise_quantizer", self.pointwise_kernel)
        outputs = ops.conv(_depthwise(self, x, depthwise, padding), pointwise, strides=1,
                           padding="valid", data_format=self.data_format)
        outputs = _add_bias(self, outputs)
        return outputs if self.activation is None else self.activation(outputs)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "pad_values": self.pad_values}
