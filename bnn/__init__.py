"""bnn: binarized neural networks on TensorFlow with Keras 3.

``import bnn`` imports bnn's modules, which registers every layer, quantizer, constraint,
optimizer, loss and schedule with Keras, so ``keras.models.load_model`` reads bnn models without
``custom_objects``. Importing bnn changes no process-wide setting: TensorFlow's CPU allocator and
log level are chosen by the ``bnn`` command and the benchmarks, or by you (see
:mod:`bnn.allocator`).

The ``bnn`` command and the scripts in ``benchmarks/`` defer these imports, and TensorFlow with
them, until they have checked their command line (see :mod:`bnn.cli`) and can start TensorFlow
without its start-up log lines (:mod:`bnn.startup`); there the names below load on first use, and
:func:`import_all` loads them all.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

__version__ = "0.1.0"

_MODULES = ("allocator", "constraints", "gradients", "layers", "losses", "metrics", "models",
            "normalization", "optimizers", "pooling", "quantizers", "schedules")
_NAMES = {"WeightClip": "constraints", "GradientReversal": "gradients",
          "custom_gradient": "gradients", "reverse_gradient": "gradients",
          "straight_through": "gradients", "BinaryConv2D": "layers", "BinaryDense": "layers",
          "ste_sign": "quantizers"}

__all__ = [*_MODULES, *_NAMES, "import_all", "__version__"]


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return importlib.import_module(f"bnn.{name}")
    if name in _NAMES:
        value = getattr(importlib.import_module(f"bnn.{_NAMES[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'bnn' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def import_all() -> None:
    """Imports every public module of bnn (and TensorFlow), registering bnn's Keras objects."""
    for module in _MODULES:
        importlib.import_module(f"bnn.{module}")


def _is_bnn_entry_point() -> bool:
    """Whether this process is one of bnn's own entry points, which check their input and then
    start TensorFlow themselves (:mod:`bnn.startup`): the ``bnn`` command (its console script,
    ``python -m bnn`` or ``python -m bnn.cli``) or a script in the source tree's
    ``benchmarks/``."""
    if sys.argv and os.path.basename(sys.argv[0]) in ("bnn", "bnn.exe", "bnn-script.py"):
        return True
    if sys.argv and sys.argv[0].endswith(".py"):
        script = os.path.realpath(sys.argv[0])
        benchmarks = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))),
                                  "benchmarks")
        if os.path.dirname(script) == benchmarks:
            return True
    argv = getattr(sys, "orig_argv", [])
    return any(flag == "-m" and module in ("bnn", "bnn.cli")
               for flag, module in zip(argv, argv[1:]))


if not _is_bnn_entry_point():
    import_all()
