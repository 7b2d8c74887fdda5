"""What every quantizer is: a light callable with a registered name and a config, found by
:func:`get` from a name, a dict, a Keras config, a callable or ``None``; and the bnn quantizer
another quantizer object stands for (:func:`equivalent`)."""

from __future__ import annotations

from typing import Any, Callable

import keras
import tensorflow as tf

__all__ = ["Quantizer", "register", "names", "get", "serialize", "equivalent"]

_REGISTRY: dict[str, type[Quantizer]] = {}
_FUNCTIONS: dict[Callable, type[Quantizer]] = {}


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
    """Class decorator: makes a quantizer class findable by ``cls.name`` and Keras-serializable,
    and its plain function too (so ``Dense(..., activation=ste_sign)`` saves)."""
    if not cls.name:
        raise ValueError(f"quantizer class {cls.__name__} needs a non-empty 'name' attribute")
    _REGISTRY[cls.name] = cls
    _FUNCTIONS[cls.function] = cls
    keras.saving.register_keras_serializable(package="bnn", name=cls.name)(cls.function)
    return keras.saving.register_keras_serializable(package="bnn")(cls)


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


def equivalent(quantizer: Any) -> Quantizer | None:
    """The bnn :class:`Quantizer` that computes exactly what ``quantizer`` computes, or None.

    A bnn quantizer is its own equivalent. Another object declares one through a
    ``bnn_quantizer()`` method returning a :class:`Quantizer` (or None), the same object while
    its settings stay the same (Keras tells shared objects apart by identity when it saves a
    model): bnn.larq's Keras-layer quantizers do, so binary layers run their fast paths with
    them and save them as bnn's.
    Anything else (a plain function, a Keras layer of one's own) has none and is called as it
    is.
    """
    if quantizer is None or isinstance(quantizer, Quantizer):
        return quantizer
    declared = getattr(type(quantizer), "bnn_quantizer", None)
    found = declared(quantizer) if callable(declared) else None
    return found if isinstance(found, Quantizer) else None


def serialize(quantizer: Quantizer | Callable | None) -> Any:
    """Inverse of :func:`get`: None, or the Keras config of ``quantizer``'s :func:`equivalent`
    where it has one (so it loads with bnn alone), else of ``quantizer`` itself."""
    if quantizer is None:
        return None
    return keras.saving.serialize_keras_object(equivalent(quantizer) or quantizer)
