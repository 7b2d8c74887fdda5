"""The names ``import larq`` registers with Keras, registered with Keras 3 by ``import bnn.larq``.

Larq puts each of its classes and a few aliases (``"weight_clip"``, ``"ste_sign"``,
``"flip_ratio"``, ...) in tf-keras' custom objects, so layer arguments such as
``kernel_constraint="weight_clip"``, ``tf.keras.optimizers.get("Bop")`` and saved configs naming
them resolve. Keras 3 reads its custom objects (:data:`CUSTOM_OBJECTS` go there) when it
deserializes a config and in ``keras.optimizers.get``; but ``keras.constraints.get``,
``keras.activations.get`` and ``keras.metrics.get``, which layer arguments and ``compile`` call,
look a string up only in a table of their own, so each such name also goes in that table
(:data:`LOOKUPS`). A name Keras already knows keeps its meaning (Keras 3's ``"hard_tanh"`` is
Larq's).

Larq's quantizer names, which its ``tf.keras.activations.get`` turns into a quantizer class
rather than an activation, are activations here: ``Activation("ste_sign")`` applies
:func:`bnn.quantizers.ste_sign` with Larq's defaults, and saves as bnn's function.
"""

from __future__ import annotations

from typing import Any, Callable

import keras

from bnn import quantizers as bq
from bnn.larq import activations, constraints, layers, metrics, optimizers, quantizers

__all__ = ["CUSTOM_OBJECTS", "LOOKUPS"]

_QUANTIZER_ALIASES = ("ste_sign", "approx_sign", "swish_sign", "magnitude_aware_sign",
                      "ste_heaviside", "ste_tern", "dorefa_quantizer")
_QUANTIZER_CLASSES = (quantizers.SteSign, quantizers.ApproxSign, quantizers.SwishSign,
                      quantizers.MagnitudeAwareSign, quantizers.SteHeaviside, quantizers.SteTern,
                      quantizers.DoReFa, quantizers.NoOp)
_LAYERS = (layers.QuantDense, layers.QuantConv2D, layers.QuantDepthwiseConv2D,
           layers.QuantSeparableConv2D)

#: Every name Larq registers with Keras (but its layers bnn has not: ``layers.UNSUPPORTED``)
#: -> the ``bnn.larq`` object, by the class's Larq name (``__qualname__``; its ``__name__`` is
#: the bnn class it saves as).
CUSTOM_OBJECTS: dict[str, Any] = {
    **{cls.__qualname__: cls for cls in (*_LAYERS, *_QUANTIZER_CLASSES)},
    **{alias: quantizers.NAMES[alias] for alias in _QUANTIZER_ALIASES},
    "WeightClip": constraints.WeightClip, "weight_clip": constraints.weight_clip,
    "FlipRatio": metrics.FlipRatio, "flip_ratio": metrics.FlipRatio,
    "hard_tanh": activations.hard_tanh, "leaky_tanh": activations.leaky_tanh,
    "Bop": optimizers.Bop, "CaseOptimizer": optimizers.CaseOptimizer,
}

#: The string tables of Keras 3's ``get`` functions that do not read custom objects, and the
#: names each gains.
LOOKUPS: dict[Callable, dict[str, Any]] = {
    keras.constraints.get: {"WeightClip": constraints.WeightClip,
                            "weight_clip": constraints.weight_clip},
    keras.activations.get: {
        "hard_tanh": activations.hard_tanh, "leaky_tanh": activations.leaky_tanh,
        "ste_sign": bq.ste_sign, "approx_sign": bq.approx_sign, "swish_sign": bq.swish_sign,
        "magnitude_aware_sign": bq.magnitude_aware_sign, "ste_heaviside": bq.ste_heaviside,
        "ste_tern": bq.ste_tern, "dorefa_quantizer": bq.dorefa},
    keras.metrics.get: {"FlipRatio": metrics.FlipRatio, "flip_ratio": metrics.FlipRatio},
}


def _register() -> None:
    """Adds :data:`CUSTOM_OBJECTS` to Keras' custom objects and :data:`LOOKUPS` to the table
    each ``get`` reads (``ALL_OBJECTS_DICT`` of the module that defines it), keeping what is
    there."""
    custom = keras.saving.get_custom_objects()
    for name, obj in CUSTOM_OBJECTS.items():
        custom.setdefault(name, obj)
    for get, names in LOOKUPS.items():
        table = get.__globals__.get("ALL_OBJECTS_DICT")
        if isinstance(table, dict):
            for name, obj in names.items():
                table.setdefault(name, obj)


_register()
