"""Architectures from one spec, in two precisions: the binary model and its float twin.

Every builder takes ``precision="binary" | "float"``. Both twins have the same layers and the
same parameter shapes; the float twin turns the quantizers off and puts a real activation
(``float_activation``, ReLU by default) where the binary model binarizes the next layer's inputs.
Models output logits (the last batch normalization), for ``from_logits=True`` losses.
``synchronized_bn=True`` computes batch-norm statistics over all replicas of a ``tf.distribute``
strategy, so a distributed step equals a single-device step on the global batch.
"""

from __future__ import annotations

import inspect
import os
from typing import Any, Callable, Sequence

import keras

from bnn.constraints import WeightClip
from bnn.errors import ModelFileError
from bnn.layers import PRECISIONS, BinaryConv2D, BinaryDense, RPReLU, RSign
from bnn.normalization import BatchNormalization
from bnn.pooling import MaxPooling2D

__all__ = ["binarynet_mlp", "vgg_small", "binary_resnet", "reactnet_resnet", "keras_file",
           "ModelFileError", "build", "names", "option_names", "option_defaults"]


def _check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")


def _norm(bn: dict, name: str, scale: bool = True):
    return BatchNormalization(**bn, scale=scale, name=name)


def _stem(input_shape: Sequence[int], width: int, bn: dict):
    """``(inputs, x)``: the input and a real-valued 3x3 convolution with batch norm."""
    inputs = keras.Input(tuple(input_shape))
    x = keras.layers.Conv2D(width, 3, padding="same", use_bias=False, name="stem")(inputs)
    return inputs, _norm(bn, "stem_bn")(x)


def _blocks(stages: Sequence[int], blocks_per_stage: int):
    """``(name, width, stride)`` of each residual block: ``s<stage>b<block>``, stride 2 in the
    first block of every stage after the first."""
    for s, width in enumerate(stages):
        for b in range(blocks_per_stage):
            yield f"s{s}b{b}", width, 2 if (b == 0 and s > 0) else 1


def _pooled_classifier(inputs, x, num_classes: int, name: str) -> keras.Model:
    """Global average pooling and a real dense layer to ``num_classes`` logits."""
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    outputs = keras.layers.Dense(num_classes, name="classifier")(x)
    return keras.Model(inputs, outputs, name=name)


def _activation(precision: str, float_activation: str, name: str) -> list:
    """Nothing for the binary model (the next layer's input quantizer binarizes), a real
    activation for the float twin."""
    return [] if precision == "binary" else [keras.layers.Activation(float_activation, name=name)]


def _head(num_classes: int, input_quantizer: Any, q: dict, bn: dict) -> list:
    """The classifier: a binary dense layer to ``num_classes`` and a batch norm without scale,
    whose outputs are the logits."""
    return [BinaryDense(num_classes, input_quantizer=input_quantizer, name="dense_out", **q),
            _norm(bn, "bn_out", scale=False)]


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
    _check_precision(precision)
    bn = dict(momentum=momentum, epsilon=epsilon, synchronized=synchronized_bn)
    q = dict(kernel_quantizer=kernel_quantizer, precision=precision)
    layers: list = [keras.Input(tuple(input_shape)), keras.layers.Flatten(name="flatten")]
    for i, units in enumerate(hidden_units):
        if dropout and i > 0:
            layers.append(keras.layers.Dropout(dropout, name=f"dropout{i}"))
        layers += [
            BinaryDense(units, input_quantizer=None if i == 0 else input_quantizer,
                        name=f"dense{i}", **q),
            _norm(bn, f"bn{i}"),
            *_activation(precision, float_activation, f"act{i}"),
        ]
    if dropout:
        layers.append(keras.layers.Dropout(dropout, name="dropout_out"))
    layers += _head(num_classes, input_quantizer, q, bn)
    return keras.Sequential(layers, name=name or f"binarynet_mlp_{precision}")


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
    _check_precision(precision)
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
        layers += [_norm(bn, f"bn_conv{i}"),
                   *_activation(precision, float_activation, f"act_conv{i}")]
    layers.append(keras.layers.Flatten(name="flatten"))
    for i, units in enumerate(dense_units):
        layers += [BinaryDense(units, input_quantizer=input_quantizer, name=f"dense{i}", **q),
                   _norm(bn, f"bn_dense{i}"),
                   *_activation(precision, float_activation, f"act_dense{i}")]
    layers += _head(num_classes, input_quantizer, q, bn)
    return keras.Sequential(layers, name=name or f"vgg_small_{precision}")


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
    _check_precision(precision)
    bn = dict(momentum=momentum, epsilon=epsilon, synchronized=synchronized_bn)
    inputs, x = _stem(input_shape, stages[0], bn)
    for block, width, stride in _blocks(stages, blocks_per_stage):
        shortcut = x
        if stride != 1 or shortcut.shape[-1] != width:
            shortcut = keras.layers.AveragePooling2D(stride, name=f"{block}_pool")(shortcut)
            shortcut = keras.layers.Conv2D(width, 1, use_bias=False,
                                           name=f"{block}_proj")(shortcut)
            shortcut = _norm(bn, f"{block}_proj_bn")(shortcut)
        y = BinaryConv2D(width, 3, strides=stride, padding="same", pad_values=1.0,
                         input_quantizer=input_quantizer, kernel_quantizer=kernel_quantizer,
                         precision=precision, name=f"{block}_conv")(x)
        y = _norm(bn, f"{block}_bn")(y)
        for layer in _activation(precision, float_activation, f"{block}_act"):
            y = layer(y)
        x = keras.layers.Add(name=f"{block}_add")([shortcut, y])
    return _pooled_classifier(inputs, x, num_classes, name or f"binary_resnet_{precision}")


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
    _check_precision(precision)
    bn = dict(momentum=momentum, epsilon=epsilon, synchronized=synchronized_bn)
    inputs, x = _stem(input_shape, stages[0], bn)
    for block, width, stride in _blocks(stages, blocks_per_stage):
        shortcut = x
        if stride != 1:
            shortcut = keras.layers.AveragePooling2D(stride, name=f"{block}_pool")(shortcut)
        if shortcut.shape[-1] != width:
            shortcut = keras.layers.Conv2D(width, 1, use_bias=False,
                                           name=f"{block}_proj")(shortcut)
            shortcut = _norm(bn, f"{block}_proj_bn")(shortcut)
        if learnable_threshold:  # the float twin's activation fused with the shift
            y = RSign(None, precision=precision, float_activation=float_activation,
                      name=f"{block}_rsign")(x)
        else:
            y = x
            for layer in _activation(precision, float_activation, f"{block}_act"):
                y = layer(y)
        y = BinaryConv2D(width, 3, strides=stride, padding="same", pad_values=1.0,
                         input_quantizer=input_quantizer, kernel_quantizer=kernel_quantizer,
                         precision=precision, name=f"{block}_conv")(y)
        y = _norm(bn, f"{block}_bn")(y)
        if rprelu:  # RPReLU(shortcut + y), the addition fused into its pass
            x = RPReLU(name=f"{block}_rprelu")([shortcut, y])
        else:
            x = keras.layers.Add(name=f"{block}_add")([shortcut, y])
    return _pooled_classifier(inputs, x, num_classes, name or f"reactnet_resnet_{precision}")


def _is_softmax(activation: Any) -> bool:
    return getattr(activation, "__name__", None) == "softmax"


def _logits(model: keras.Model) -> keras.Model:
    """``model`` without a final softmax: a last ``Activation("softmax")`` layer is dropped, a
    last layer's ``activation="softmax"`` becomes linear."""
    last = model.layers[-1]
    if isinstance(last, keras.layers.Activation) and _is_softmax(last.activation):
        if isinstance(model, keras.Sequential):
            return keras.Sequential([keras.Input(batch_shape=model.inputs[0].shape),
                                     *model.layers[:-1]], name=model.name)
        return keras.Model(model.inputs, last.input, name=model.name)
    if _is_softmax(getattr(last, "activation", None)):
        last.activation = keras.activations.linear
    return model


def _twin_layer(layer, precision: str, synchronized_bn: bool):
    """A copy of ``layer`` (without weights) in ``precision``, with synchronized batch norm."""
    config = layer.get_config()
    if isinstance(layer, keras.layers.BatchNormalization):
        config["synchronized"] = synchronized_bn
    if getattr(layer, "quantized", None) is not None and precision == "float":
        config["precision"] = "float"
        for key in ("kernel_constraint", "depthwise_constraint", "pointwise_constraint"):
            if isinstance(getattr(layer, key, None), WeightClip):
                config[key] = None
    return type(layer).from_config(config)


def keras_file(
    precision: str = "binary",
    path: str = "",
    input_shape: Sequence[int] = (28, 28, 1),
    num_classes: int = 10,
    synchronized_bn: bool = False,
    name: str | None = None,
) -> keras.Model:
    """The model saved in the Keras 3 file ``path`` (a ``.keras`` file from ``model.save``, from
    ``bnn import-larq``, or a run's ``model.keras``), ready to train further.

    * ``precision="binary"``: the model as saved, with its weights. ``"float"``: its float twin,
      every binary layer at ``precision="float"`` without its ``WeightClip``, starting from the
      same latent weights.
    * A final softmax (a last ``Activation("softmax")`` layer, or ``activation="softmax"`` on the
      last layer) is removed: bnn's losses take logits, and the softmax does not change the
      predicted class.
    * ``input_shape`` and ``num_classes`` (the trainer fills them in from the dataset) must be
      the model's input shape and output size.

    Raises:
        ModelFileError: for a missing or unreadable file, or a model whose input shape or
            output size does not fit the dataset.
    """
    _check_precision(precision)
    if not path:
        raise ModelFileError("model keras_file: options.path is empty; set model.options.path "
                             "to the .keras file to train")
    if not str(path).endswith(".keras") or not os.path.isfile(path):
        raise ModelFileError(f"{path}: no such .keras file; set model.options.path to a Keras 3 "
                             ".keras file (bnn import-larq converts models saved by Larq)")
    try:
        model = keras.saving.load_model(path, compile=False)
    except Exception as error:  # noqa: BLE001 - Keras raises many types for bad files
        message = str(error).splitlines()[0][:160] if str(error) else ""
        raise ModelFileError(f"{path}: cannot load the Keras model ({type(error).__name__}: "
                             f"{message}); give a .keras file saved by Keras 3 after import "
                             "bnn") from None
    shape = tuple(model.inputs[0].shape[1:]) if len(model.inputs) == 1 else None
    if shape != tuple(input_shape):
        raise ModelFileError(f"{path}: the model takes inputs of shape {shape}, the dataset "
                             f"has {tuple(input_shape)}; train it on data of its input shape")
    model = _logits(model)
    if tuple(model.outputs[0].shape[1:]) != (num_classes,) or len(model.outputs) != 1:
        raise ModelFileError(f"{path}: the model outputs {tuple(model.outputs[0].shape[1:])} "
                             f"values, the dataset has {num_classes} classes; train it on a "
                             "dataset with as many classes as outputs")
    if precision == "binary" and not synchronized_bn and name is None:
        return model
    twin = keras.models.clone_model(
        model, clone_function=lambda layer: _twin_layer(layer, precision, synchronized_bn))
    twin.set_weights(model.get_weights())
    twin.name = name or f"{model.name}_{precision}"
    return twin


_BUILDERS: dict[str, Callable[..., keras.Model]] = {
    "binarynet_mlp": binarynet_mlp,
    "vgg_small": vgg_small,
    "binary_resnet": binary_resnet,
    "reactnet_resnet": reactnet_resnet,
    "keras_file": keras_file,
}


def names() -> list[str]:
    """Names accepted by :func:`build`."""
    return sorted(_BUILDERS)


def option_names(name: str) -> list[str]:
    """The keyword options that architecture ``name`` accepts (besides ``precision``)."""
    if name not in _BUILDERS:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(names())}")
    return sorted(set(inspect.signature(_BUILDERS[name]).parameters) - {"precision", "name"})


def option_defaults(name: str) -> dict[str, Any]:
    """``{option: default}`` for the keyword options of architecture ``name``."""
    parameters = inspect.signature(_BUILDERS[name]).parameters if name in _BUILDERS else {}
    return {option: parameters[option].default for option in option_names(name)}


def build(name: str, precision: str = "binary", **options: Any) -> keras.Model:
    """Builds architecture ``name`` in ``precision`` with keyword ``options`` of its builder.

    Raises:
        ValueError: for an unknown architecture or option, naming what is allowed.
    """
    if name not in _BUILDERS:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(names())}")
    allowed = option_names(name)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"unknown option(s) {', '.join(unknown)} for model {name!r}; "
                         f"allowed: {', '.join(allowed)}")
    return _BUILDERS[name](precision=precision, **options)
