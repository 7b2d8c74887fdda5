"""Pieces the architectures share: batch norm, the float twin's activation, the binary head,
the real-valued stem, residual block names and strides, and the pooled classifier."""

from __future__ import annotations

from typing import Any, Sequence

import keras

from bnn.layers import BatchNormalization, BinaryDense
from bnn.layers.base import check_precision as layer_check_precision

__all__ = ["check_precision", "norm", "stem", "residual_blocks", "pooled_classifier",
           "activation", "head"]


def check_precision(precision: str) -> None:
    """Raises ``ValueError`` unless ``precision`` is ``"binary"`` or ``"float"``."""
    layer_check_precision(precision, "model")


def norm(bn: dict, name: str, scale: bool = True):
    return BatchNormalization(**bn, scale=scale, name=name)


def stem(input_shape: Sequence[int], width: int, bn: dict):
    """``(inputs, x)``: the input and a real-valued 3x3 convolution with batch norm."""
    inputs = keras.Input(tuple(input_shape))
    x = keras.layers.Conv2D(width, 3, padding="same", use_bias=False, name="stem")(inputs)
    return inputs, norm(bn, "stem_bn")(x)


def residual_blocks(stages: Sequence[int], blocks_per_stage: int):
    """``(name, width, stride)`` of each residual block: ``s<stage>b<block>``, stride 2 in the
    first block of every stage after the first."""
    for s, width in enumerate(stages):
        for b in range(blocks_per_stage):
            yield f"s{s}b{b}", width, 2 if (b == 0 and s > 0) else 1


def pooled_classifier(inputs, x, num_classes: int, name: str) -> keras.Model:
    """Global average pooling and a real dense layer to ``num_classes`` logits."""
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    outputs = keras.layers.Dense(num_classes, name="classifier")(x)
    return keras.Model(inputs, outputs, name=name)


def activation(precision: str, float_activation: str, name: str) -> list:
    """Nothing for the binary model (the next layer's input quantizer binarizes), a real
    activation for the float twin."""
    return [] if precision == "binary" else [keras.layers.Activation(float_activation, name=name)]


def head(num_classes: int, input_quantizer: Any, q: dict, bn: dict) -> list:
    """The classifier: a binary dense layer to ``num_classes`` and a batch norm without scale,
    whose outputs are the logits."""
    return [BinaryDense(num_classes, input_quantizer=input_quantizer, name="dense_out", **q),
            norm(bn, "bn_out", scale=False)]
