"""BinaryNet's VGG-small for CIFAR-10."""

from __future__ import annotations

from typing import Any, Sequence

import keras

from bnn.layers import BinaryConv2D, BinaryDense, MaxPooling2D
from bnn.models.blocks import activation, check_precision, head, norm

__all__ = ["vgg_small"]


def vgg_small(
    precision: str = "binary",
    input_shape: Sequence[int] = (32, 32, 3),
    num_classes: int = 10,
    filters: Sequence[int] = (128, 128, 256, 256, 512, 512),
    dense_units: Sequence[int] = (1024, 1024),
    input_quantizer: Any = "ste_sign",
    kernel_quantizer: Any = "ste_sign",
    momentum: float = 0.9,
    epsilon: float = 1e-4,
    float_activation: str = "relu",
    synchronized_bn: bool = False,
    real_first_layer: bool = False,
    name: str | None = None,
) -> keras.Model:
    """BinaryNet VGG-small for CIFAR-10:
    ``2x128C3 - MP2 - 2x256C3 - MP2 - 2x512C3 - MP2 - 1024FC - 1024FC - 10``, batch norm after
    every layer (after the pooling where there is one), real-valued input to the first layer.

    Binary convolutions pad with +1 (``pad_values=1``) so every operand is ±1 and the model
    exports to pure xor-popcount. ``real_first_layer=True`` keeps the first convolution's kernel
    real-valued (as XNOR-Net, Bi-Real Net and ReActNet do): it holds a tiny share of the
    parameters and products (3 input channels) and is the layer that binarizing hurts most.
    """
    check_precision(precision)
    bn = dict(momentum=momentum, epsilon=epsilon, synchronized=synchronized_bn)
    q = dict(kernel_quantizer=kernel_quantizer, precision=precision)
    first = dict(q, kernel_quantizer=None, kernel_constraint=None) if real_first_layer else q
    layers: list = [keras.Input(tuple(input_shape))]
    for i, f in enumerate(filters):
        layers.append(BinaryConv2D(f, 3, padding="same", pad_values=1.0,
                                   input_quantizer=None if i == 0 else input_quantizer,
                                   name=f"conv{i}", **(first if i == 0 else q)))
        if i % 2 == 1:
            layers.append(MaxPooling2D(2, name=f"pool{i}"))
        layers += [norm(bn, f"bn_conv{i}"),
                   *activation(precision, float_activation, f"act_conv{i}")]
    layers.append(keras.layers.Flatten(name="flatten"))
    for i, units in enumerate(dense_units):
        layers += [BinaryDense(units, input_quantizer=input_quantizer, name=f"dense{i}", **q),
                   norm(bn, f"bn_dense{i}"),
                   *activation(precision, float_activation, f"act_dense{i}")]
    layers += head(num_classes, input_quantizer, q, bn)
    return keras.Sequential(layers, name=name or f"vgg_small_{precision}")
