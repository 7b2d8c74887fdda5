"""Larq's quantized layers on bnn's binary layers.

``QuantDense``, ``QuantConv2D``, ``QuantDepthwiseConv2D`` and ``QuantSeparableConv2D`` take
Larq's arguments with Larq's defaults (no quantizers, no constraint, a bias) and compute
``activation(op(input_quantizer(x), kernel_quantizer(kernel)) + bias)``, exactly as Larq does,
with ``pad_values`` filling ``padding="same"`` borders of the quantized inputs. They are bnn's
:class:`~bnn.layers.BinaryDense`, :class:`~bnn.layers.BinaryConv2D`,
:class:`~bnn.layers.BinaryDepthwiseConv2D` and :class:`~bnn.layers.BinarySeparableConv2D` and are
saved as those.

On top of the bnn layer, each one, as in Larq:

* resolves quantizers by Larq's names and ``kernel_constraint="weight_clip"``;
* tags each quantized kernel variable with its quantizer's ``precision`` (bits), which
  :meth:`bnn.larq.optimizers.Bop.is_binary_variable` reads;
* tracks ``flip_ratio/<quantizer name>`` (Larq's name), the fraction of quantized kernel entries that change per
  training step (a Keras metric in the training logs), when its kernel quantizer asks for it
  (``metrics=["flip_ratio"]`` or :func:`bnn.larq.context.metrics_scope`);
* logs a warning for a binary kernel quantizer without a constraint (the latent weights may
  then leave the straight-through window for good).

Larq's other quantized layers (``QuantConv1D``, ``QuantConv3D``, ``QuantConv2DTranspose``,
``QuantConv3DTranspose``, ``QuantLocallyConnected1D/2D``, ``QuantSeparableConv1D``) have no bnn
counterpart; asking for one raises an AttributeError that says so.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

from bnn import layers as bl
from bnn import quantizers as bq
from bnn.larq import constraints, context, quantizers
from bnn.larq import metrics as larq_metrics
from bnn.larq._saving import saves_as

__all__ = ["QuantDense", "QuantConv2D", "QuantDepthwiseConv2D", "QuantSeparableConv2D"]

_log = logging.getLogger(__name__)
UNSUPPORTED = ("QuantConv1D", "QuantConv3D", "QuantConv2DTranspose", "QuantConv3DTranspose",
               "QuantLocallyConnected1D", "QuantLocallyConnected2D", "QuantSeparableConv1D")


def __getattr__(name: str):
    if name in UNSUPPORTED:
        raise AttributeError(
            f"bnn.larq.layers has no {name}: bnn supports Larq's {', '.join(__all__)}; build the "
            "model from those, or keep this layer in Larq")
    raise AttributeError(f"module 'bnn.larq.layers' has no attribute {name!r}")


def _activation(activation: Any) -> Any:
    """Larq lets a quantizer name serve as ``activation``; Keras 3 only knows its own names, so
    the name becomes the bnn quantizer of Larq's (which a saved model loads with bnn alone)."""
    if isinstance(activation, str) and activation in quantizers.NAMES:
        return bq.equivalent(quantizers.get(activation))
    return activation


class _LarqLayer:
    """What the four layers add to their bnn layer: Larq's metrics and precision tags."""

    #: As in Larq, the kernel constraint first applies after the first optimizer step.
    _clip_on_build = False

    #: ``(kernel attribute, quantizer attribute, constraint attribute)`` of each kernel.
    _kernels: tuple[tuple[str, str, str], ...] = (("kernel", "kernel_quantizer",
                                                   "kernel_constraint"),)

    def _init_larq(self, metrics: Sequence[str] | None) -> None:
        """``metrics``: older Larq's layer argument, the training metrics of every kernel
        quantizer of the layer (overrides the quantizers' own)."""
        self._layer_metrics = context.check_metrics(metrics)
        if getattr(self.input_quantizer, "_custom_metrics", None):
            raise ValueError(
                f"layer {self.name!r}: metrics on an input quantizer are not supported; bnn.larq "
                "tracks flip_ratio for kernel quantizers (kernel_quantizer=..., metrics=...)")
        for _, quantizer_attr, constraint_attr in self._kernels:
            quantizer = getattr(self, quantizer_attr)
            if (quantizer is not None and getattr(quantizer, "precision", None) == 1
                    and not isinstance(quantizer, quantizers.NoOp)
                    and getattr(self, constraint_attr) is None):
                _log.warning(
                    "Using a binary weight quantizer without setting `%s` may result in starved "
                    "weights (where the gradient is always zero).", constraint_attr)

    def _build_larq(self) -> None:
        tracked, metrics = [], []
        for kernel_attr, quantizer_attr, _ in self._kernels:
            kernel, quantizer = getattr(self, kernel_attr), getattr(self, quantizer_attr)
            if quantizer is None:
                continue
            kernel.precision = getattr(quantizer, "precision", None)
            wanted = self._layer_metrics or getattr(quantizer, "_custom_metrics", None) or ()
            if "flip_ratio" in wanted:
                tracked.append((kernel_attr, quantizer_attr))
                metrics.append(larq_metrics.FlipRatio(values_shape=tuple(kernel.shape),
                                                      name=self._flip_ratio_name(quantizer,
                                                                                 kernel_attr)))
        self._flip_ratio_kernels = tuple(tracked)
        self._flip_ratios = metrics

    def _flip_ratio_name(self, quantizer, kernel_attr: str) -> str:
        """Larq's name of a kernel's flip-ratio metric, ``flip_ratio/<quantizer name>`` (a
        quantizer Larq's way, a Keras layer, is named ``ste_sign``, ``ste_sign_1``, ...); for
        a plain function, ``flip_ratio/<layer name>`` (and ``/<kernel>`` where the layer has
        several kernels)."""
        name = getattr(quantizer, "name", None)
        if isinstance(name, str) and name:
            return f"flip_ratio/{name}"
        suffix = "" if len(self._kernels) == 1 else "/" + kernel_attr
        return f"flip_ratio/{self.name}{suffix}"

    #: Whether the bnn layer's ``call`` takes ``training`` (BinaryDense and BinaryConv2D do).
    _call_takes_training = False

    def build(self, input_shape):
        super().build(input_shape)
        self._build_larq()

    def call(self, inputs, training=None):
        self._update_flip_ratios(training)
        if self._call_takes_training:
            return super().call(inputs, training=training)
        return super().call(inputs)

    def _update_flip_ratios(self, training) -> None:
        if training:
            for (kernel_attr, quantizer_attr), metric in zip(self._flip_ratio_kernels,
                                                              self._flip_ratios):
                metric.update_state(self._quantize(quantizer_attr, getattr(self, kernel_attr)))


def _larq_arguments(kwargs: dict) -> dict:
    """kwargs with bnn's ``precision`` defaulting to ``"binary"`` (Larq layers always apply
    their quantizers; a saved config carries ``precision`` back in)."""
    kwargs.setdefault("precision", "binary")
    return kwargs


@saves_as(bl.BinaryDense)
class QuantDense(_LarqLayer, bl.BinaryDense):
    """Larq's ``QuantDense``: ``activation(input_quantizer(x) @ kernel_quantizer(W) + b)``.

    Same arguments and defaults as Larq, plus ``metrics`` (older Larq's layer argument: the
    training metrics of the kernel quantizer) and bnn's keyword arguments.
    """

    _call_takes_training = True

    def __init__(self, units: int, activation: Any = None, use_bias: bool = True,
                 input_quantizer: Any = None, kernel_quantizer: Any = None,
                 kernel_initializer: Any = "glorot_uniform", bias_initializer: Any = "zeros",
                 kernel_regularizer: Any = None, bias_regularizer: Any = None,
                 activity_regularizer: Any = None, kernel_constraint: Any = None,
                 bias_constraint: Any = None, metrics: Sequence[str] | None = None, **kwargs):
        super().__init__(
            units, activation=_activation(activation), use_bias=use_bias,
            input_quantizer=quantizers.get(input_quantizer),
            kernel_quantizer=quantizers.get_kernel_quantizer(kernel_quantizer),
            kernel_initializer=kernel_initializer, bias_initializer=bias_initializer,
            kernel_regularizer=kernel_regularizer, bias_regularizer=bias_regularizer,
            activity_regularizer=activity_regularizer,
            kernel_constraint=constraints.get(kernel_constraint),
            bias_constraint=constraints.get(bias_constraint), **_larq_arguments(kwargs))
        self._init_larq(metrics)


@saves_as(bl.BinaryConv2D)
class QuantConv2D(_LarqLayer, bl.BinaryConv2D):
    """Larq's ``QuantConv2D``: ``activation(conv2d(input_quantizer(x), kernel_quantizer(K)) +
    b)``, the quantized inputs padded with ``pad_values`` where ``padding="same"``."""

    _call_takes_training = True

    def __init__(self, filters: int, kernel_size, strides=(1, 1), padding: str = "valid",
                 pad_values: float = 0.0, data_format: str | None = None, dilation_rate=(1, 1),
                 groups: int = 1, activation: Any = None, use_bias: bool = True,
                 input_quantizer: Any = None, kernel_quantizer: Any = None,
                 kernel_initializer: Any = "glorot_uniform", bias_initializer: Any = "zeros",
                 kernel_regularizer: Any = None, bias_regularizer: Any = None,
                 activity_regularizer: Any = None, kernel_constraint: Any = None,
                 bias_constraint: Any = None, metrics: Sequence[str] | None = None, **kwargs):
        super().__init__(
            filters, kernel_size, strides=strides, padding=padding, pad_values=pad_values,
            data_format=data_format, dilation_rate=dilation_rate, groups=groups,
            activation=_activation(activation), use_bias=use_bias,
            input_quantizer=quantizers.get(input_quantizer),
            kernel_quantizer=quantizers.get_kernel_quantizer(kernel_quantizer),
            kernel_initializer=kernel_initializer, bias_initializer=bias_initializer,
            kernel_regularizer=kernel_regularizer, bias_regularizer=bias_regularizer,
            activity_regularizer=activity_regularizer,
            kernel_constraint=constraints.get(kernel_constraint),
            bias_constraint=constraints.get(bias_constraint), **_larq_arguments(kwargs))
        self._init_larq(metrics)


@saves_as(bl.BinaryDepthwiseConv2D)
class QuantDepthwiseConv2D(_LarqLayer, bl.BinaryDepthwiseConv2D):
    """Larq's ``QuantDepthwiseConv2D``: a depthwise convolution of
    ``input_quantizer(x)`` with ``depthwise_quantizer(K)``, plus bias, then activation."""

    _kernels = (("kernel", "depthwise_quantizer", "depthwise_constraint"),)

    def __init__(self, kernel_size, strides=(1, 1), padding: str = "valid",
                 pad_values: float = 0.0, depth_multiplier: int = 1,
                 data_format: str | None = None, dilation_rate=(1, 1), activation: Any = None,
                 use_bias: bool = True, input_quantizer: Any = None,
                 depthwise_quantizer: Any = None, depthwise_initializer: Any = "glorot_uniform",
                 bias_initializer: Any = "zeros", depthwise_regularizer: Any = None,
                 bias_regularizer: Any = None, activity_regularizer: Any = None,
                 depthwise_constraint: Any = None, bias_constraint: Any = None,
                 metrics: Sequence[str] | None = None, **kwargs):
        super().__init__(
            kernel_size, strides=strides, padding=padding, pad_values=pad_values,
            depth_multiplier=depth_multiplier, data_format=data_format,
            dilation_rate=dilation_rate, activation=_activation(activation), use_bias=use_bias,
            input_quantizer=quantizers.get(input_quantizer),
            depthwise_quantizer=quantizers.get_kernel_quantizer(depthwise_quantizer),
            depthwise_initializer=depthwise_initializer, bias_initializer=bias_initializer,
            depthwise_regularizer=depthwise_regularizer, bias_regularizer=bias_regularizer,
            activity_regularizer=activity_regularizer,
            depthwise_constraint=constraints.get(depthwise_constraint),
            bias_constraint=constraints.get(bias_constraint), **_larq_arguments(kwargs))
        self._init_larq(metrics)


@saves_as(bl.BinarySeparableConv2D)
class QuantSeparableConv2D(_LarqLayer, bl.BinarySeparableConv2D):
    """Larq's ``QuantSeparableConv2D``: a depthwise convolution of ``input_quantizer(x)`` with
    ``depthwise_quantizer(D)``, a pointwise one with ``pointwise_quantizer(P)``, bias,
    activation."""

    _kernels = (("depthwise_kernel", "depthwise_quantizer", "depthwise_constraint"),
                ("pointwise_kernel", "pointwise_quantizer", "pointwise_constraint"))

    def __init__(self, filters: int, kernel_size, strides=(1, 1), padding: str = "valid",
                 pad_values: float = 0.0, data_format: str | None = None, dilation_rate=(1, 1),
                 depth_multiplier: int = 1, activation: Any = None, use_bias: bool = True,
                 input_quantizer: Any = None, depthwise_quantizer: Any = None,
                 pointwise_quantizer: Any = None, depthwise_initializer: Any = "glorot_uniform",
                 pointwise_initializer: Any = "glorot_uniform", bias_initializer: Any = "zeros",
                 depthwise_regularizer: Any = None, pointwise_regularizer: Any = None,
                 bias_regularizer: Any = None, activity_regularizer: Any = None,
                 depthwise_constraint: Any = None, pointwise_constraint: Any = None,
                 bias_constraint: Any = None, metrics: Sequence[str] | None = None, **kwargs):
        super().__init__(
            filters, kernel_size, strides=strides, padding=padding, pad_values=pad_values,
            data_format=data_format, dilation_rate=dilation_rate,
            depth_multiplier=depth_multiplier, activation=_activation(activation),
            use_bias=use_bias, input_quantizer=quantizers.get(input_quantizer),
            depthwise_quantizer=quantizers.get_kernel_quantizer(depthwise_quantizer),
            pointwise_quantizer=quantizers.get_kernel_quantizer(pointwise_quantizer),
            depthwise_initializer=depthwise_initializer,
            pointwise_initializer=pointwise_initializer, bias_initializer=bias_initializer,
            depthwise_regularizer=depthwise_regularizer,
            pointwise_regularizer=pointwise_regularizer, bias_regularizer=bias_regularizer,
            activity_regularizer=activity_regularizer,
            depthwise_constraint=constraints.get(depthwise_constraint),
            pointwise_constraint=constraints.get(pointwise_constraint),
            bias_constraint=constraints.get(bias_constraint), **_larq_arguments(kwargs))
        self._init_larq(metrics)
