"""A saved Keras 3 model as an architecture to train, binary or as its float twin."""

from __future__ import annotations

import os
from typing import Any, Sequence

import keras

from bnn.errors import ModelFileError
from bnn.layers import WeightClip
from bnn.models.blocks import check_precision

__all__ = ["keras_file"]


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
    check_precision(precision)
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
