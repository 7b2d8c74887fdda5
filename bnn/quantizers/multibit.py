"""Quantizers to more than two levels -- ternary and k-bit uniform -- and the identity that tags
values already quantized.

Each is a gradient override of one forward function (:func:`bnn.ops.gradients.override`), the
straight-through ones with :func:`bnn.ops.gradients.clipped_gradient`.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from bnn.catalog import DOREFA_MODES
from bnn.ops.gradients import clipped_gradient, override
from bnn.quantizers.base import Quantizer, register

__all__ = ["ste_tern", "dorefa", "no_op", "SteTern", "DoReFa", "NoOp"]


def ste_tern(
    x: tf.Tensor, threshold_value: float = 0.05, ternary_weight_networks: bool = False,
    clip_value: float = 1.0, inclusive: bool = False,
) -> tf.Tensor:
    r"""Ternarization to {-1, 0, +1} with the straight-through estimator.

    Forward: :math:`q(x) = \mathrm{sign}(x)` if :math:`|x| > \Delta`, else 0, where
    :math:`\Delta` is ``threshold_value``, or :math:`0.7 \sum |x_i| / n` over the whole tensor
    when ``ternary_weight_networks`` (Li et al. 2016). ``inclusive=True`` quantizes
    :math:`|x| = \Delta` to :math:`\mathrm{sign}(x)` as well (Larq's rule: :math:`|x| \ge
    \Delta`; 0 stays 0); the default follows the paper, 0 there.

    Backward: :math:`\partial q / \partial x = 1` if :math:`|x| \le` ``clip_value``, else 0.
    """

    def forward(x):
        if ternary_weight_networks:
            delta = 0.7 * tf.reduce_sum(tf.abs(x)) / tf.cast(tf.size(x), x.dtype)
        else:
            delta = tf.cast(threshold_value, x.dtype)
        outside = tf.abs(x) >= delta if inclusive else tf.abs(x) > delta
        return tf.sign(x) * tf.cast(outside, x.dtype)

    return override(forward, lambda dy, x: clipped_gradient(dy, x, -clip_value, clip_value),
                    "ste_tern")(tf.convert_to_tensor(x))


def dorefa(x: tf.Tensor, k_bit: int = 2, mode: str = "activations") -> tf.Tensor:
    r"""k-bit uniform quantization (DoReFa-Net, Zhou et al. 2016), with :math:`n = 2^k - 1`.

    ``mode="activations"`` quantizes [0, 1]:

    * forward :math:`q(x) = \mathrm{round}(n\,\mathrm{clip}(x, 0, 1)) / n`;
    * backward :math:`\partial q / \partial x = 1` if :math:`0 \le x \le 1`, else 0.

    ``mode="weights"`` quantizes a whole kernel to [-1, 1] after soft-limiting it with tanh and
    scaling it so that its largest magnitude reaches ±1 (section 2.3 of the paper):

    * forward :math:`q(w) = 2\,\mathrm{round}(n\,u) / n - 1` with
      :math:`u = \tanh(w) / (2 \max|\tanh(w)|) + 1/2` (:math:`u = 1/2` for an all-zero kernel);
    * backward: the rounding passes the gradient unchanged and :math:`\max|\tanh(w)|` is
      held constant, so :math:`\partial q / \partial w = (1 - \tanh^2 w) / \max|\tanh(w)|`.
    """
    if mode not in DOREFA_MODES:
        raise ValueError(f"dorefa mode must be one of {DOREFA_MODES}, got {mode!r}")
    x = tf.convert_to_tensor(x)
    levels = float(2**k_bit - 1)

    def rounded(u):
        return tf.round(u * levels) / levels

    if mode == "weights":
        limited = tf.tanh(x)
        peak = tf.stop_gradient(tf.reduce_max(tf.abs(limited)))
        u = tf.math.divide_no_nan(limited, 2.0 * peak) + 0.5
        return 2.0 * override(rounded, lambda dy, u: dy, "dorefa_round")(u) - 1.0
    return override(lambda x: rounded(tf.clip_by_value(x, tf.zeros_like(x), tf.ones_like(x))),
                    lambda dy, x: clipped_gradient(dy, x, 0.0, 1.0), "dorefa")(x)


def no_op(x: tf.Tensor) -> tf.Tensor:
    r"""Identity in both passes: :math:`q(x) = x`, :math:`\partial q / \partial x = 1`.

    As a kernel quantizer it marks a kernel whose stored values are themselves the quantized
    weights (e.g. ±1 weights that :class:`bnn.optimizers.Bop` flips).
    """
    return tf.identity(tf.convert_to_tensor(x))


@register
class SteTern(Quantizer):
    name, function, precision = "ste_tern", staticmethod(ste_tern), 2

    def __init__(self, threshold_value: float = 0.05, ternary_weight_networks: bool = False,
                 clip_value: float = 1.0, inclusive: bool = False):
        if float(threshold_value) < 0:
            raise ValueError(f"ste_tern threshold_value must be >= 0, got {threshold_value!r}")
        super().__init__(threshold_value=float(threshold_value),
                         ternary_weight_networks=bool(ternary_weight_networks),
                         clip_value=float(clip_value), inclusive=bool(inclusive))


@register
class DoReFa(Quantizer):
    name, function = "dorefa", staticmethod(dorefa)

    def __init__(self, k_bit: int = 2, mode: str = "activations"):
        if int(k_bit) < 1:
            raise ValueError(f"dorefa k_bit must be >= 1, got {k_bit!r}")
        if mode not in DOREFA_MODES:
            raise ValueError(f"dorefa mode must be one of {DOREFA_MODES}, got {mode!r}")
        super().__init__(k_bit=int(k_bit), mode=mode)
        self.precision = int(k_bit)


@register
class NoOp(Quantizer):
    """The identity, tagged with the ``precision`` (bits) of the values it passes through."""

    name, function = "no_op", staticmethod(no_op)

    def __init__(self, precision: int = 1):
        if int(precision) < 1:
            raise ValueError(f"no_op precision must be >= 1, got {precision!r}")
        super().__init__()
        self.precision = int(precision)

    def get_config(self) -> dict[str, Any]:
        return {"precision": self.precision}
