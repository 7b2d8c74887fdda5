"""The per-channel activations of ReActNet-style binary ResNets (Liu et al. 2020): ``RSign``, a
sign with a learnable threshold, and ``RPReLU``, a PReLU with learnable shifts. Their math is
fused (:mod:`bnn.ops.fused`)."""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

from bnn import quantizers as quantizers_lib
from bnn.layers.base import check_precision
from bnn.ops import fused

__all__ = ["RSign", "RPReLU"]


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
        check_precision(precision, "RSign")
        self.quantizer = quantizers_lib.get(quantizer)
        self.precision = precision
        self.float_activation = float_activation
        self._float_op = (None if float_activation is None else
                          fused.shifted_activation(keras.activations.get(float_activation)))

    def build(self, input_shape):
        self.threshold = self.add_weight(name="threshold", shape=(int(input_shape[-1]),),
                                         initializer="zeros")

    def call(self, inputs):
        t = ops.cast(self.threshold, inputs.dtype)
        if self.precision == "float" and self._float_op is not None:
            return self._float_op(inputs, t)
        shifted = fused.channel_shift(inputs, t)
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
        return fused.rprelu(*(ops.cast(v, xs[0].dtype) for v in (self.gamma, self.beta, self.zeta)),
                            *xs)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "slope": self.slope}
