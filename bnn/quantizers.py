"""Quantizers: functions that map real values to a few levels, with a pseudo-gradient.

Each quantizer is a small pure function built on ``tf.custom_gradient``; its docstring gives the
forward formula and the pseudo-gradient. Each also has a tiny serializable class registered under
a string name, so layers and YAML files can say ``"ste_sign"``. Every function keeps the input's
dtype (float16 and bfloat16 in, the same dtype out) and runs under ``tf.function``, XLA and
``tf.distribute``.

Look a quantizer up with :func:`get`; add your own with :func:`register`.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import keras
import tensorflow as tf

from bnn.xla import compiled

__all__ = [
    "Quantizer",
    "SteSign",
    "ApproxSign",
    "SwishSign",
    "MagnitudeAwareSign",
    "SteHeaviside",
    "SteTern",
    "DoReFa",
    "NoOp",
    "ste_sign",
    "approx_sign",
    "swish_sign",
    "magnitude_aware_sign",
    "ste_heaviside",
    "ste_tern",
    "dorefa",
    "NoOp",
    "no_op",
    "get",
    "serialize",
    "register",
    "names",
]

_REGISTRY: dict[str, type[Quantizer]] = {}


def _sign(x: tf.Tensor) -> tf.Tensor:
    """+1 where x >= 0, -1 elsewhere, in x's dtype (sign(0) = +1)."""
    one = tf.ones_like(x)
    return tf.where(x >= 0, one, -one)


def _mask(x: tf.Tensor, clip_value: float) -> tf.Tensor:
    return tf.cast(tf.abs(x) <= tf.cast(clip_value, x.dtype), x.dtype)


@compiled
def _fused_sign(x: tf.Tensor) -> tf.Tensor:
    """``_sign`` as one fused pass over x."""
    return tf.where(x >= 0, tf.ones_like(x), -tf.ones_like(x))


def _all_inside(x: tf.Tensor, clip_value: tf.Tensor) -> tf.Tensor:
    """``all(|x| <= clip_value)`` from two read-only reductions (no temporary the size of x)."""
    return tf.logical_and(tf.reduce_max(x) <= clip_value, tf.reduce_min(x) >= -clip_value)


@compiled
def _masked(dy: tf.Tensor, x: tf.Tensor, clip_value: tf.Tensor) -> tf.Tensor:
    """One fused pass: ``dy`` where ``|x| <= clip_value``, else 0."""
    return tf.where(tf.abs(x) <= clip_value, dy, tf.zeros_like(dy))


@compiled
def _approx_sign_gradient(dy: tf.Tensor, x: tf.Tensor) -> tf.Tensor:
    """One fused pass: ``dy * max(2 - 2|x|, 0)``."""
    return dy * tf.maximum(2.0 - 2.0 * tf.abs(x), tf.zeros_like(x))


def _sign_masked(x: tf.Tensor, clip_value: float) -> tf.Tensor:
    """Fused sign forward; gradient ``dy`` where ``|x| <= clip_value``, else 0, in one fused pass."""

    @tf.custom_gradient
    def _op(x):
        clip = tf.cast(clip_value, x.dtype)
        return _fused_sign(x), lambda dy: _masked(dy, x, clip)

    return _op(x)


@tf.custom_gradient
def _sign_pass_through(x: tf.Tensor):
    """Fused sign forward, gradient ``dy`` (the straight-through estimator without a mask)."""
    return _fused_sign(x), lambda dy: tf.identity(dy)


def ste_sign(x: tf.Tensor, clip_value: float = 1.0) -> tf.Tensor:
    r"""Sign with the straight-through estimator (BinaryNet, Courbariaux et al. 2016).

    Forward: :math:`q(x) = +1` if :math:`x \ge 0`, else :math:`-1`.

    Backward: :math:`\partial q / \partial x = 1` if :math:`|x| \le` ``clip_value``, else 0 (the
    derivative of hard-tanh). ``clip_value=inf`` passes every gradient.

    Speed: the forward pass is one fused (XLA) pass, and two read-only reductions record whether
    every :math:`|x| \le` ``clip_value``; when so (always the case for latent weights kept in
    range by ``WeightClip``), the backward pass hands ``dy`` through without touching ``x``
    again. With ``clip_value=inf`` nothing is checked: the gradient is ``dy``. For 16-bit inputs
    (activations under a mixed-precision policy, rarely all in range) nothing is checked either:
    TensorFlow's 16-bit reductions on CPUs cost several times the one fused masking pass that
    the backward pass then always makes.
    """
    x = tf.convert_to_tensor(x)
    if math.isinf(clip_value) and clip_value > 0:
        return _sign_pass_through(x)
    if x.dtype.size < 4:
        return _sign_masked(x, clip_value)

    @tf.custom_gradient
    def _op(x):
        clip = tf.cast(clip_value, x.dtype)
        y, all_inside = _fused_sign(x), _all_inside(x, clip)

        def grad(dy):
            return tf.cond(all_inside, lambda: tf.identity(dy), lambda: _masked(dy, x, clip))

        return y, grad

    return _op(x)


def approx_sign(x: tf.Tensor) -> tf.Tensor:
    r"""Sign with Bi-Real Net's piecewise-quadratic pseudo-gradient (Liu et al. 2018).

    Forward: :math:`q(x) = \mathrm{sign}(x)` (+1 at 0).

    Backward: :math:`\partial q / \partial x = 2 - 2|x|` for :math:`|x| \le 1`, else 0.

    Speed: forward and backward are one fused (XLA) pass each.
    """
    x = tf.convert_to_tensor(x)

    @tf.custom_gradient
    def _op(x):
        return _fused_sign(x), lambda dy: _approx_sign_gradient(dy, x)

    return _op(x)


def swish_sign(x: tf.Tensor, beta: float = 5.0) -> tf.Tensor:
    r"""Sign with the SignSwish pseudo-gradient (BNN+, Darabi et al. 2018).

    Forward: :math:`q(x) = \mathrm{sign}(x)` (+1 at 0).

    Backward: :math:`\partial q / \partial x = \beta\,(2 - \beta x \tanh(\beta x / 2))
    / (1 + \cosh(\beta x))`.
    """
    x = tf.convert_to_tensor(x)

    @tf.custom_gradient
    def _op(x):
        def grad(dy):
            # beyond |beta x| = 30 the pseudo-gradient is below 1e-11: zero, and no inf/inf
            limit = tf.cast(30.0 / beta, x.dtype)
            inside = tf.abs(x) < limit
            b = tf.cast(beta, x.dtype)
            bx = b * tf.clip_by_value(x, -limit, limit)
            g = b * (2.0 - bx * tf.tanh(bx / 2.0)) / (1.0 + tf.cosh(bx))
            return dy * tf.where(inside, g, tf.zeros_like(g))

        return _sign(x), grad

    return _op(x)


def magnitude_aware_sign(x: tf.Tensor, clip_value: float = 1.0) -> tf.Tensor:
    r"""Sign scaled by the mean magnitude per output channel (Bi-Real Net weights).

    Forward: :math:`q(x) = \mathrm{sign}(x)\cdot\mathrm{mean}(|x|)`, the mean taken over every
    axis but the last (the output channels of a kernel).

    Backward: ``ste_sign``'s mask times the (constant) scale; the scale itself is not
    differentiated through.
    """
    x = tf.convert_to_tensor(x)
    axes = list(range(len(x.shape) - 1))
    # 16-bit inputs are averaged in float32, so that float16 values near 65504 do not overflow
    wide = tf.float32 if x.dtype.size < 4 else x.dtype
    scale = tf.reduce_mean(tf.abs(tf.cast(x, wide)), axis=axes)
    scale = tf.stop_gradient(tf.cast(scale, x.dtype))
    return ste_sign(x, clip_value) * scale


def ste_heaviside(x: tf.Tensor, clip_value: float = 1.0) -> tf.Tensor:
    r"""Binarization to {0, 1} with the straight-through estimator.

    Forward: :math:`q(x) = 1` if :math:`x > 0`, else 0.

    Backward: :math:`\partial q / \partial x = 1` if :math:`|x| \le` ``clip_value``, else 0.
    """
    x = tf.convert_to_tensor(x)

    @tf.custom_gradient
    def _op(x):
        return tf.cast(x > 0, x.dtype), lambda dy: dy * _mask(x, clip_value)

    return _op(x)


def ste_tern(
    x: tf.Tensor, threshold_value: float = 0.05, ternary_weight_networks: bool = False,
    clip_value: float = 1.0,
) -> tf.Tensor:
    r"""Ternarization to {-1, 0, +1} with the straight-through estimator.

    Forward: :math:`q(x) = \mathrm{sign}(x)` if :math:`|x| > \Delta`, else 0, where
    :math:`\Delta` is ``threshold_value``, or :math:`0.7\,\mathrm{mean}(|x|)` when
    ``ternary_weight_networks`` (Li et al. 2016).

    Backward: :math:`\partial q / \partial x = 1` if :math:`|x| \le` ``clip_value``, else 0.
    """
    x = tf.convert_to_tensor(x)

    @tf.custom_gradient
    def _op(x):
        if ternary_weight_networks:
            delta = 0.7 * tf.reduce_mean(tf.abs(x))
        else:
            delta = tf.cast(threshold_value, x.dtype)
        y = _sign(x) * tf.cast(tf.abs(x) > delta, x.dtype)
        return y, lambda dy: dy * _mask(x, clip_value)

    return _op(x)


DOREFA_MODES = ("activations", "weights")


def dorefa(x: tf.Tensor, k_bit: int = 2, mode: str = "activations") -> tf.Tensor:
    r"""k-bit uniform quantization (DoReFa-Net, Zhou et al. 2016), with :math:`n = 2^k - 1`.

    ``mode="activations"`` quantizes [0, 1]:

    * forward :math:`q(x) = \mathrm{round}(n\,\mathrm{clip}(x, 0, 1)) / n`;
    * backward :math:`\partial q / \partial x = 1` if :math:`0 \le x \le 1`, else 0.

    ``mode="weights"`` quantizes a whole kernel to [-1, 1] after soft-limiting it with tanh and
    scaling it so that its largest magnitude reaches ±1 (section 2.3 of the paper):

    * forward :math:`q(w) = 2\,\mathrm{round}(n\,u) / n - 1` with
      :math:`u = \tanh(w) / (2 \max|\tanh(w)|) + 1/2` (:math:`u = 1/2` for an all-zero kernel);
    * backward: the rounding passes the gradient unchanged and :math:`\max|\tanh(w)|` is
      held constant, so :math:`\partial q / \partial w = (1 - \tanh^2 w) / \max|\tanh(w)|`.
    """
    if mode not in DOREFA_MODES:
        raise ValueError(f"dorefa mode must be one of {DOREFA_MODES}, got {mode!r}")
    x = tf.convert_to_tensor(x)
    levels = float(2**k_bit - 1)

    @tf.custom_gradient
    def _round(u):
        return tf.round(u * levels) / levels, lambda dy: tf.identity(dy)

    if mode == "weights":
        limited = tf.tanh(x)
        peak = tf.stop_gradient(tf.reduce_max(tf.abs(limited)))
        return 2.0 * _round(tf.math.divide_no_nan(limited, 2.0 * peak) + 0.5) - 1.0

    @tf.custom_gradient
    def _op(x):
        clipped = tf.clip_by_value(x, tf.zeros_like(x), tf.ones_like(x))
        y = tf.round(clipped * levels) / levels
        inside = tf.cast((x >= 0) & (x <= 1), x.dtype)
        return y, lambda dy: dy * inside

    return _op(x)


def no_op(x: tf.Tensor) -> tf.Tensor:
    r"""Identity in both passes: :math:`q(x) = x`, :math:`\partial q / \partial x = 1`.

    As a kernel quantizer it marks a kernel whose stored values are themselves the quantized
    weights (e.g. ±1 weights that :class:`bnn.optimizers.Bop` flips).
    """
    return tf.identity(tf.convert_to_tensor(x))


class Quantizer:
    """Base class: a callable with a registered ``name`` and a ``get_config``.

    Subclasses set ``name`` and ``function`` and list their keyword arguments in ``__init__``.
    """

    name: str = ""
    function: Callable[..., tf.Tensor]
    precision: int = 1
    #: True when every output is exactly +1 or -1 (binary layers may then use xor-popcount).
    plus_minus_one: bool = False

    def __init__(self, **kwargs: Any):
        self._kwargs = kwargs

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        return type(self).function(x, **self._kwargs)

    def get_config(self) -> dict[str, Any]:
        return dict(self._kwargs)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Quantizer:
        return cls(**config)

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.get_config() == other.get_config()

    def __hash__(self) -> int:
        return hash((type(self), tuple(sorted(self._kwargs.items()))))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"


def register(cls: type[Quantizer]) -> type[Quantizer]:
    """Class decorator: makes a quantizer class findable by ``cls.name`` and Keras-serializable."""
    if not cls.name:
        raise ValueError(f"quantizer class {cls.__name__} needs a non-empty 'name' attribute")
    _REGISTRY[cls.name] = cls
    return keras.saving.register_keras_serializable(package="bnn")(cls)


@register
class SteSign(Quantizer):
    name, function = "ste_sign", staticmethod(ste_sign)
    plus_minus_one = True

    def __init__(self, clip_value: float = 1.0):
        super().__init__(clip_value=float(clip_value))


@register
class ApproxSign(Quantizer):
    name, function = "approx_sign", staticmethod(approx_sign)
    plus_minus_one = True

    def __init__(self):
        super().__init__()


@register
class SwishSign(Quantizer):
    name, function = "swish_sign", staticmethod(swish_sign)
    plus_minus_one = True

    def __init__(self, beta: float = 5.0):
        super().__init__(beta=float(beta))


@register
class MagnitudeAwareSign(Quantizer):
    name, function = "magnitude_aware_sign", staticmethod(magnitude_aware_sign)

    def __init__(self, clip_value: float = 1.0):
        super().__init__(clip_value=float(clip_value))


@register
class SteHeaviside(Quantizer):
    name, function = "ste_heaviside", staticmethod(ste_heaviside)

    def __init__(self, clip_value: float = 1.0):
        super().__init__(clip_value=float(clip_value))


@register
class SteTern(Quantizer):
    name, function, precision = "ste_tern", staticmethod(ste_tern), 2

    def __init__(self, threshold_value: float = 0.05, ternary_weight_networks: bool = False,
                 clip_value: float = 1.0):
        super().__init__(threshold_value=float(threshold_value),
                         ternary_weight_networks=bool(ternary_weight_networks),
                         clip_value=float(clip_value))


@register
class DoReFa(Quantizer):
    name, function = "dorefa", staticmethod(dorefa)

    def __init__(self, k_bit: int = 2, mode: str = "activations"):
        if int(k_bit) < 1:
            raise ValueError(f"dorefa k_bit must be >= 1, got {k_bit!r}")
        if mode not in DOREFA_MODES:
            raise ValueError(f"dorefa mode must be one of {DOREFA_MODES}, got {mode!r}")
        super().__init__(k_bit=int(k_bit), mode=mode)
        self.precision = int(k_bit)


@register
class NoOp(Quantizer):
    """The identity, tagged with the ``precision`` (bits) of the values it passes through."""

    name, function = "no_op", staticmethod(no_op)

    def __init__(self, precision: int = 1):
        if int(precision) < 1:
            raise ValueError(f"no_op precision must be >= 1, got {precision!r}")
        super().__init__()
        self.precision = int(precision)

    def get_config(self) -> dict[str, Any]:
        return {"precision": self.precision}


# The plain functions are Keras-serializable too, so `Dense(..., activation=ste_sign)` saves.
for _cls in list(_REGISTRY.values()):
    keras.saving.register_keras_serializable(package="bnn", name=_cls.name)(_cls.function)
_FUNCTIONS = {cls.function: cls for cls in _REGISTRY.values()}


def names() -> list[str]:
    """The registered quantizer names, sorted."""
    return sorted(_REGISTRY)


def get(identifier: Any) -> Quantizer | Callable | None:
    """Resolves a quantizer from a name, a ``{"name": ..., **kwargs}`` dict, a Keras config dict,
    a :class:`Quantizer`, a plain callable, or ``None`` (no quantizer).

    Raises:
        ValueError: for an unknown name, listing the known ones.
    """
    if identifier is None or isinstance(identifier, Quantizer):
        return identifier
    if isinstance(identifier, str):
        if identifier not in _REGISTRY:
            raise ValueError(
                f"unknown quantizer {identifier!r}; known quantizers: {', '.join(names())}"
            )
        return _REGISTRY[identifier]()
    if isinstance(identifier, dict):
        if "class_name" in identifier:
            return keras.saving.deserialize_keras_object(identifier)
        config = dict(identifier)
        name = config.pop("name", None)
        if name not in _REGISTRY:
            raise ValueError(
                f"unknown quantizer {name!r}; known quantizers: {', '.join(names())}"
            )
        try:
            return _REGISTRY[name](**config)
        except TypeError as error:
            raise ValueError(f"bad arguments for quantizer {name!r}: {error}") from None
    if callable(identifier):
        return _FUNCTIONS[identifier]() if identifier in _FUNCTIONS else identifier
    raise ValueError(
        f"cannot use {identifier!r} as a quantizer; give a name ({', '.join(names())}), "
        "a dict, a callable or None"
    )


def serialize(quantizer: Quantizer | Callable | None) -> Any:
    """Inverse of :func:`get`: None, or a Keras-serialized object."""
    if quantizer is None:
        return None
    return keras.saving.serialize_keras_object(quantizer)
