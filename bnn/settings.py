"""The environment, read (and, for TensorFlow's start-up, written) in one place, without
importing TensorFlow.

Every environment variable bnn looks at is read here and nowhere else; the rest of bnn takes
the values these functions return.

Kernel choices (:mod:`bnn.native.dispatch` decides what ``"auto"`` means). Each reader returns
one of its allowed words, ``"auto"`` when the variable is unset or empty, and raises
:class:`bnn.errors.SettingError` (one line naming the variable, its value and the allowed ones)
for anything else, so that a misspelt setting stops a run before it starts:

- ``BNN_PACKED_FORWARD``: ``on`` / ``off`` / ``auto``, whether binary layers compute their
  forward products by xor-popcount;
- ``BNN_CONV_GRADIENTS``: ``xla`` / ``patches`` / ``tensorflow`` / ``auto``, which kernels
  compute binary convolutions' gradients outside XLA-compiled models;
- ``BNN_NATIVE_KERNELS``: ``on`` / ``off`` / ``auto`` or a variant of
  :data:`bnn.catalog.KERNEL_VARIANTS`, whether and which native kernels run.

Places and tools: ``BNN_CACHE_DIR`` (built kernels), ``CXX`` (the C++ compiler),
``BNN_DATA_DIR`` and ``BNN_DATA_URL`` (dataset files), ``KERAS_HOME`` (Keras' dataset cache),
``TF_CONFIG`` (multi-worker training), ``BNN_TF_LOG`` (TensorFlow's own log lines).

TensorFlow's process-wide switches that bnn sets before TensorFlow starts:
``TF_CPU_ALLOCATOR_USE_BFC`` (:func:`select_pooling_allocator`) and ``TF_CPP_MIN_LOG_LEVEL``
(:func:`quiet_tensorflow_logs`).
"""

from __future__ import annotations

import os
from pathlib import Path

from bnn.catalog import CONV_GRADIENT_KERNELS, KERNEL_VARIANTS
from bnn.errors import SettingError

__all__ = ["packed_forward", "conv_gradients", "native_kernels", "check", "cache_dir",
           "compilers", "data_dir", "data_url", "keras_home", "tf_config", "tensorflow_log",
           "quiet_tensorflow_logs", "ALLOCATOR_VARIABLE", "select_pooling_allocator",
           "allocator_name"]

_SWITCH = {"0": "off", "false": "off", "off": "off", "no": "off",
           "1": "on", "true": "on", "on": "on", "yes": "on", "auto": "auto"}
_TRUE = ("1", "true", "yes", "on")


def _get(variable: str) -> str:
    """The variable's value, ``""`` when unset."""
    return os.environ.get(variable, "")


def _read(variable: str, words: dict[str, str], allowed: str) -> str:
    raw = _get(variable).strip().lower()
    if not raw:
        return "auto"
    if raw not in words:
        raise SettingError(f"{variable} must be {allowed}, got {raw!r}; unset it for the default")
    return words[raw]


def packed_forward() -> str:
    """``BNN_PACKED_FORWARD``: ``"on"`` (1, true, yes), ``"off"`` (0, false, no) or ``"auto"``."""
    return _read("BNN_PACKED_FORWARD", _SWITCH, "0, 1 or auto")


def conv_gradients() -> str:
    """``BNN_CONV_GRADIENTS``: ``"xla"``, ``"patches"``, ``"tensorflow"`` or ``"auto"``."""
    words = {w: w for w in (*CONV_GRADIENT_KERNELS, "auto")}
    return _read("BNN_CONV_GRADIENTS", words, "'auto', 'xla', 'patches' or 'tensorflow'")


def native_kernels() -> str:
    """``BNN_NATIVE_KERNELS``: ``"on"``, ``"off"``, ``"auto"`` or a variant of
    :data:`bnn.catalog.KERNEL_VARIANTS`."""
    return _read("BNN_NATIVE_KERNELS", {**_SWITCH, **{v: v for v in KERNEL_VARIANTS}},
                 f"auto, 0, 1, {', '.join(KERNEL_VARIANTS)}")


def check() -> None:
    """Reads every kernel setting, raising :class:`SettingError` for the first unreadable one."""
    packed_forward()
    conv_gradients()
    native_kernels()


def cache_dir() -> Path:
    """Where built kernels are kept: ``$BNN_CACHE_DIR``, else ``$XDG_CACHE_HOME/bnn``, else
    ``~/.cache/bnn``."""
    if _get("BNN_CACHE_DIR"):
        return Path(_get("BNN_CACHE_DIR"))
    return Path(_get("XDG_CACHE_HOME") or Path.home() / ".cache") / "bnn"


def compilers() -> list[str]:
    """C++ compilers to look for, in order: ``$CXX`` (when set), ``g++``, ``c++``, ``clang++``."""
    return [name for name in (_get("CXX"), "g++", "c++", "clang++") if name]


def data_dir() -> str | None:
    """``BNN_DATA_DIR``: the first folder searched for dataset files; None when unset."""
    return _get("BNN_DATA_DIR") or None


def data_url() -> str | None:
    """``BNN_DATA_URL``: where dataset files are downloaded from; None when unset."""
    return _get("BNN_DATA_URL") or None


def keras_home() -> Path:
    """``$KERAS_HOME``, else ``~/.keras`` (Keras keeps downloaded datasets in its ``datasets``
    folder)."""
    return Path(os.path.expanduser(_get("KERAS_HOME") or os.path.join("~", ".keras")))


def tf_config() -> str:
    """``TF_CONFIG``, the multi-worker cluster of this process (JSON); ``""`` when unset."""
    return _get("TF_CONFIG")


def tensorflow_log() -> bool:
    """``BNN_TF_LOG``: whether TensorFlow's own log lines are shown (1, true, yes, on)."""
    return _get("BNN_TF_LOG").strip().lower() in _TRUE


def quiet_tensorflow_logs() -> None:
    """Keeps TensorFlow's informational lines and warnings out (``TF_CPP_MIN_LOG_LEVEL=2``),
    unless the variable is set already. TensorFlow reads it when its libraries load."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


#: TensorFlow's switch for its pooling (BFC) CPU allocator.
ALLOCATOR_VARIABLE = "TF_CPU_ALLOCATOR_USE_BFC"


def select_pooling_allocator() -> None:
    """Selects TensorFlow's pooling CPU allocator by setting ``TF_CPU_ALLOCATOR_USE_BFC=true``,
    unless that variable is set already (``false`` keeps TensorFlow's default).

    TensorFlow's default CPU allocator passes every request to the C library, which on Linux
    maps fresh pages for each block above 32 MiB and unmaps them when the block is freed, so an
    XLA-compiled train step whose scratch memory is larger page-faults through all of it on
    every step (docs/speed.md); the pooling allocator keeps freed blocks for reuse. Every
    ``bnn`` command that runs TensorFlow calls this, and so do the scripts in ``benchmarks/``.
    In your own script, call it before TensorFlow's first operation: TensorFlow reads the
    variable when it first allocates CPU memory, and subprocesses inherit it."""
    os.environ.setdefault(ALLOCATOR_VARIABLE, "true")


def allocator_name() -> str:
    """``"bfc"`` or ``"default"``: the CPU allocator ``TF_CPU_ALLOCATOR_USE_BFC`` asks
    TensorFlow for (as TensorFlow parses it: true/1 or false/0, any case)."""
    return "bfc" if _get(ALLOCATOR_VARIABLE).strip().lower() in ("true", "1") else "default"
