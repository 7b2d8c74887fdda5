"""Native xor-popcount kernels for packed inference and training, built on first use.

``xor_popcount.cc`` (next to this file) defines seven TensorFlow CPU ops in three instruction-set
variants: ``"avx512"`` (AVX-512 with VPOPCNTDQ), ``"avx2"`` (a nibble-table popcount over 256-bit
registers) and ``"generic"`` (plain C++): xor-popcount products of packed rows, the same
compared with thresholds and packed, or mapped to logits, thresholds of int32 products, the
exact first layer of 8-bit pixels (:meth:`Ops.pixel_table_sign`), a whole packed MLP in one call
(:meth:`Ops.packed_dense_chain`), and the ±1 convolution whose
float32 or bfloat16 dot products binary layers train with (:meth:`Ops.xor_popcount_conv2d`).
``adam_update.cc`` adds the one-pass Adam update (and weight clip) of :class:`bnn.optimizers.Adam`
(:meth:`Ops.adam_update`), ``sign_patches.cc`` the ±1 patches of a packed image that binary
convolutions take their kernel gradient from (:meth:`Ops.sign_patches`, as values or bits),
``sign_matmul.cc`` the products of sign bits with float32 matrices that binary layers take
their gradients from by table lookup (:meth:`Ops.sign_matmul`), and ``sign_pack.cc`` the
packing of float tensors' signs into words that these products read (:meth:`Ops.pack_signs`).
The first call to :func:`library` compiles them with the host's C++ compiler (``$CXX``, else ``g++``
or ``c++``) against the installed TensorFlow's headers (on x86 for a baseline x86-64 CPU, each
vector variant with its own per-function target, so one build runs every variant the CPU has),
caches the shared library under :func:`cache_dir`, loads it with ``tf.load_op_library``, asks it
which variants this CPU runs and checks each against numpy on a small case. Later processes load the
cached file (about 0.1 s); a build takes about 45 s on 2 cores.

``BNN_NATIVE_KERNELS`` (see :func:`setting`) chooses: unset or ``auto``, the best variant the CPU
runs, used by :class:`bnn.packing.PackedModel` where :func:`preferred`; ``0``, no native kernels;
``1``, the best variant, used on any CPU; ``avx512``, ``avx2`` or ``generic``, that variant, used
on any CPU (so the AVX2 kernels can be tested and timed on an AVX-512 machine).

When anything is missing (no compiler, no TensorFlow headers, a failed build or check, a forced
variant the CPU lacks) or ``BNN_NATIVE_KERNELS=0`` is set, :func:`library` returns ``None`` and
:func:`unavailable_reason` says why; :class:`bnn.packing.PackedModel` then uses its
pure-TensorFlow XLA kernels, which give the same integers, and binary layers train on their
XLA products (:func:`bnn.bitops.native_training_ops`). Nothing in bnn requires these kernels.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from bnn import cpu, progress, settings

__all__ = ["SOURCE", "SOURCES", "VARIANTS", "Ops", "cache_dir", "setting", "library", "available",
           "preferred", "variant", "variants", "unavailable_reason", "ops", "table_kernel",
           "xor_popcount", "xor_popcount_sign", "xor_popcount_affine", "threshold_pack",
           "pixel_table_sign", "adam_reference"]

SOURCE = Path(__file__).with_name("xor_popcount.cc")
#: Every source compiled into the library: the xor-popcount ops, the Adam update, the ±1
#: patches of packed images, the sign-bit matrix products and the packing of signs.
SOURCES = (SOURCE, *(SOURCE.with_name(name) for name in
                     ("adam_update.cc", "sign_patches.cc", "sign_matmul.cc", "sign_pack.cc")))
#: Headers the sources include (part of the build's cache key).
HEADERS = (SOURCE.with_name("native.h"),)
#: Instruction-set variants of the ops, slowest first.
VARIANTS = settings.KERNEL_VARIANTS
_BUILD_TIMEOUT_S = 600
_lock = threading.Lock()


class _Loaded(NamedTuple):
    """The outcome of building and loading for one :func:`setting`."""

    library: object | None
    variant: str | None = None
    variants: tuple[str, ...] = ()
    reason: str | None = None


_state: dict[str, _Loaded] = {}  # by setting


def cache_dir() -> Path:
    """Where built kernels are kept: ``$BNN_CACHE_DIR``, else ``$XDG_CACHE_HOME/bnn``, else
    ``~/.cache/bnn``."""
    if os.environ.get("BNN_CACHE_DIR"):
        return Path(os.environ["BNN_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "bnn"


def setting() -> str:
    """``BNN_NATIVE_KERNELS``, read (:func:`bnn.settings.native_kernels`): ``"auto"``, ``"off"``,
    ``"on"`` or a variant of :data:`VARIANTS`.

    Raises:
        bnn.errors.SettingError: for any other value, in one line naming the variable and what
            it accepts.
    """
    return settings.native_kernels()


def _cpu_signature() -> str:
    """The CPU's model and instruction-set flags (a build for one CPU may not run on another)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return platform.machine() + platform.processor()
    keep = [line for line in text.splitlines()[:40]
            if line.startswith(("model name", "flags", "Features", "CPU part"))]
    return "\n".join(keep)


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _target_flags() -> list[str]:
    """On x86, a baseline x86-64 target (SSE4.2 and POPCNT where the CPU has them), tuned for
    this CPU: the AVX2 and AVX-512 kernels carry their own per-function targets, and TensorFlow's
    headers do not compile with every instruction set enabled (GCC 12 and AVX512-FP16). Elsewhere,
    this CPU (``-march=native``)."""
    if not cpu.is_x86():
        return ["-march=native"]
    flags = cpu.flags()
    base = ["-msse4.2", "-mpopcnt"] if {"sse4_2", "popcnt"} <= flags else []
    return [*base, "-mtune=native"]


def _command(compiler: str, output: Path) -> list[str]:
    return [compiler, "-O3", *_target_flags(), "-ffp-contract=off", "-fno-math-errno", "-shared",
            "-fPIC", "-w", *(str(source) for source in SOURCES),
            "-o", str(output), *tf.sysconfig.get_compile_flags(), *tf.sysconfig.get_link_flags()]


def _build(choice: str) -> _Loaded:
    """Builds (or finds in the cache), loads and checks the library for ``choice``."""
    if choice == "off":
        return _Loaded(None, reason="disabled by BNN_NATIVE_KERNELS")
    if platform.system() != "Linux":
        return _Loaded(None, reason=f"native kernels are built on Linux only, not "
                       f"{platform.system()}")
    compiler = _compiler()
    if compiler is None:
        return _Loaded(None, reason="no C++ compiler found (set CXX or install g++)")
    command = _command(compiler, Path("OUT"))
    key = hashlib.sha256("\n".join([
        *(source.read_text() for source in (*SOURCES, *HEADERS)), tf.__version__,
        tf.sysconfig.get_lib(), compiler, *command, _cpu_signature()]).encode()).hexdigest()[:20]
    target = cache_dir() / f"xor_popcount-{key}.so"
    if not target.exists():
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
                partial = Path(tmp) / target.name
                with progress.phase("building the native kernels (once)"):
                    done = subprocess.run(_command(compiler, partial), capture_output=True,
                                          text=True, timeout=_BUILD_TIMEOUT_S)
                if done.returncode != 0:
                    errors = [line for line in done.stderr.splitlines() if "error" in line]
                    last = (errors or done.stderr.strip().splitlines() or ["no output"])[-1]
                    *others, last_name = (source.name for source in SOURCES)
                    names = f"{', '.join(others)} and {last_name}" if others else last_name
                    return _Loaded(None, reason=f"compiling {names} failed: "
                                   f"{last.strip()}")
                os.replace(partial, target)  # atomic: concurrent builders write the same file
        except (OSError, subprocess.SubprocessError) as exc:
            return _Loaded(None, reason=f"could not build native kernels in {target.parent}: "
                           f"{exc}")
    try:
        lib = tf.load_op_library(str(target))
        runs = tuple(name.decode() for name in lib.bnn_kernel_variants().numpy())
    except (tf.errors.OpError, OSError, AttributeError) as exc:
        return _Loaded(None, reason=f"could not load {target}: "
                       f"{str(exc).strip().splitlines()[0]}")
    if choice in VARIANTS and choice not in runs:
        return _Loaded(None, reason=f"BNN_NATIVE_KERNELS={choice}: this CPU lacks its "
                       f"instructions (it runs {', '.join(runs)})")
    problem = _self_check(lib, runs)
    if problem:
        return _Loaded(None, reason=problem)
    return _Loaded(lib, choice if choice in VARIANTS else runs[-1], runs)


def _pack_rows(values: np.ndarray) -> np.ndarray:
    """±1 rows -> int64 words, bit layout of ``bnn.packing.pack_bits`` along the last axis."""
    bits = values >= 0
    bits = np.pad(bits, [(0, 0), (0, -bits.shape[1] % 64)])
    packed = np.ascontiguousarray(np.packbits(bits, axis=1, bitorder="little"))
    return packed.view("<i8").astype(np.int64)


def _self_check(lib, runs: tuple[str, ...]) -> str | None:
    """Compares every variant in ``runs`` with numpy on a small case with ragged sizes."""
    rng = np.random.default_rng(7)
    x = np.where(rng.random((5, 130)) < 0.5, 1.0, -1.0)
    w = np.where(rng.random((130, 70)) < 0.5, 1.0, -1.0)
    dots = (x @ w).astype(np.int32)
    threshold = rng.integers(-20, 20, 70).astype(np.int32)
    flip = rng.random((1, 70)) < 0.5
    expected = _pack_rows(np.where((dots >= threshold) ^ flip, 1.0, -1.0))
    xw, ww = _pack_rows(x), np.ascontiguousarray(_pack_rows(w.T).T)
    fw = _pack_rows(np.where(flip, 1.0, -1.0))[0]
    pixels = rng.integers(0, 256, (5, 130)).astype(np.uint8)
    products = _pack_rows(np.where((pixels.astype(np.int64) @ w >= 100 * threshold) ^ flip,
                                   1.0, -1.0))
    table = table_kernel(ww, 130)
    scale = rng.normal(0, 1, 70).astype(np.float32)
    shift = rng.normal(0, 1, 70).astype(np.float32)
    logits = (dots * scale.astype(np.float64) + shift.astype(np.float64)).astype(np.float32)
    image = np.where(rng.random((2, 4, 5, 70)) < 0.5, 1.0, -1.0)
    filters = np.where(rng.random((2, 3, 70, 9)) < 0.5, 1.0, -1.0)
    conv = np.stack([np.stack([np.einsum("bhwc,hwcf->bf", image[:, i:i + 2, j:j + 3], filters)
                               for j in range(0, 3, 2)], 1) for i in range(3)], 1)
    image_words = _pack_rows(image.reshape(-1, 70)).reshape(2, 4, 5, 2)
    filter_words = np.ascontiguousarray(
        _pack_rows(filters.transpose(3, 0, 1, 2).reshape(-1, 70)).reshape(9, 12).T)
    for isa in runs:
        try:
            ok = (np.array_equal(130 - 2 * lib.bnn_xor_popcount(xw, ww, isa=isa).numpy(), dots)
                  and np.array_equal(lib.bnn_xor_popcount_sign(xw, ww, threshold, fw, n=130,
                                                                isa=isa).numpy(), expected)
                  and np.array_equal(lib.bnn_threshold_pack(dots, threshold, fw,
                                                            isa=isa).numpy(), expected)
                  and np.array_equal(lib.bnn_pixel_table_sign(
                      pixels, table, 100 * threshold, fw, scale=1.0, offset=0.0,
                      isa=isa).numpy(), products)
                  and np.array_equal(lib.bnn_xor_popcount_affine(
                      xw, ww, scale, shift, n=130, isa=isa).numpy(), logits)
                  and np.array_equal(lib.bnn_xor_popcount_conv2d(
                      image_words, filter_words, kh=2, kw=3, sh=1, sw=2, n=420, T=tf.float32,
                      isa=isa).numpy(), conv))
        except (tf.errors.OpError, AttributeError, TypeError, ValueError) as exc:
            return f"native kernels ({isa}) failed their check: {exc}"
        if not ok:
            return f"native kernels ({isa}) gave wrong results in their check"
    return (_adam_check(lib) or _patches_check(lib, runs) or _sign_matmul_check(lib, runs)
            or _pack_signs_check(lib, runs))


def _patches_check(lib, runs: tuple[str, ...]) -> str | None:
    """Compares the ±1 patches with numpy on a small case with strides and ragged channels."""
    rng = np.random.default_rng(13)
    image = np.where(rng.random((2, 5, 9, 70)) < 0.5, 1.0, -1.0)
    words = _pack_rows(image.reshape(-1, 70)).reshape(2, 5, 9, 2)
    expected = np.concatenate([image[:, i:i + 3:2, j:j + 7:3].reshape(-1, 70)
                               for i in range(2) for j in range(3)], axis=1).T
    for isa in runs:
        for dtype in (tf.float32, tf.bfloat16):
            try:
                got = lib.bnn_sign_patches(words, kh=2, kw=3, sh=2, sw=3, c=70, T=dtype,
                                           isa=isa).numpy()
            except (tf.errors.OpError, AttributeError, TypeError, ValueError) as exc:
                return f"native ±1 patches ({isa}) failed their check: {exc}"
            if not np.array_equal(got.astype(np.float64), expected):
                return (f"native ±1 patches ({isa}) gave wrong results in their check "
                        f"({dtype.name})")
    return None


def _sign_matmul_check(lib, runs: tuple[str, ...]) -> str | None:
    """Compares the sign-bit products with numpy on a small case with ragged sizes, in every
    layout."""
    rng = np.random.default_rng(17)
    s = np.where(rng.random((70, 75)) < 0.5, 1.0, -1.0)
    f = rng.integers(-8, 9, (75, 45)).astype(np.float32)  # small integers: every sum exact
    expected = s @ f
    along_q, along_m = _pack_rows(s), np.ascontiguousarray(_pack_rows(s.T).T)
    for isa in runs:
        try:
            got = [lib.bnn_sign_matmul(signs, operand, rows=rows, transpose_signs=rows >= 0,
                                       transpose_f=transpose_f, transpose_output=transpose,
                                       isa=isa).numpy()
                   for signs, rows in ((along_q, -1), (along_m, 70))
                   for transpose_f, operand in ((False, f), (True, f.T.copy()))
                   for transpose in (False, True)]
        except (tf.errors.OpError, AttributeError, TypeError, ValueError) as exc:
            return f"native sign-bit products ({isa}) failed their check: {exc}"
        if not all(np.array_equal(g, expected.T if i % 2 else expected)
                   for i, g in enumerate(got)):
            return f"native sign-bit products ({isa}) gave wrong results in their check"
    return None


def _pack_signs_check(lib, runs: tuple[str, ...]) -> str | None:
    """Compares the packing of signs with numpy on ragged sizes (with -0.0 and NaN), along
    either axis, float32 and bfloat16."""
    rng = np.random.default_rng(23)
    x = rng.normal(0, 1, (2, 70, 131)).astype(np.float32)
    x[0, 0, :3] = (-0.0, np.nan, 0.0)
    along_last = _pack_rows(x.reshape(-1, 131)).reshape(2, 70, -1)
    along_rows = np.stack([_pack_rows(plane.T) for plane in x])  # (2, 131, words(70))
    expected = (along_last, np.ascontiguousarray(along_rows.transpose(0, 2, 1)), along_rows)
    for isa in runs:
        for dtype in (tf.float32, tf.bfloat16):
            values = tf.cast(x, dtype)  # rounding keeps every sign
            try:
                got = [lib.bnn_pack_signs(values, along_rows=rows, transpose_output=turned,
                                          isa=isa).numpy()
                       for rows, turned in ((False, False), (True, False), (True, True))]
            except (tf.errors.OpError, AttributeError, TypeError, ValueError) as exc:
                return f"native sign packing ({isa}) failed its check: {exc}"
            if not all(np.array_equal(g, e) for g, e in zip(got, expected)):
                return f"native sign packing ({isa}) gave wrong results in its check ({dtype.name})"
    return None


def adam_reference(var, m, v, grad, alpha, beta1, beta2, epsilon, clip=np.inf):
    """:meth:`Ops.adam_update` in numpy float32, the same expressions in the same order."""
    f = np.float32
    var, m, v, grad = (np.asarray(a, f) for a in (var, m, v, grad))
    m = m + (grad - m) * (f(1) - f(beta1))
    v = v + (grad * grad - v) * (f(1) - f(beta2))
    var = var - (m * f(alpha)) / (np.sqrt(v) + f(epsilon))
    return np.clip(var, -f(clip), f(clip)), m, v


def _adam_check(lib) -> str | None:
    """Compares the Adam update with numpy on a small case, float32 and bfloat16 gradients."""
    rng = np.random.default_rng(11)
    var, m, grad = (rng.normal(0, 1, (3, 37)).astype(np.float32) for _ in range(3))
    v = np.abs(rng.normal(0, 1, (3, 37))).astype(np.float32)
    grad = (grad.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)  # exact in bfloat16
    expected = adam_reference(var, m, v, grad, 0.01, 0.9, 0.999, 1e-7, 1.0)
    for dtype in (tf.float32, tf.bfloat16):
        variables = [tf.Variable(value) for value in (var, m, v)]
        try:
            lib.bnn_adam_update(*(variable.handle for variable in variables),
                                tf.cast(grad, dtype), *(np.float32(value) for value in
                                                        (0.01, 0.9, 0.999, 1e-7, 1.0)))
        except (tf.errors.OpError, AttributeError, TypeError, ValueError) as exc:
            return f"native Adam update failed its check: {exc}"
        if not all(np.array_equal(g.numpy(), e) for g, e in zip(variables, expected)):
            return f"native Adam update gave wrong results in its check ({dtype.name} gradient)"
    return None


def _loaded() -> _Loaded:
    """The library for the current :func:`setting`, built or loaded once per setting and
    process."""
    choice = setting()
    with _lock:
        if choice not in _state:
            with tf.init_scope():  # eager, even when first asked while a function is traced
                _state[choice] = _build(choice)
        return _state[choice]


def library():
    """The loaded op library (building it on first use), or ``None`` if unavailable.

    Raises:
        bnn.errors.SettingError: for a ``BNN_NATIVE_KERNELS`` value :func:`setting` cannot read.
    """
    return _loaded().library


def variant() -> str | None:
    """The variant the ops run by default: the one ``BNN_NATIVE_KERNELS`` names, else the best
    this CPU runs; ``None`` when the kernels are unavailable."""
    return _loaded().variant


def variants() -> tuple[str, ...]:
    """Every variant this CPU runs, slowest first (each checked against numpy); empty when the
    kernels are unavailable."""
    return _loaded().variants


def preferred() -> bool:
    """Whether :class:`bnn.packing.PackedModel` uses these kernels by default: where they are
    available and run their AVX-512 or AVX2 variant, or on a CPU other than x86; on an x86 CPU
    without AVX2 the generic variant counts bits one word at a time and the XLA kernels are
    faster. ``BNN_NATIVE_KERNELS=1`` (or a variant's name) prefers them on any CPU.

    The AVX2 variant against the XLA kernels, both restricted to AVX2 (``BNN_NATIVE_KERNELS=avx2``,
    ``XLA_FLAGS=--xla_cpu_max_isa=AVX2``) on an AVX-512 CPU, one thread, process CPU time: a
    2048x2048 packed layer took 0.65-0.68x the XLA kernel's time at batch 100 and 0.17x at batch
    1 (docs/export.md)."""
    loaded = _loaded()
    if loaded.library is None:
        return False
    if setting() != "auto":
        return True
    return loaded.variant in ("avx512", "avx2") or not cpu.is_x86()


def available() -> bool:
    """Whether the native kernels are built, loaded and checked."""
    return library() is not None


def unavailable_reason() -> str | None:
    """Why :func:`available` is False (``None`` when it is True)."""
    return _loaded().reason


class Ops:
    """The native ops of one variant, looked up once (see :func:`ops`): for code that calls them
    many times, such as :class:`bnn.packing.PackedModel` on small batches. Inputs are tensors or
    arrays of the stated dtypes."""

    def __init__(self, lib, variant: str):
        self._lib, self.variant = lib, variant

    def xor_popcount(self, x_words: tf.Tensor, w_words: tf.Tensor) -> tf.Tensor:
        """``(batch, units)`` int32 ``sum_k popcount(x[b, k] XOR w[k, u])`` for int64 words
        ``x`` ``(batch, words)`` and ``w`` ``(words, units)``."""
        return self._lib.bnn_xor_popcount(x_words, w_words, isa=self.variant)

    def xor_popcount_sign(self, x_words: tf.Tensor, w_words: tf.Tensor, threshold: tf.Tensor,
                          flip: tf.Tensor, n: int) -> tf.Tensor:
        """Packed bits ``[n - 2 * xor_popcount(x, w) >= threshold] XOR flip``, ``(batch,
        ceil(units / 64))`` int64, for ``n`` real bits per row."""
        return self._lib.bnn_xor_popcount_sign(x_words, w_words, threshold, flip, n=int(n),
                                               isa=self.variant)

    def xor_popcount_affine(self, x_words: tf.Tensor, w_words: tf.Tensor, scale: tf.Tensor,
                            shift: tf.Tensor, n: int) -> tf.Tensor:
        """float32 ``(batch, units)`` ``a * scale + shift`` for the dot products ``a = n - 2 *
        xor_popcount(x, w)``, computed in float64 and rounded once to float32 (the product is
        exact, so this is the rounding of XLA's fused multiply-add)."""
        return self._lib.bnn_xor_popcount_affine(x_words, w_words, scale, shift, n=int(n),
                                                 isa=self.variant)

    def xor_popcount_conv2d(self, x_words: tf.Tensor, w_words: tf.Tensor,
                            kernel_size: tuple[int, int], strides: tuple[int, int], n: int,
                            dtype: tf.DType = tf.float32) -> tf.Tensor:
        """The "valid" ±1 convolution ``n - 2 * mismatches`` in ``dtype`` (float32 or bfloat16),
        ``(batch, ho, wo, units)``, of ``x`` ``(batch, h, w, words)`` packed along its channels
        and a ``(kh, kw, c, units)`` kernel packed along ``c`` and flattened over its taps to
        ``(kh * kw * words, units)``, as :func:`bnn.bitops.xor_popcount_conv2d` takes them."""
        (kh, kw), (sh, sw) = kernel_size, strides
        return self._lib.bnn_xor_popcount_conv2d(x_words, w_words, kh=int(kh), kw=int(kw),
                                                 sh=int(sh), sw=int(sw), n=int(n), T=dtype,
                                                 isa=self.variant)

    def adam_update(self, var, m, v, grad: tf.Tensor, alpha: tf.Tensor, beta1: tf.Tensor,
                    beta2: tf.Tensor, epsilon: tf.Tensor, clip: tf.Tensor = float("inf")):
        """One Adam step, in place, on the float32 resource variables ``var``, ``m`` and ``v``
        (TensorFlow variables or their handles) with a float32 or bfloat16 ``grad`` and the
        step's rate ``alpha = lr * sqrt(1 - beta2^t) / (1 - beta1^t)``, in TensorFlow's
        ``ApplyAdam`` expressions, ``var`` then clipped to ``[-clip, clip]``: one pass over
        memory. Returns the op (``None`` eagerly)."""
        handles = (getattr(variable, "handle", variable) for variable in (var, m, v))
        scalars = (tf.cast(value, tf.float32) for value in (alpha, beta1, beta2, epsilon, clip))
        return self._lib.bnn_adam_update(*handles, grad, *scalars)

    def sign_patches(self, x_words: tf.Tensor, kernel_size: tuple[int, int],
                     strides: tuple[int, int], channels: int, dtype: tf.DType = tf.float32
                     ) -> tf.Tensor:
        """The transposed "valid" patches (im2col) of ``x`` ``(batch, h, w, words)``, packed
        along its ``channels``, as ±1 in ``dtype`` (float32 or bfloat16): ``(kh * kw *
        channels, batch * ho * wo)``, row ``(i * kw + j) * channels + k``, column ``(b * ho + y)
        * wo + x`` holding channel ``k`` of pixel ``(b, y * sh + i, x * sw + j)``. Times the
        output gradient ``(batch * ho * wo, filters)``, the convolution's kernel gradient."""
        (kh, kw), (sh, sw) = kernel_size, strides
        return self._lib.bnn_sign_patches(x_words, kh=int(kh), kw=int(kw), sh=int(sh),
                                          sw=int(sw), c=int(channels), T=dtype,
                                          isa=self.variant)

    def sign_matmul(self, signs: tf.Tensor, f: tf.Tensor, rows: int | None = None,
                    transpose_f: bool = False, transpose_output: bool = False) -> tf.Tensor:
        """float32 ``s @ f`` for float32 ``f`` ``(q, p)`` (given as ``(p, q)`` with
        ``transpose_f``) and the ±1 matrix ``s`` ``(m, q)`` given by its sign bits, +1 where set,
        packed as :func:`bnn.bitops.pack` packs: along ``q``, int64 ``(m, ceil(q / 64))``; or,
        with ``rows=m``, along ``m``, int64 ``(ceil(m / 64), q)``. ``(p, m)`` with
        ``transpose_output``. Each output row's sum is looked up 8 rows of ``f`` at a time in
        tables of their 256 signed sums: ``q / 8`` additions per value instead of ``q``
        multiply-adds; equal to the float product up to rounding."""
        return self._lib.bnn_sign_matmul(signs, f, rows=-1 if rows is None else int(rows),
                                         transpose_signs=rows is not None,
                                         transpose_f=bool(transpose_f),
                                         transpose_output=bool(transpose_output),
                                         isa=self.variant)

    def pack_signs(self, x: tf.Tensor, along_rows: bool = False, transpose_output: bool = False
                   ) -> tf.Tensor:
        """The signs of float32 or bfloat16 ``x`` packed into int64 words as
        :func:`bnn.bitops.pack` packs ``x >= 0``: along the last axis, ``(..., n)`` ->
        ``(..., ceil(n / 64))``; with ``along_rows``, along the second-last, ``(..., r, c)`` ->
        ``(..., ceil(r / 64), c)``, or ``(..., c, ceil(r / 64))`` with ``transpose_output``.
        One pass over ``x`` (vector comparisons and their masks, 64x64 bit transposes along the
        rows)."""
        return self._lib.bnn_pack_signs(x, along_rows=bool(along_rows),
                                        transpose_output=bool(transpose_output),
                                        isa=self.variant)

    def threshold_pack(self, a: tf.Tensor, threshold: tf.Tensor, flip: tf.Tensor) -> tf.Tensor:
        """Packed bits ``[a >= threshold] XOR flip`` of int32 ``a`` ``(batch, units)``."""
        return self._lib.bnn_threshold_pack(a, threshold, flip, isa=self.variant)

    def pixel_table_sign(self, u: tf.Tensor, w_table: tf.Tensor, threshold: tf.Tensor,
                         flip: tf.Tensor, encoding: dict[str, float] | None = None
                         ) -> tf.Tensor:
        """Packed bits ``[u . w >= threshold] XOR flip`` for pixels ``u`` ``(batch, ...)`` in
        [0, 255] (each example flattened) and a ±1 kernel ``w`` given as :func:`table_kernel`,
        exact. ``u`` is uint8, or float32 ``x`` with ``encoding`` ``{"scale": s, "offset":
        o}``, encoded to ``clip(round((x - o) / s), 0, 255)``.

        With ``u . w = 2 * (u . b) - sum(u)`` for the weight bits ``b`` and ``u = 16 * h + l``
        for the pixels' nibbles, ``u . b = 16 * (h . b) + l . b``; per group of 4 pixels, the
        16 sums of their low (high) nibbles over the subsets of the group form a table that
        each unit's 4 weight bits index."""
        scale, offset = (1.0, 0.0) if encoding is None else (encoding["scale"],
                                                             encoding["offset"])
        # every attribute given: eager calls that leave one at its default cost about 18 us more
        return self._lib.bnn_pixel_table_sign(u, w_table, threshold, flip, scale=float(scale),
                                              offset=float(offset), isa=self.variant)

    def packed_dense_chain(self, u: tf.Tensor, first: tuple, hidden: Sequence[tuple],
                           last: tuple, encoding: dict[str, float] | None = None) -> tf.Tensor:
        """float32 logits of a packed MLP in one call: :meth:`pixel_table_sign` with ``first =
        (w_table, threshold, flip)``, then :meth:`xor_popcount_sign` for each ``(w_words,
        threshold, flip)`` of ``hidden`` and :meth:`xor_popcount_affine` with ``last = (w_words,
        scale, shift)``, each layer's ``n`` the units of the one before it. The same logits as
        those calls one after the other, without their dispatch between layers (on small
        batches most of the time)."""
        scale, offset = (1.0, 0.0) if encoding is None else (encoding["scale"],
                                                             encoding["offset"])
        kernels, thresholds, flips = ([layer[i] for layer in hidden] for i in range(3))
        return self._lib.bnn_packed_dense_chain(u, *first, kernels, thresholds, flips, *last,
                                                scale=float(scale), offset=float(offset),
                                                isa=self.variant)


def table_kernel(w_words: np.ndarray, n: int) -> np.ndarray:
    """The ±1 kernel of packed words ``w_words`` ``(ceil(n / 64), units)`` in the layout of
    :meth:`Ops.pixel_table_sign`: uint8 ``(blocks, groups, 32)``, ``groups = ceil(n / 4)``,
    ``blocks = 2 * ceil(units / 64)``; byte ``[u // 32, g, u % 32]`` holds bits ``4 g`` to
    ``4 g + 3`` of unit ``u``'s weights (1 for +1; bits past ``n`` and pad units 0)."""
    w_words = np.asarray(w_words, np.int64)
    units = w_words.shape[1]
    groups, blocks = -(-n // 4), 2 * -(-units // 64)
    as_bytes = np.ascontiguousarray(w_words.T).astype("<i8").view(np.uint8)
    bits = np.unpackbits(as_bytes, axis=1, bitorder="little")[:, :n]  # (units, n)
    bits = np.pad(bits, [(0, blocks * 32 - units), (0, groups * 4 - n)])
    nibbles = (bits.reshape(blocks * 32, groups, 4) << np.arange(4, dtype=np.uint8)).sum(-1)
    return np.ascontiguousarray(
        nibbles.reshape(blocks, 32, groups).transpose(0, 2, 1).astype(np.uint8))


def ops(variant: str | None = None) -> Ops:
    """The ops of ``variant`` (one of :func:`variants`; default :func:`variant`).

    Raises:
        RuntimeError: where the kernels are unavailable (:func:`unavailable_reason`).
        ValueError: for a variant this CPU does not run.
    """
    loaded = _loaded()
    if loaded.library is None:
        raise RuntimeError(f"native kernels unavailable: {loaded.reason}")
    chosen = variant or loaded.variant
    if chosen not in loaded.variants:
        raise ValueError(f"kernel variant {chosen!r} does not run here; this CPU runs "
                         f"{', '.join(loaded.variants)}")
    return Ops(loaded.library, chosen)


def xor_popcount(x_words: tf.Tensor, w_words: tf.Tensor, variant: str | None = None
                 ) -> tf.Tensor:
    """:meth:`Ops.xor_popcount` of ``variant`` (default: :func:`variant`)."""
    return ops(variant).xor_popcount(x_words, w_words)


def xor_popcount_sign(x_words: tf.Tensor, w_words: tf.Tensor, threshold: tf.Tensor,
                      flip: tf.Tensor, n: int, variant: str | None = None) -> tf.Tensor:
    """:meth:`Ops.xor_popcount_sign` of ``variant`` (default: :func:`variant`)."""
    return ops(variant).xor_popcount_sign(x_words, w_words, threshold, flip, n)


def xor_popcount_affine(x_words: tf.Tensor, w_words: tf.Tensor, scale: tf.Tensor,
                        shift: tf.Tensor, n: int, variant: str | None = None) -> tf.Tensor:
    """:meth:`Ops.xor_popcount_affine` of ``variant`` (default: :func:`variant`)."""
    return ops(variant).xor_popcount_affine(x_words, w_words, scale, shift, n)


def threshold_pack(a: tf.Tensor, threshold: tf.Tensor, flip: tf.Tensor,
                   variant: str | None = None) -> tf.Tensor:
    """:meth:`Ops.threshold_pack` of ``variant`` (default: :func:`variant`)."""
    return ops(variant).threshold_pack(a, threshold, flip)


def pixel_table_sign(u: tf.Tensor, w_table: tf.Tensor, threshold: tf.Tensor, flip: tf.Tensor,
                     encoding: dict[str, float] | None = None, variant: str | None = None
                     ) -> tf.Tensor:
    """:meth:`Ops.pixel_table_sign` of ``variant`` (default: :func:`variant`)."""
    return ops(variant).pixel_table_sign(u, w_table, threshold, flip, encoding)
