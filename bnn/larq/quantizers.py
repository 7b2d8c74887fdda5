"""Larq's ``larq.quantizers`` on bnn's quantizers.

Each class takes Larq's arguments (``clip_value=None`` means "no gradient clipping", ``metrics``
asks for a flip-ratio metric) and is the bnn quantizer of the same formula
(:mod:`bnn.quantizers`), saved as that bnn class. Strings resolve by Larq's names (``"ste_sign"``,
``"approx_sign"``, ``"swish_sign"``, ``"magnitude_aware_sign"``, ``"ste_heaviside"``,
``"ste_tern"``, ``"dorefa_quantizer"``) and class names (``"SteSign"``, ...).

Forward passes and pseudo-gradients (sign(0) = +1 everywhere):

========================  ==============================================  =====================
class                     forward                                         gradient
========================  ==============================================  =====================
``SteSign``               +1 if x >= 0 else -1                            1 if \\|x\\| <= clip
``ApproxSign``            +1 if x >= 0 else -1                            2 - 2\\|x\\| inside [-1, 1]
``SwishSign``             +1 if x >= 0 else -1                            SignSwish(beta)
``MagnitudeAwareSign``    sign(x) mean\\|x\\| per output channel          STE times the scale
``SteHeaviside``          1 if x > 0 else 0                               1 if \\|x\\| <= clip
``SteTern``               sign(x) if \\|x\\| > threshold else 0           1 if \\|x\\| <= clip
``DoReFa``                k-bit levels of [0, 1] (or of [-1, 1] weights)  see bnn.quantizers.dorefa
``NoOp``                  x                                               1
========================  ==============================================  =====================
"""

from __future__ import annotations

import math as _math
from typing import Any, Sequence

import keras
import tensorflow as tf

from bnn import quantizers as bq
from bnn.larq import context
from bnn.larq._saving import saves_as

__all__ = [
    "Quantizer", "SteSign", "ApproxSign", "SwishSign", "MagnitudeAwareSign", "SteHeaviside",
    "SteTern", "DoReFa", "DoReFaQuantizer", "NoOp", "NoOpQuantizer", "ste_sign", "approx_sign",
    "swish_sign", "ste_tern", "ste_heaviside", "get", "get_kernel_quantizer", "serialize",
    "deserialize",
]

# Arguments every Larq quantizer takes because it is a tf-keras layer; they carry no meaning for
# a quantizer (it has no weights and keeps its input's dtype), so they are accepted and dropped.
_LAYER_ARGUMENTS = ("name", "trainable", "dtype")


def _clip(clip_value: float | None) -> float:
    """Larq's ``clip_value=None`` (never clip the gradient) is bnn's ``inf``."""
    return _math.inf if clip_value is None else float(clip_value)


def ste_sign(x: tf.Tensor, clip_value: float | None = 1.0) -> tf.Tensor:
    """Sign, straight-through gradient where ``|x| <= clip_value`` (``None``: everywhere)."""
    return bq.ste_sign(x, _clip(clip_value))


def approx_sign(x: tf.Tensor) -> tf.Tensor:
    """Sign, gradient ``2 - 2|x|`` for ``|x| <= 1`` (Bi-Real Net)."""
    return bq.approx_sign(x)


def swish_sign(x: tf.Tensor, beta: float = 5.0) -> tf.Tensor:
    """Sign, SignSwish gradient ``beta (2 - beta x tanh(beta x / 2)) / (1 + cosh(beta x))``."""
    return bq.swish_sign(x, beta)


def ste_tern(x: tf.Tensor, threshold_value: float = 0.05, ternary_weight_networks: bool = False,
             clip_value: float | None = 1.0) -> tf.Tensor:
    """Ternarization to {-1, 0, 1}, straight-through gradient where ``|x| <= clip_value``."""
    return bq.ste_tern(x, threshold_value, ternary_weight_networks, _clip(clip_value))


def ste_heaviside(x: tf.Tensor, clip_value: float | None = 1.0) -> tf.Tensor:
    """1 where ``x > 0``, else 0; straight-through gradient where ``|x| <= clip_value``."""
    return bq.ste_heaviside(x, _clip(clip_value))


class Quantizer(keras.layers.Layer):
    """Base class for quantizers written as Keras layers, as in Larq: subclass it, implement
    ``call`` and set ``precision`` (bits of the output). Any callable works as a quantizer."""

    precision: int | None = None

    def compute_output_shape(self, input_shape):
        return input_shape


class _Metrics:
    """Larq's ``metrics`` argument: the training metrics a kernel quantizer asks for."""

    def _init_metrics(self, metrics: Sequence[str] | None) -> None:
        self._custom_metrics = context.check_metrics(metrics)


def _layer_arguments(kwargs: dict) -> None:
    unknown = sorted(set(kwargs) - set(_LAYER_ARGUMENTS))
    if unknown:
        raise TypeError(f"unexpected quantizer argument(s): {', '.join(unknown)}")


@saves_as(bq.SteSign)
class SteSign(_Metrics, bq.SteSign):
    """Larq's ``SteSign(clip_value=1.0, metrics=None)``: :func:`bnn.quantizers.ste_sign`."""

    def __init__(self, clip_value: float | None = 1.0, metrics: Sequence[str] | None = None,
                 **kwargs):
        _layer_arguments(kwargs)
        super().__init__(_clip(clip_value))
        self._init_metrics(metrics)


@saves_as(bq.ApproxSign)
class ApproxSign(_Metrics, bq.ApproxSign):
    """Larq's ``ApproxSign(metrics=None)``: :func:`bnn.quantizers.approx_sign`."""

    def __init__(self, metrics: Sequence[str] | None = None, **kwargs):
        _layer_arguments(kwargs)
        super().__init__()
        self._init_metrics(metrics)


@saves_as(bq.SwishSign)
class SwishSign(_Metrics, bq.SwishSign):
    """Larq's ``SwishSign(beta=5.0, metrics=None)``: :func:`bnn.quantizers.swish_sign`."""

    def __init__(self, beta: float = 5.0, metrics: Sequence[str] | None = None, **kwargs):
        _layer_arguments(kwargs)
        super().__init__(beta)
        self._init_metrics(metrics)


@saves_as(bq.MagnitudeAwareSign)
class MagnitudeAwareSign(_Metrics, bq.MagnitudeAwareSign):
    """Larq's ``MagnitudeAwareSign(clip_value=1.0, metrics=None)``:
    :func:`bnn.quantizers.magnitude_aware_sign`."""

    def __init__(self, clip_value: float | None = 1.0, metrics: Sequence[str] | None = None,
                 **kwargs):
        _layer_arguments(kwargs)
        super().__init__(_clip(clip_value))
        self._init_metrics(metrics)


@saves_as(bq.SteHeaviside)
class SteHeaviside(_Metrics, bq.SteHeaviside):
    """Larq's ``SteHeaviside(clip_value=1.0, metrics=None)``:
    :func:`bnn.quantizers.ste_heaviside`."""

    def __init__(self, clip_value: float | None = 1.0, metrics: Sequence[str] | None = None,
                 **kwargs):
        _layer_arguments(kwargs)
        super().__init__(_clip(clip_value))
        self._init_metrics(metrics)


@saves_as(bq.SteTern)
class SteTern(_Metrics, bq.SteTern):
    """Larq's ``SteTern(threshold_value=0.05, ternary_weight_networks=False, clip_value=1.0,
    metrics=None)``: :func:`bnn.quantizers.ste_tern`."""

    def __init__(self, threshold_value: float = 0.05, ternary_weight_networks: bool = False,
                 clip_value: float | None = 1.0, metrics: Sequence[str] | None = None,
                 **kwargs):
        _layer_arguments(kwargs)
        super().__init__(threshold_value, ternary_weight_networks, _clip(clip_value))
        self._init_metrics(metrics)


@saves_as(bq.DoReFa)
class DoReFa(_Metrics, bq.DoReFa):
    """Larq's ``DoReFa(k_bit=2, mode="activations", metrics=None)``:
    :func:`bnn.quantizers.dorefa`."""

    def __init__(self, k_bit: int = 2, mode: str = "activations",
                 metrics: Sequence[str] | None = None, **kwargs):
        _layer_arguments(kwargs)
        super().__init__(k_bit, mode)
        self._init_metrics(metrics)


@saves_as(bq.NoOp)
class NoOp(_Metrics, bq.NoOp):
    """Larq's ``NoOp(precision, metrics=None)``: the identity, tagging the precision of a kernel
    (``NoOp(precision=1)`` marks ±1 kernels for :class:`bnn.larq.optimizers.Bop`)."""

    def __init__(self, precision: int, metrics: Sequence[str] | None = None, **kwargs):
        _layer_arguments(kwargs)
        super().__init__(precision)
        self._init_metrics(metrics)


DoReFaQuantizer = DoReFa
NoOpQuantizer = NoOp

#: Larq's string names (its aliases and class names) -> bnn.larq classes.
NAMES: dict[str, type] = {
    "ste_sign": SteSign, "approx_sign": ApproxSign, "swish_sign": SwishSign,
    "magnitude_aware_sign": MagnitudeAwareSign, "ste_heaviside": SteHeaviside,
    "ste_tern": SteTern, "dorefa_quantizer": DoReFa,
    **{cls.__name__: cls for cls in (SteSign, ApproxSign, SwishSign, MagnitudeAwareSign,
                                     SteHeaviside, SteTern, DoReFa, NoOp)},
    "DoReFaQuantizer": DoReFa, "NoOpQuantizer": NoOp,
}
#: Larq's quantizer functions, by name, as bnn.larq classes.
_FUNCTIONS = {"ste_sign": SteSign, "approx_sign": ApproxSign, "swish_sign": SwishSign,
              "ste_tern": SteTern, "ste_heaviside": SteHeaviside}


def _from_larq_config(class_name: str, config: dict[str, Any]) -> bq.Quantizer:
    cls = NAMES[class_name]
    config = {k: v for k, v in config.items() if k not in _LAYER_ARGUMENTS}
    if cls is DoReFa and "k_bit" not in config and "precision" in config:
        config["k_bit"] = config.pop("precision")
    try:
        return cls(**config)
    except TypeError as error:
        raise ValueError(f"bad arguments for Larq quantizer {class_name!r}: {error}") from None


def get(identifier: Any) -> Any:
    """A quantizer from a Larq name (``"ste_sign"``, ``"SteSign"``, ...), a Larq or bnn config
    dict, a quantizer object, any callable, or ``None``.

    Raises:
        ValueError: for an unknown name or anything else.
    """
    if identifier is None or isinstance(identifier, bq.Quantizer):
        return identifier
    if isinstance(identifier, str):
        if identifier not in NAMES:
            raise ValueError(f"unknown quantizer {identifier!r}; Larq's quantizers: "
                             f"{', '.join(sorted(NAMES))}")
        return NAMES[identifier]()
    if isinstance(identifier, dict):
        class_name = identifier.get("class_name")
        if class_name == "function" and identifier.get("config") in _FUNCTIONS:
            return _FUNCTIONS[identifier["config"]]()  # Larq's function, saved by tf-keras
        if class_name in NAMES and not str(identifier.get("registered_name")).startswith("bnn"):
            return _from_larq_config(class_name, identifier.get("config") or {})
        return bq.get(identifier)
    if callable(identifier):
        return identifier
    raise ValueError(f"cannot interpret {identifier!r} as a quantizer; give a name "
                     f"({', '.join(sorted(_FUNCTIONS))}, ...), a config dict, a callable or None")


def get_kernel_quantizer(identifier: Any) -> Any:
    """:func:`get`, and a quantizer of this module without ``metrics`` takes those of the current
    :func:`bnn.larq.context.metrics_scope`."""
    quantizer = get(identifier)
    if isinstance(quantizer, _Metrics) and not quantizer._custom_metrics:
        quantizer._custom_metrics = sorted(context.get_training_metrics())
    return quantizer


def serialize(quantizer: Any) -> Any:
    """The Keras config of ``quantizer`` (``None`` for no quantizer)."""
    return None if quantizer is None else keras.saving.serialize_keras_object(quantizer)


def deserialize(config: Any, custom_objects: dict | None = None) -> Any:
    """Inverse of :func:`serialize`; also reads Larq's configs."""
    if isinstance(config, dict) and custom_objects:
        with keras.saving.custom_object_scope(custom_objects):
            return get(config)
    return get(config)
