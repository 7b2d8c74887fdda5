"""Which kernel runs: the one place that reads the CPU's flags, looks for a GPU, knows the batch
limits and resolves ``BNN_NATIVE_KERNELS``, ``BNN_PACKED_FORWARD`` and ``BNN_CONV_GRADIENTS``.

Layers, ops, optimizers and the packed model ask the functions here; they never inspect the
machine themselves. The measurements behind each rule are in docs/speed.md (training) and
docs/export.md (packed inference).

Native kernels (:mod:`bnn.native.build` compiles them on first use): ``BNN_NATIVE_KERNELS``
unset or ``auto`` runs the best variant this CPU has and prefers it where it beats the XLA
kernels (:func:`preferred`); ``0`` runs none; ``1`` prefers the best variant on any CPU;
``avx512``, ``avx2`` or ``generic`` prefers that variant on any CPU (so the AVX2 kernels can be
tested and timed on an AVX-512 machine). Where anything is missing (no compiler, no TensorFlow
headers, a failed build, a forced variant the CPU lacks), :func:`unavailable_reason` says why and
everything runs on pure-TensorFlow kernels, which give the same integers.
"""

from __future__ import annotations

import functools
import platform
import threading
from pathlib import Path
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from bnn import settings
from bnn.catalog import KERNEL_VARIANTS
from bnn.native import build
from bnn.native.ops import Ops

__all__ = ["cpu_flags", "cpu_model", "is_x86", "gpus", "has_gpu", "setting", "library", "available",
           "unavailable_reason", "variant", "variants", "preferred", "ops", "training_ops",
           "packed_forward", "conv_gradient_kernels", "xla_convolutions_faster",
           "packed_convolutions_native", "int8_matmul_available", "int8_first_layer_preferred",
           "batch_kind", "LARGE_BATCH", "EAGER_BATCH", "PATCHES_MIN_ROWS"]

#: Packed models run batches of at least this many examples as two concurrent halves (XLA
#: kernels) or on the native kernels spread over the intra-op threads; smaller batches run as
#: one XLA call.
LARGE_BATCH = 16
#: With native kernels, a packed MLP runs batches under this size as one eager native op.
EAGER_BATCH = 64
#: Kernel rows (``kh * kw * in_channels``) from which a bfloat16 binary convolution's kernel
#: gradient comes from the patches' sign bits (:func:`conv_gradient_kernels`).
PATCHES_MIN_ROWS = 1024


# ---- the machine ---------------------------------------------------------------------------

def _cpuinfo_field(name: str) -> str | None:
    """The first ``name`` field of Linux's /proc/cpuinfo; None where it cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(name):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux lists them in /proc/cpuinfo (``avx2``, ``avx512f``,
    ``avx512_vpopcntdq``, ``amx_bf16``, ...); empty where that file cannot be read."""
    return frozenset((_cpuinfo_field("flags") or "").split())


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what the platform module reports."""
    return _cpuinfo_field("model name") or platform.processor() or platform.machine()


def is_x86() -> bool:
    """Whether this is an x86-64 machine."""
    return platform.machine().lower() in ("x86_64", "amd64")


def _cpu_signature() -> str:
    """The CPU's model and instruction-set flags: a library built for one CPU may not run on
    another, so this is part of the build's cache key."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return platform.machine() + platform.processor()
    keep = [line for line in text.splitlines()[:40]
            if line.startswith(("model name", "flags", "Features", "CPU part"))]
    return "\n".join(keep)


def _target_flags() -> list[str]:
    """The compiler's target: on x86, a baseline x86-64 CPU (SSE4.2 and POPCNT where this CPU
    has them) tuned for this CPU, since the AVX2 and AVX-512 kernels carry their own
    per-function targets and TensorFlow's headers do not compile with every instruction set
    enabled (GCC 12 and AVX512-FP16); elsewhere, this CPU (``-march=native``)."""
    if not is_x86():
        return ["-march=native"]
    base = ["-msse4.2", "-mpopcnt"] if {"sse4_2", "popcnt"} <= cpu_flags() else []
    return [*base, "-mtune=native"]


def gpus() -> list[str]:
    """The GPUs TensorFlow sees, by name."""
    return [gpu.name for gpu in tf.config.list_physical_devices("GPU")]


def has_gpu() -> bool:
    """Whether TensorFlow sees a GPU."""
    return bool(tf.config.list_physical_devices("GPU"))


# ---- native kernels ------------------------------------------------------------------------

class _Native(NamedTuple):
    """The native kernels under one ``BNN_NATIVE_KERNELS`` setting."""

    library: object | None
    variant: str | None = None
    variants: tuple[str, ...] = ()
    reason: str | None = None


_native_by_setting: dict[str, _Native] = {}
_lock = threading.Lock()


def setting() -> str:
    """``BNN_NATIVE_KERNELS``, read (:func:`bnn.settings.native_kernels`).

    Raises:
        bnn.errors.SettingError: for a value it cannot read, in one line naming the variable
            and what it accepts.
    """
    return settings.native_kernels()


def _resolve(choice: str) -> _Native:
    if choice == "off":
        return _Native(None, reason="disabled by BNN_NATIVE_KERNELS")
    built = build.load(_target_flags(), _cpu_signature())
    if built.library is None:
        return _Native(None, reason=built.reason)
    if choice in KERNEL_VARIANTS and choice not in built.variants:
        return _Native(None, reason=f"BNN_NATIVE_KERNELS={choice}: this CPU lacks its "
                       f"instructions (it runs {', '.join(built.variants)})")
    return _Native(built.library, choice if choice in KERNEL_VARIANTS else built.variants[-1],
                   built.variants)


def _native() -> _Native:
    """The native kernels for the current :func:`setting`, resolved once per setting."""
    choice = setting()
    with _lock:
        if choice not in _native_by_setting:
            with tf.init_scope():  # eager, even when first asked while a function is traced
                _native_by_setting[choice] = _resolve(choice)
        return _native_by_setting[choice]


def library():
    """The loaded op library (building it on first use), or ``None`` where unavailable."""
    return _native().library


def available() -> bool:
    """Whether the native kernels are built and loaded."""
    return library() is not None


def unavailable_reason() -> str | None:
    """Why :func:`available` is False (``None`` when it is True)."""
    return _native().reason


def variant() -> str | None:
    """The variant the ops run by default: the one ``BNN_NATIVE_KERNELS`` names, else the best
    this CPU runs; ``None`` when the kernels are unavailable."""
    return _native().variant


def variants() -> tuple[str, ...]:
    """Every variant this CPU runs, slowest first; empty when the kernels are unavailable."""
    return _native().variants


def preferred() -> bool:
    """Whether bnn runs its native kernels where they apply: where they are available and run
    their AVX-512 or AVX2 variant, or on a CPU other than x86 (on x86 without AVX2 the generic
    variant counts bits one word at a time and the XLA kernels are faster);
    ``BNN_NATIVE_KERNELS=1`` (or a variant's name) prefers them on any CPU."""
    native = _native()
    if native.library is None:
        return False
    if setting() != "auto":
        return True
    return native.variant in ("avx512", "avx2") or not is_x86()


def ops(name: str | None = None) -> Ops:
    """The ops of the variant ``name`` (one of :func:`variants`; default :func:`variant`).

    Raises:
        RuntimeError: where the kernels are unavailable (:func:`unavailable_reason`).
        ValueError: for a variant this CPU does not run.
    """
    native = _native()
    if native.library is None:
        raise RuntimeError(f"native kernels unavailable: {native.reason}")
    chosen = name or native.variant
    if chosen not in native.variants:
        raise ValueError(f"kernel variant {chosen!r} does not run here; this CPU runs "
                         f"{', '.join(native.variants)}")
    return Ops(native.library, chosen)


# ---- training ------------------------------------------------------------------------------

def packed_forward(compute_dtype: str = "float32") -> bool:
    """Whether binary layers computing in ``compute_dtype`` take their ±1 forward products by
    xor-popcount: by default where TensorFlow sees no GPU (whose float products are faster) and
    the layer computes in float32, or in bfloat16 on a CPU without AMX (which multiplies
    bfloat16 faster than the packed product); off with ``BNN_PACKED_FORWARD=0``, on whatever
    the dtype with ``BNN_PACKED_FORWARD=1``."""
    choice = settings.packed_forward()
    if choice != "auto":
        return choice == "on"
    if has_gpu():
        return False
    return compute_dtype == "float32" or (compute_dtype == "bfloat16"
                                          and "amx_bf16" not in cpu_flags())


def training_ops(dtype: tf.DType, in_xla: bool) -> Ops | None:
    """The native kernels binary layers computing in ``dtype`` take their training products
    from, in a step that XLA does not compile (``in_xla`` False): for float32 or bfloat16
    where :func:`preferred`; ``None`` elsewhere, and the products stay XLA computations.
    Inference takes the XLA computations always, so a traced or exported model needs no
    custom op."""
    if in_xla or dtype not in (tf.float32, tf.bfloat16) or not preferred():
        return None
    return ops()


def xla_convolutions_faster() -> bool:
    """Whether XLA's backward convolutions beat TensorFlow's (oneDNN's) on this CPU: on CPUs
    without AVX-512."""
    return "avx512f" not in cpu_flags()


def conv_gradient_kernels(dtype: tf.DType = tf.float32, rows: int | None = None) -> str:
    """Which kernels compute a binary convolution's gradients in ``dtype``, for a kernel of
    ``rows = kh * kw * in_channels`` (``None``: any layer), where the model is not compiled by
    XLA:

    - ``"patches"``: the kernel gradient from the packed input's patches as sign bits,
      multiplied with the output gradient by table lookup; the input gradient TensorFlow's, or
      XLA's where :func:`xla_convolutions_faster`. Wherever the native kernels are
      :func:`preferred`, for float32 gradients and bfloat16 ones of at least
      :data:`PATCHES_MIN_ROWS` kernel rows (below that, each table of 256 sums serves too few
      rows).
    - ``"xla"``: both gradients as one XLA computation, elsewhere where
      :func:`xla_convolutions_faster` and no GPU is in sight.
    - ``"tensorflow"``: TensorFlow's backward convolutions, elsewhere.

    ``BNN_CONV_GRADIENTS`` overrides the choice for every layer."""
    choice = settings.conv_gradients()
    if choice != "auto":
        return choice
    if has_gpu():
        return "tensorflow"
    if preferred() and (dtype == tf.float32 or rows is None or rows >= PATCHES_MIN_ROWS):
        return "patches"
    return "xla" if xla_convolutions_faster() else "tensorflow"


# ---- packed inference ----------------------------------------------------------------------

def batch_kind(batch: int) -> str:
    """``"one"``, ``"small"`` (under :data:`LARGE_BATCH`) or ``"large"``: how a packed model
    runs a batch of this size."""
    return "one" if batch == 1 else "large" if batch >= LARGE_BATCH else "small"


def packed_convolutions_native() -> bool:
    """Whether a packed model's convolutions run on the native kernels for batches of
    :data:`LARGE_BATCH` or more (where :func:`preferred`): with their AVX2 variant; the AVX-512
    CPUs keep the XLA kernels."""
    return variant() == "avx2"


@functools.lru_cache(maxsize=1)
def int8_matmul_available() -> bool:
    """Whether this TensorFlow runs ``QuantizedMatMulWithBias`` (oneDNN builds, the default on
    x86 Linux; not with ``TF_ENABLE_ONEDNN_OPTS=0``) and it returns exact int32 products."""
    u = np.arange(12, dtype=np.uint8).reshape(2, 6) * 21
    w = np.where(np.arange(18).reshape(6, 3) % 4 == 1, 1, -1).astype(np.int8)
    try:
        with tf.init_scope():
            out = tf.raw_ops.QuantizedMatMulWithBias(
                a=tf.bitcast(tf.constant(u), tf.quint8), b=tf.bitcast(tf.constant(w), tf.qint8),
                bias=tf.zeros([3], tf.qint32), min_a=0.0, max_a=255.0, min_b=-127.0,
                max_b=127.0, Toutput=tf.qint32)[0]
            return bool(np.array_equal(tf.bitcast(out, tf.int32).numpy(),
                                       u.astype(np.int64) @ w))
    except (tf.errors.OpError, TypeError, ValueError):
        return False


def int8_first_layer_preferred() -> bool:
    """Whether, with native kernels, a packed model's integer first layer takes oneDNN's int8
    product (:func:`int8_matmul_available`) for batches of :data:`LARGE_BATCH` or more rather
    than the native pixel tables: where the kernels run their AVX-512 variant and the CPU has
    AVX-512 VNNI, whose int8 dot products beat the tables."""
    return variant() == "avx512" and "avx512_vnni" in cpu_flags()
