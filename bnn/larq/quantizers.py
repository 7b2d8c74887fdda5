"""Larq's ``larq.quantizers`` on bnn's quantizers.

As in Larq, each quantizer class is a Keras layer (:class:`Quantizer`): it can be a layer of a
Sequential or functional model, is serialized with ``get_config`` / ``from_config`` (registered
as ``bnn.larq>SteSign``, ...), and serves as ``input_quantizer`` / ``kernel_quantizer`` of the
quantized layers, by object or by Larq's names (``"ste_sign"``, ``"approx_sign"``,
``"swish_sign"``, ``"magnitude_aware_sign"``, ``"ste_heaviside"``, ``"ste_tern"``,
``"dorefa_quantizer"``) and class names (``"SteSign"``, ...). Each has Larq's ``precision`` (bits
of its output) and ``metrics`` argument (``["flip_ratio"]`` on a kernel quantizer; see
:mod:`bnn.larq.layers`), and Larq's attributes (``clip_value``, ``mode``, ...), read at every
call, so changing one after construction takes effect as in Larq.

Each computes the bnn quantizer of the same formula (:mod:`bnn.quantizers`) that
:meth:`_BaseQuantizer.bnn_quantizer` builds from its current attributes; binary layers use that
to run bnn's fast paths and to save a quantizer as bnn's, so a model of quantized layers loads
after ``import bnn`` alone. A quantizer used as a model layer of its own is saved as this
module's class (load it after ``import bnn.larq``).

Forward passes and pseudo-gradients (sign(0) = +1 everywhere):

========================  ==============================================  =====================
class                     forward                                         gradient
========================  ==============================================  =====================
``SteSign``               +1 if x >= 0 else -1                            1 if \\|x\\| <= clip
``ApproxSign``            +1 if x >= 0 else -1                            2 - 2\\|x\\| inside [-1, 1]
``SwishSign``             +1 if x >= 0 else -1                            SignSwish(beta)
``MagnitudeAwareSign``    sign(x) mean\\|x\\| per output channel          STE times the scale
``SteHeaviside``          1 if x > 0 else 0                               1 if \\|x\\| <= clip
``SteTern``               sign(x) if \\|x\\| >= threshold else 0          1 if \\|x\\| <= clip
``DoReFa``                k-bit levels of [0, 1] (or of [-1, 1] weights)  see bnn.quantizers.dorefa
``NoOp``                  x                                               1
========================  ==============================================  =====================

``SteTern`` follows Larq where ``|x|`` equals the threshold: ±1 (bnn's own ``ste_tern`` gives 0
there unless ``inclusive=True``).
"""

from __future__ import annotations

import math as _math
from typing import Any, Sequence

import keras
import tensorflow as tf

from bnn import quantizers as bq
from bnn.larq import context

__all__ = [
    "Quantizer", "SteSign", "ApproxSign", "SwishSign", "MagnitudeAwareSign", "SteHeaviside",
    "SteTern", "DoReFa", "DoReFaQuantizer", "NoOp", "NoOpQuantizer", "ste_sign", "approx_sign",
    "swish_sign", "ste_tern", "ste_heaviside", "get", "get_kernel_quantizer", "serialize",
    "deserialize",
]

# The Keras layer arguments of a Larq quantizer's config, left out when reading Larq's configs
# (a tf-keras dtype policy is not Keras 3's; the name is generated anew).
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
    """Ternarization to {-1, 0, 1} (``sign(x)`` where ``|x| >= threshold``, as Larq),
    straight-through gradient where ``|x| <= clip_value``."""
    return bq.ste_tern(x, threshold_value, ternary_weight_networks, _clip(clip_value),
                       inclusive=True)


def ste_heaviside(x: tf.Tensor, clip_value: float | None = 1.0) -> tf.Tensor:
    """1 where ``x > 0``, else 0; straight-through gradient where ``|x| <= clip_value``."""
    return bq.ste_heaviside(x, _clip(clip_value))


class Quantizer(keras.layers.Layer):
    """Base class of quantizers written as Keras layers, as in Larq: subclass it, implement
    ``call`` and set ``precision`` (bits of the output). Any callable works as a quantizer.

    A quantizer keeps its input's dtype (Keras' autocasting of inputs is off by default:
    ``autocast=False``)."""

    precision: int | None = None

    def __init__(self, **kwargs):
        kwargs.setdefault("autocast", False)
        super().__init__(**kwargs)

    def compute_output_shape(self, input_shape):
        return input_shape


class _BaseQuantizer(Quantizer):
    """Larq's quantizers: the ``metrics`` argument, and ``call`` computing the bnn quantizer
    that :meth:`bnn_quantizer` builds from the current attributes."""

    def __init__(self, metrics: Sequence[str] | None = None, **kwargs):
        super().__init__(**kwargs)
        self._custom_metrics = context.check_metrics(metrics)
        self._core()  # bad arguments fail here already

    def _core(self) -> bq.Quantizer:
        """The bnn quantizer of this quantizer's formula and current attributes."""
        raise NotImplementedError

    def bnn_quantizer(self) -> bq.Quantizer | None:
        """The bnn quantizer that computes what this one does now (None for a subclass with a
        ``call`` of its own): the same object while the attributes stay the same, since Keras
        tells shared objects apart by identity when it saves a model. Raises ``ValueError`` for
        an attribute set to a bad value."""
        if type(self).call is not _BaseQuantizer.call:
            return None
        core = self._core()
        if core != getattr(self, "_bnn_quantizer", None):
            self._bnn_quantizer = core
        return self._bnn_quantizer

    def call(self, inputs):
        return self._core()(inputs)

    def get_config(self) -> dict[str, Any]:
        """The Keras layer's config (``name``, ``trainable``, ``dtype``); each class adds its
        arguments. ``metrics`` is not saved, as in Larq."""
        return super().get_config()


def _register(cls: type) -> type:
    return keras.saving.register_keras_serializable(package="bnn.larq")(cls)


@_register
class NoOp(_BaseQuantizer):
    """Larq's ``NoOp(precision, metrics=None)``: the identity, tagging the precision of a kernel
    (``NoOp(precision=1)`` marks ±1 kernels for :class:`bnn.larq.optimizers.Bop`)."""

    precision = None

    def __init__(self, precision: int, **kwargs):
        self.precision = precision
        super().__init__(**kwargs)

    def _core(self) -> bq.Quantizer:
        return bq.NoOp(self.precision)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "precision": self.precision}


@_register
class SteSign(_BaseQuantizer):
    """Larq's ``SteSign(clip_value=1.0, metrics=None)``: :func:`bnn.quantizers.ste_sign`
    (``clip_value=None``: no clipping)."""

    precision = 1

    def __init__(self, clip_value: float | None = 1.0, **kwargs):
        self.clip_value = clip_value
        super().__init__(**kwargs)

    def _core(self) -> bq.Quantizer:
        return bq.SteSign(_clip(self.clip_value))

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "clip_value": self.clip_value}


@_register
class ApproxSign(_BaseQuantizer):
    """Larq's ``ApproxSign(metrics=None)``: :func:`bnn.quantizers.approx_sign`."""

    precision = 1

    def _core(self) -> bq.Quantizer:
        return bq.ApproxSign()


@_register
class SteHeaviside(_BaseQuantizer):
    """Larq's ``SteHeaviside(clip_value=1.0, metrics=None)``:
    :func:`bnn.quantizers.ste_heaviside`."""

    precision = 1

    def __init__(self, clip_value: float | None = 1.0, **kwargs):
        self.clip_value = clip_value
        super().__init__(**kwargs)

    def _core(self) -> bq.Quantizer:
        return bq.SteHeaviside(_clip(self.clip_value))

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "clip_value": self.clip_value}


@_register
class SwishSign(_BaseQuantizer):
    """Larq's ``SwishSign(beta=5.0, metrics=None)``: :func:`bnn.quantizers.swish_sign`."""

    precision = 1

    def __init__(self, beta: float = 5.0, **kwargs):
        self.beta = beta
        super().__init__(**kwargs)

    def _core(self) -> bq.Quantizer:
        return bq.SwishSign(self.beta)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "beta": self.beta}


@_register
class MagnitudeAwareSign(_BaseQuantizer):
    """Larq's ``MagnitudeAwareSign(clip_value=1.0, metrics=None)``:
    :func:`bnn.quantizers.magnitude_aware_sign`."""

    precision = 1

    def __init__(self, clip_value: float | None = 1.0, **kwargs):
        self.clip_value = clip_value
        super().__init__(**kwargs)

    def _core(self) -> bq.Quantizer:
        return bq.MagnitudeAwareSign(_clip(self.clip_value))

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "clip_value": self.clip_value}


@_register
class SteTern(_BaseQuantizer):
    """Larq's ``SteTern(threshold_value=0.05, ternary_weight_networks=False, clip_value=1.0,
    metrics=None)``: :func:`bnn.quantizers.ste_tern` with Larq's rule at the threshold
    (``inclusive=True``: ``|x| >= threshold`` gives ``sign(x)``)."""

    precision = 2

    def __init__(self, threshold_value: float = 0.05, ternary_weight_networks: bool = False,
                 clip_value: float | None = 1.0, **kwargs):
        self.threshold_value = threshold_value
        self.ternary_weight_networks = ternary_weight_networks
        self.clip_value = clip_value
        super().__init__(**kwargs)

    def _core(self) -> bq.Quantizer:
        return bq.SteTern(self.threshold_value, self.ternary_weight_networks,
                          _clip(self.clip_value), inclusive=True)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "threshold_value": self.threshold_value,
                "ternary_weight_networks": self.ternary_weight_networks,
                "clip_value": self.clip_value}


@_register
class DoReFa(_BaseQuantizer):
    """Larq's ``DoReFa(k_bit=2, mode="activations", metrics=None)``:
    :func:`bnn.quantizers.dorefa`. As in Larq, ``precision`` holds ``k_bit``."""

    precision = None

    def __init__(self, k_bit: int = 2, mode: str = "activations", **kwargs):
        self.precision = k_bit
        self.mode = mode
        super().__init__(**kwargs)

    @property
    def k_bit(self) -> int:
        return self.precision

    def _core(self) -> bq.Quantizer:
        return bq.DoReFa(self.precision, self.mode)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "k_bit": self.precision, "mode": self.mode}


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


def _from_larq_config(class_name: str, config: dict[str, Any]) -> Quantizer:
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
    if isinstance(quantizer, _BaseQuantizer) and not quantizer._custom_metrics:
        quantizer._custom_metrics = sorted(context.get_training_metrics())
    return quantizer


def serialize(quantizer: Any) -> Any:
    """The Keras config of ``quantizer`` (``None`` for no quantizer); :func:`deserialize` gives
    an equal quantizer of the same class back."""
    return None if quantizer is None else keras.saving.serialize_keras_object(quantizer)


def deserialize(config: Any, custom_objects: dict | None = None) -> Any:
    """Inverse of :func:`serialize`; also reads Larq's configs."""
    if isinstance(config, dict) and custom_objects:
        with keras.saving.custom_object_scope(custom_objects):
            return get(config)
    return get(config)
