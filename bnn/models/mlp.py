"""The BinaryNet MLP (Courbariaux et al. 2016)."""

from __future__ import annotations

from typing import Any, Sequence

import keras

from bnn.layers import BinaryDense
from bnn.models.blocks import activation, check_precision, head, norm

__all__ = ["binarynet_mlp"]


def binarynet_mlp(
    precision: str = "binary",
    input_shape: Sequence[int] = (28, 28, 1),
    num_classes: int = 10,
    hidden_units: Sequence[int] = (2048, 2048, 2048),
    input_quantizer: Any = "ste_sign",
    kernel_quantizer: Any = "ste_sign",
    dropout: float = 0.0,
    momentum: float = 0.9,
    epsilon: float = 1e-4,
    float_activation: str = "relu",
    synchronized_bn: bool = False,
    name: str | None = None,
) -> keras.Model:
    """BinaryNet MLP (Courbariaux et al. 2016): Flatten, then per hidden layer
    ``BinaryDense -> BatchNorm``, then ``BinaryDense(num_classes) -> BatchNorm`` (logits).

    The first layer sees real-valued pixels (binary kernel, real inputs).
    """
    check_precision(precision)
    bn = dict(momentum=momentum, epsilon=epsilon, synchronized=synchronized_bn)
    q = dict(kernel_quantizer=kernel_quantizer, precision=precision)
    layers: list = [keras.Input(tuple(input_shape)), keras.layers.Flatten(name="flatten")]
    for i, units in enumerate(hidden_units):
        if dropout and i > 0:
            layers.append(keras.layers.Dropout(dropout, name=f"dropout{i}"))
        layers += [
            BinaryDense(units, input_quantizer=None if i == 0 else input_quantizer,
                        name=f"dense{i}", **q),
            norm(bn, f"bn{i}"),
            *activation(precision, float_activation, f"act{i}"),
        ]
    if dropout:
        layers.append(keras.layers.Dropout(dropout, name="dropout_out"))
    layers += head(num_classes, input_quantizer, q, bn)
    return keras.Sequential(layers, name=name or f"binarynet_mlp_{precision}")
