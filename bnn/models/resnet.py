"""Binary ResNets with real-valued shortcuts: Bi-Real Net's and ReActNet's."""

from __future__ import annotations

from typing import Any, Sequence

import keras

from bnn.layers import BinaryConv2D, RPReLU, RSign
from bnn.models.blocks import (activation, check_precision, norm, pooled_classifier,
                               residual_blocks, stem)

__all__ = ["binary_resnet", "reactnet_resnet"]


def binary_resnet(
    precision: str = "binary",
    input_shape: Sequence[int] = (32, 32, 3),
    num_classes: int = 10,
    stages: Sequence[int] = (64, 128, 256, 512),
    blocks_per_stage: int = 2,
    input_quantizer: Any = "ste_sign",
    kernel_quantizer: Any = "ste_sign",
    momentum: float = 0.9,
    epsilon: float = 1e-4,
    float_activation: str = "relu",
    synchronized_bn: bool = False,
    name: str | None = None,
) -> keras.Model:
    """Bi-Real-style binary ResNet: every binary 3x3 convolution is wrapped by a real-valued
    shortcut (``x + BN(BinaryConv(x))``). The stem, the downsampling shortcuts (average pool +
    1x1 convolution) and the classifier stay real-valued, as in Bi-Real Net."""
    check_precision(precision)
    bn = dict(momentum=momentum, epsilon=epsilon, synchronized=synchronized_bn)
    inputs, x = stem(input_shape, stages[0], bn)
    for block, width, stride in residual_blocks(stages, blocks_per_stage):
        shortcut = x
        if stride != 1 or shortcut.shape[-1] != width:
            shortcut = keras.layers.AveragePooling2D(stride, name=f"{block}_pool")(shortcut)
            shortcut = keras.layers.Conv2D(width, 1, use_bias=False,
                                           name=f"{block}_proj")(shortcut)
            shortcut = norm(bn, f"{block}_proj_bn")(shortcut)
        y = BinaryConv2D(width, 3, strides=stride, padding="same", pad_values=1.0,
                         input_quantizer=input_quantizer, kernel_quantizer=kernel_quantizer,
                         precision=precision, name=f"{block}_conv")(x)
        y = norm(bn, f"{block}_bn")(y)
        for layer in activation(precision, float_activation, f"{block}_act"):
            y = layer(y)
        x = keras.layers.Add(name=f"{block}_add")([shortcut, y])
    return pooled_classifier(inputs, x, num_classes, name or f"binary_resnet_{precision}")


def reactnet_resnet(
    precision: str = "binary",
    input_shape: Sequence[int] = (32, 32, 3),
    num_classes: int = 10,
    stages: Sequence[int] = (64, 128, 256),
    blocks_per_stage: int = 2,
    input_quantizer: Any = "approx_sign",
    kernel_quantizer: Any = "ste_sign",
    learnable_threshold: bool = True,
    rprelu: bool = True,
    momentum: float = 0.9,
    epsilon: float = 1e-4,
    float_activation: str = "relu",
    synchronized_bn: bool = False,
    name: str | None = None,
) -> keras.Model:
    """ReActNet-style binary ResNet for small images (Liu et al. 2020, on Bi-Real Net's shortcuts).

    ``stem: Conv3x3(stages[0]) - BN``, then for each stage ``s`` of width ``stages[s]``,
    ``blocks_per_stage`` blocks, each one binary convolution with its own real-valued shortcut::

        y = BN(BinaryConv3x3(sign(x - t)))  +  shortcut(x)  ->  RPReLU

    The first block of every stage after the first has stride 2; its shortcut is real-valued
    downsampling (``AvgPool2 - Conv1x1 - BN`` where the width changes, ``AvgPool2`` alone where it
    does not); other shortcuts are the identity. Head: global average pooling and a real dense
    layer to ``num_classes`` logits. Stem, shortcuts and head are real-valued in both twins.

    ``learnable_threshold``: the sign of each block's input has a learnable threshold ``t`` per
    channel (:class:`bnn.layers.RSign`; the convolution's ``input_quantizer`` takes the sign, so
    its product runs by xor-popcount). ``rprelu``: :class:`bnn.layers.RPReLU` after each
    addition; without it there is no activation there (Bi-Real Net). The float twin is the same
    network with the quantizers off and ``float_activation`` where the binary model takes the
    sign, ``conv(relu(x - t))``: a pre-activation ResNet. RSign's shift and RPReLU stay, so both
    twins have the same parameters.
    """
    check_precision(precision)
    bn = dict(momentum=momentum, epsilon=epsilon, synchronized=synchronized_bn)
    inputs, x = stem(input_shape, stages[0], bn)
    for block, width, stride in residual_blocks(stages, blocks_per_stage):
        shortcut = x
        if stride != 1:
            shortcut = keras.layers.AveragePooling2D(stride, name=f"{block}_pool")(shortcut)
        if shortcut.shape[-1] != width:
            shortcut = keras.layers.Conv2D(width, 1, use_bias=False,
                                           name=f"{block}_proj")(shortcut)
            shortcut = norm(bn, f"{block}_proj_bn")(shortcut)
        if learnable_threshold:  # the float twin's activation fused with the shift
            y = RSign(None, precision=precision, float_activation=float_activation,
                      name=f"{block}_rsign")(x)
        else:
            y = x
            for layer in activation(precision, float_activation, f"{block}_act"):
                y = layer(y)
        y = BinaryConv2D(width, 3, strides=stride, padding="same", pad_values=1.0,
                         input_quantizer=input_quantizer, kernel_quantizer=kernel_quantizer,
                         precision=precision, name=f"{block}_conv")(y)
        y = norm(bn, f"{block}_bn")(y)
        if rprelu:  # RPReLU(shortcut + y), the addition fused into its pass
            x = RPReLU(name=f"{block}_rprelu")([shortcut, y])
        else:
            x = keras.layers.Add(name=f"{block}_add")([shortcut, y])
    return pooled_classifier(inputs, x, num_classes, name or f"reactnet_resnet_{precision}")
