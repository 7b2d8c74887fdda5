"""bnn: binarized neural networks on TensorFlow with Keras 3.

``import bnn`` is instant and does the same in every process: it imports neither TensorFlow nor
the rest of bnn. The names below load on first use (``bnn.BinaryDense``, ``bnn.ste_sign``,
``bnn.models.build``, ...), and bnn's layers, quantizers, constraints, optimizers, losses and
schedules register themselves with Keras as soon as Keras is loaded, by your script or by bnn,
so ``keras.saving.load_model`` reads bnn models without ``custom_objects``. :func:`import_all`
loads them at once.

The package, by concern (imports point down this list only)::

    cli, tools           the bnn command; benchmarks and reports
    train, packed        training from experiment files; packed inference and .bnn files
    models, optimizers   architectures and their float twins; Adam, Bop, routing
    layers               binary layers, their activations, normalization, pooling, constraints
    quantizers           sign and its family, by name
    ops                  custom gradients, sign, the bit layout, xor-popcount products
    native               C++ kernels, their build, and the one place that picks a kernel
    catalog, settings, errors, progress, files   names, environment, errors (no TensorFlow)

``larq`` is Larq's API on bnn (``import bnn.larq as lq``).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from typing import Any

__version__ = "0.1.0"

#: ``bnn.<name>`` for the public names, and the modules they live in.
_NAMES = {
    "BinaryDense": "bnn.layers", "BinaryConv2D": "bnn.layers", "WeightClip": "bnn.layers",
    "GradientReversal": "bnn.layers", "ste_sign": "bnn.quantizers",
    "custom_gradient": "bnn.ops.gradients", "straight_through": "bnn.ops.gradients",
    "reverse_gradient": "bnn.ops.gradients",
}
#: ``bnn.<name>`` for modules, including the short names earlier versions documented.
_MODULES = {
    **{name: f"bnn.{name}" for name in (
        "catalog", "cli", "errors", "files", "larq", "layers", "models", "native", "ops",
        "optimizers", "packed", "progress", "quantizers", "settings", "tools", "train")},
    "allocator": "bnn.settings", "config": "bnn.train.config",
    "constraints": "bnn.layers.constraints", "data": "bnn.train.data",
    "export": "bnn.packed.export", "gradients": "bnn.ops.gradients",
    "losses": "bnn.train.losses", "metrics": "bnn.train.metrics",
    "normalization": "bnn.layers.normalization", "pooling": "bnn.layers.pooling",
    "schedules": "bnn.train.schedules", "summary": "bnn.models.summary",
}
#: The modules whose import registers bnn's objects with Keras.
_KERAS_MODULES = ("bnn.layers", "bnn.quantizers", "bnn.optimizers", "bnn.train.losses",
                  "bnn.train.schedules")

__all__ = [*_NAMES, *_MODULES, "import_all", "__version__"]


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return importlib.import_module(_MODULES[name])
    if name in _NAMES:
        value = getattr(importlib.import_module(_NAMES[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'bnn' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def import_all() -> None:
    """Imports bnn's Keras objects (and TensorFlow), registering them with Keras."""
    for module in _KERAS_MODULES:
        importlib.import_module(module)


class _EarlierNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import bnn.data`` (and ``from bnn.config import ...``, for every module name in
    :data:`_MODULES` that earlier versions documented) gives the module that now holds it."""

    def find_spec(self, name, path, target=None):
        if name.startswith("bnn.") and _MODULES.get(name[4:], name) != name:
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):
        return importlib.import_module(_MODULES[spec.name[4:]])

    def exec_module(self, module):
        pass


class _RegisterWhenKerasLoads(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when ``keras`` is first imported, it lets the import run as usual
    and then calls :func:`import_all`, once."""

    def find_spec(self, name, path, target=None):
        if name != "keras":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            loader_exec = spec.loader.exec_module

            def exec_module(module):
                loader_exec(module)
                import_all()

            spec.loader.exec_module = exec_module  # this spec's own loader
        return spec


if not any(isinstance(finder, _EarlierNames) for finder in sys.meta_path):
    sys.meta_path.append(_EarlierNames())
if "keras" in sys.modules:
    import_all()
elif not any(isinstance(finder, _RegisterWhenKerasLoads) for finder in sys.meta_path):
    sys.meta_path.insert(0, _RegisterWhenKerasLoads())
