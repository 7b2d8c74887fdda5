"""The one walk over a model's layers: nested models flattened, in order."""

from __future__ import annotations

import keras

__all__ = ["all_layers", "leaf_layers", "binary_kernel_layers"]


def all_layers(model: keras.Model) -> list:
    """Every layer of ``model`` in order, each nested model followed by its own layers."""
    found = []
    for layer in getattr(model, "layers", []):
        found.append(layer)
        found.extend(all_layers(layer))
    return found


def leaf_layers(model: keras.Model) -> list:
    """The layers of ``model`` in order, each nested model replaced by its own layers."""
    return [layer for layer in all_layers(model) if not isinstance(layer, keras.Model)]


def binary_kernel_layers(model: keras.Model) -> list:
    """The built layers of ``model`` (nested models searched too) that binarize kernels in the
    forward pass: those whose ``binary_kernels()`` (see :mod:`bnn.layers.base`) is not empty."""
    return [layer for layer in all_layers(model)
            if callable(getattr(layer, "binary_kernels", None)) and layer.built
            and layer.binary_kernels()]
