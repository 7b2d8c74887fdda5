"""Saving ``bnn.larq`` objects as the bnn classes they map to."""

from __future__ import annotations

from typing import Callable

import keras


def saves_as(core: type) -> Callable[[type], type]:
    """Class decorator: instances of the decorated class are saved as instances of ``core``, the
    bnn class it specializes, so ``keras.saving.load_model`` rebuilds them as ``core`` after
    ``import bnn`` alone.

    Two things make that so. The class is registered under ``core``'s Keras name (e.g.
    ``"bnn>BinaryDense"``), which its saved configs then carry; and its ``__name__`` becomes
    ``core.__name__``, because Keras 3 files a layer's weights inside a saved model under the
    snake-cased ``__name__`` of its class (``layers/binary_dense``). The class keeps its own
    ``__qualname__`` (``QuantDense``), which ``repr`` and tracebacks show.

    The decorated class must return, from ``get_config``, a config that ``core`` accepts and
    that gives a ``core`` instance computing the same outputs.
    """

    def decorate(cls: type) -> type:
        package, _, name = keras.saving.get_registered_name(core).partition(">")
        keras.saving.register_keras_serializable(package, name)(cls)   # cls -> core's name
        keras.saving.register_keras_serializable(package, name)(core)  # core's name -> core
        cls.__name__ = core.__name__
        return cls

    return decorate
