"""Architectures from one spec, in two precisions: the binary model and its float twin.

Every builder takes ``precision="binary" | "float"``. Both twins have the same layers and the
same parameter shapes; the float twin turns the quantizers off and puts a real activation
(``float_activation``, ReLU by default) where the binary model binarizes the next layer's inputs.
Models output logits (the last batch normalization), for ``from_logits=True`` losses.
``synchronized_bn=True`` computes batch-norm statistics over all replicas of a ``tf.distribute``
strategy, so a distributed step equals a single-device step on the global batch.

:func:`build` makes any of them by name (:data:`bnn.catalog.MODEL_OPTIONS` lists their options);
:mod:`~bnn.models.summary` counts a model's parameters, packed memory and multiply-accumulates.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import keras

from bnn.errors import ModelFileError
from bnn.models.keras_file import keras_file
from bnn.models.mlp import binarynet_mlp
from bnn.models.resnet import binary_resnet, reactnet_resnet
from bnn.models.vgg import vgg_small

__all__ = ["binarynet_mlp", "vgg_small", "binary_resnet", "reactnet_resnet", "keras_file",
           "ModelFileError", "build", "names", "option_names", "option_defaults"]

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
