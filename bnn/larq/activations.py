"""Larq's ``larq.activations``: ``hard_tanh`` and ``leaky_tanh``, by name too
(``activation="leaky_tanh"``, ``keras.layers.Activation("hard_tanh")``)."""

from __future__ import annotations

import keras
from keras import ops

__all__ = ["hard_tanh", "leaky_tanh"]

#: ``clip(x, -1, 1)``: Keras 3's own ``hard_tanh``, which is Larq's (so it saves as Keras').
hard_tanh = keras.activations.hard_tanh


@keras.saving.register_keras_serializable(package="bnn.larq")
def leaky_tanh(x, alpha: float = 0.2):
    r"""Hard tanh with slope ``alpha`` outside ``[-1, 1]`` instead of 0, as leaky ReLU:

    .. math::
        f(x) = \mathrm{clip}(x, -1, 1) + \alpha\,(\max(x, 1) - 1) + \alpha\,(\min(x, -1) + 1)

    Its gradient is 1 inside ``[-1, 1]`` and ``alpha`` outside (``1 + alpha`` at ±1, as
    Larq's)."""
    return (ops.clip(x, -1.0, 1.0) + alpha * (ops.maximum(x, 1.0) - 1.0)
            + alpha * (ops.minimum(x, -1.0) + 1.0))
