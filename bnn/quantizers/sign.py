"""Quantizers to two levels: the sign with straight-through and smoother pseudo-gradients, the
magnitude-aware sign, and the {0, 1} step.

Each is a gradient override of one forward function (:func:`bnn.ops.gradients.override`); the
straight-through ones share one rule, :func:`bnn.ops.gradients.clipped_gradient`. Every function
keeps the input's dtype (float16 and bfloat16 in, the same dtype out) and runs under
``tf.function``, XLA and ``tf.distribute``.
"""

from __future__ import annotations

import math

import tensorflow as tf

from bnn.ops.gradients import clipped_gradient, custom_gradient, override
from bnn.ops.sign import all_inside, sign
from bnn.ops.xla import compiled
from bnn.quantizers.base import Quantizer, register

__all__ = ["ste_sign", "approx_sign", "swish_sign", "magnitude_aware_sign", "ste_heaviside",
           "SteSign", "ApproxSign", "SwishSign", "MagnitudeAwareSign", "SteHeaviside"]

_pass_through = override(sign, lambda dy, x: dy, "ste_sign_pass_through")


def ste_sign(x: tf.Tensor, clip_value: float = 1.0) -> tf.Tensor:
    r"""Sign with the straight-through estimator (BinaryNet, Courbariaux et al. 2016).

    Forward: :math:`q(x) = +1` if :math:`x \ge 0`, else :math:`-1`.

    Backward: :math:`\partial q / \partial x = 1` if :math:`|x| \le` ``clip_value``, else 0 (the
    derivative of hard-tanh). ``clip_value=inf`` passes every gradient.

    Speed: the forward pass is one fused (XLA) pass, and two read-only reductions record whether
    every :math:`|x| \le` ``clip_value``; when so (always the case for latent weights kept in
    range by ``WeightClip``), the backward pass hands ``dy`` through without touching ``x``
    again. With ``clip_value=inf`` nothing is checked: the gradient is ``dy``. For 16-bit inputs
    (activations under a mixed-precision policy, rarely all in range) nothing is checked either,
    since TensorFlow's 16-bit reductions on CPUs cost more than the masking pass they could
    spare (docs/speed.md).
    """
    x = tf.convert_to_tensor(x)
    if math.isinf(clip_value) and clip_value > 0:
        return _pass_through(x)
    if x.dtype.size < 4:
        return override(sign, lambda dy, x: clipped_gradient(dy, x, -clip_value, clip_value),
                        "ste_sign")(x)

    @custom_gradient
    def _ste_sign(x):
        clip = tf.cast(clip_value, x.dtype)
        inside = all_inside(x, -clip, clip)

        def grad(dy):
            return tf.cond(inside, lambda: tf.identity(dy),
                           lambda: clipped_gradient(dy, x, -clip_value, clip_value))

        return sign(x), grad

    return _ste_sign(x)


@compiled
def _approx_sign_gradient(dy: tf.Tensor, x: tf.Tensor) -> tf.Tensor:
    """One fused pass: ``dy * max(2 - 2|x|, 0)``."""
    return dy * tf.maximum(2.0 - 2.0 * tf.abs(x), tf.zeros_like(x))


def approx_sign(x: tf.Tensor) -> tf.Tensor:
    r"""Sign with Bi-Real Net's piecewise-quadratic pseudo-gradient (Liu et al. 2018).

    Forward: :math:`q(x) = \mathrm{sign}(x)` (+1 at 0).

    Backward: :math:`\partial q / \partial x = 2 - 2|x|` for :math:`|x| \le 1`, else 0.

    Speed: forward and backward are one fused (XLA) pass each.
    """
    return override(sign, _approx_sign_gradient, "approx_sign")(tf.convert_to_tensor(x))


def swish_sign(x: tf.Tensor, beta: float = 5.0) -> tf.Tensor:
    r"""Sign with the SignSwish pseudo-gradient (BNN+, Darabi et al. 2018).

    Forward: :math:`q(x) = \mathrm{sign}(x)` (+1 at 0).

    Backward: :math:`\partial q / \partial x = \beta\,(2 - \beta x \tanh(\beta x / 2))
    / (1 + \cosh(\beta x))`.
    """

    def gradient(dy, x):
        # 1 / (1 + cosh(z)) = 2 e^-|z| / (1 + e^-|z|)^2: the same values without the inf / inf
        # of cosh's overflow; 0 where e^-|z| underflows (|z| > 104 in float32), as it is there
        b = tf.cast(beta, x.dtype)
        decay = tf.exp(-tf.abs(b * x))
        live = decay > 0
        bx = tf.where(live, b * x, tf.zeros_like(x))
        g = b * (2.0 - bx * tf.tanh(bx / 2.0)) * (2.0 * decay / tf.square(1.0 + decay))
        return dy * tf.where(live, g, tf.zeros_like(g))

    return override(sign, gradient, "swish_sign")(tf.convert_to_tensor(x))


def magnitude_aware_sign(x: tf.Tensor, clip_value: float = 1.0) -> tf.Tensor:
    r"""Sign scaled by the mean magnitude per output channel (Bi-Real Net weights).

    Forward: :math:`q(x) = \mathrm{sign}(x)\cdot\mathrm{mean}(|x|)`, the mean taken over every
    axis but the last (the output channels of a kernel).

    Backward: ``ste_sign``'s mask times the (constant) scale; the scale itself is not
    differentiated through.
    """
    x = tf.convert_to_tensor(x)
    axes = list(range(len(x.shape) - 1))
    # 16-bit inputs are averaged in float32, so that float16 values near 65504 do not overflow
    wide = tf.float32 if x.dtype.size < 4 else x.dtype
    scale = tf.reduce_mean(tf.abs(tf.cast(x, wide)), axis=axes)
    scale = tf.stop_gradient(tf.cast(scale, x.dtype))
    return ste_sign(x, clip_value) * scale


def _step(x: tf.Tensor) -> tf.Tensor:
    return tf.cast(x > 0, x.dtype)


def ste_heaviside(x: tf.Tensor, clip_value: float = 1.0) -> tf.Tensor:
    r"""Binarization to {0, 1} with the straight-through estimator.

    Forward: :math:`q(x) = 1` if :math:`x > 0`, else 0.

    Backward: :math:`\partial q / \partial x = 1` if :math:`|x| \le` ``clip_value``, else 0.
    """
    return override(_step, lambda dy, x: clipped_gradient(dy, x, -clip_value, clip_value),
                    "ste_heaviside")(tf.convert_to_tensor(x))


@register
class SteSign(Quantizer):
    name, function = "ste_sign", staticmethod(ste_sign)
    plus_minus_one = True

    def __init__(self, clip_value: float = 1.0):
        super().__init__(clip_value=float(clip_value))


@register
class ApproxSign(Quantizer):
    name, function = "approx_sign", staticmethod(approx_sign)
    plus_minus_one = True

    def __init__(self):
        super().__init__()


@register
class SwishSign(Quantizer):
    name, function = "swish_sign", staticmethod(swish_sign)
    plus_minus_one = True

    def __init__(self, beta: float = 5.0):
        super().__init__(beta=float(beta))


@register
class MagnitudeAwareSign(Quantizer):
    name, function = "magnitude_aware_sign", staticmethod(magnitude_aware_sign)

    def __init__(self, clip_value: float = 1.0):
        super().__init__(clip_value=float(clip_value))


@register
class SteHeaviside(Quantizer):
    name, function = "ste_heaviside", staticmethod(ste_heaviside)

    def __init__(self, clip_value: float = 1.0):
        super().__init__(clip_value=float(clip_value))
