"""Native xor-popcount kernels for packed inference, built on first use.

``xor_popcount.cc`` (next to this file) defines four TensorFlow CPU ops, vectorized with
AVX-512 VPOPCNTDQ where the CPU has it. The first call to :func:`library` compiles it with the
host's C++ compiler (``$CXX``, else ``g++`` or ``c++``) for this CPU (``-march=native``) against the
installed TensorFlow's headers, caches the shared library under :func:`cache_dir`, loads it with
``tf.load_op_library`` and checks it against numpy on a small case. Later processes load the
cached file (about 0.1 s); a build takes about 15 s.

When anything is missing (no compiler, no TensorFlow headers, a failed build or check) or
``BNN_NATIVE_KERNELS=0`` is set, :func:`library` returns ``None`` and :func:`unavailable_reason`
says why; :class:`bnn.packing.PackedModel` then uses its pure-TensorFlow XLA kernels, which give
the same integers. Nothing else in bnn needs these kernels.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np
import tensorflow as tf

from bnn import cpu

__all__ = ["SOURCE", "cache_dir", "library", "available", "preferred", "unavailable_reason",
           "xor_popcount", "xor_popcount_sign", "threshold_pack", "bitplane_sign"]

SOURCE = Path(__file__).with_name("xor_popcount.cc")
_BUILD_TIMEOUT_S = 600
_lock = threading.Lock()
_state: dict[str, object] = {}


def cache_dir() -> Path:
    """Where built kernels are kept: ``$BNN_CACHE_DIR``, else ``$XDG_CACHE_HOME/bnn``, else
    ``~/.cache/bnn``."""
    if os.environ.get("BNN_CACHE_DIR"):
        return Path(os.environ["BNN_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "bnn"


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


def _command(compiler: str, output: Path) -> list[str]:
    return [compiler, "-O3", "-march=native", "-shared", "-fPIC", "-w", str(SOURCE),
            "-o", str(output), *tf.sysconfig.get_compile_flags(), *tf.sysconfig.get_link_flags()]


def _build() -> tuple[object | None, str | None]:
    """(library, None), or (None, reason)."""
    if os.environ.get("BNN_NATIVE_KERNELS", "1").strip().lower() in ("0", "false", "off", "no"):
        return None, "disabled by BNN_NATIVE_KERNELS"
    if platform.system() != "Linux":
        return None, f"native kernels are built on Linux only, not {platform.system()}"
    compiler = _compiler()
    if compiler is None:
        return None, "no C++ compiler found (set CXX or install g++)"
    key = hashlib.sha256("\n".join([
        SOURCE.read_text(), tf.__version__, tf.sysconfig.get_lib(), compiler,
        _cpu_signature()]).encode()).hexdigest()[:20]
    target = cache_dir() / f"xor_popcount-{key}.so"
    if not target.exists():
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
                partial = Path(tmp) / target.name
                done = subprocess.run(_command(compiler, partial), capture_output=True,
                                      text=True, timeout=_BUILD_TIMEOUT_S)
                if done.returncode != 0:
                    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
                    return None, f"compiling {SOURCE.name} failed: {last}"
                os.replace(partial, target)  # atomic: concurrent builders write the same file
        except (OSError, subprocess.SubprocessError) as exc:
            return None, f"could not build native kernels in {target.parent}: {exc}"
    try:
        lib = tf.load_op_library(str(target))
    except (tf.errors.OpError, OSError) as exc:
        return None, f"could not load {target}: {str(exc).strip().splitlines()[0]}"
    problem = _self_check(lib)
    return (None, problem) if problem else (lib, None)


def _pack_rows(values: np.ndarray) -> np.ndarray:
    """±1 rows -> int64 words, bit layout of ``bnn.packing.pack_bits`` along the last axis."""
    bits = values >= 0
    bits = np.pad(bits, [(0, 0), (0, -bits.shape[1] % 64)])
    packed = np.ascontiguousarray(np.packbits(bits, axis=1, bitorder="little"))
    return packed.view("<i8").astype(np.int64)


def _self_check(lib) -> str | None:
    """Compares the kernels with numpy on a small case with ragged sizes."""
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
    try:
        ok = (np.array_equal(130 - 2 * lib.bnn_xor_popcount(xw, ww).numpy(), dots)
              and np.array_equal(lib.bnn_xor_popcount_sign(xw, ww, threshold, fw, n=130).numpy(),
                                 expected)
              and np.array_equal(lib.bnn_threshold_pack(dots, threshold, fw).numpy(), expected)
              and np.array_equal(lib.bnn_bitplane_sign(pixels, ww, 100 * threshold, fw).numpy(),
                                 _pack_rows(np.where((pixels.astype(np.int64) @ w
                                                      >= 100 * threshold) ^ flip, 1.0, -1.0))))
    except (tf.errors.OpError, AttributeError, TypeError, ValueError) as exc:
        return f"native kernels failed their check: {exc}"
    return None if ok else "native kernels gave wrong results in their check"


def library():
    """The loaded op library (building it on first use), or ``None`` if unavailable."""
    with _lock:
        if "library" not in _state:
            _state["library"], _state["reason"] = _build()
        return _state["library"]


def preferred() -> bool:
    """Whether :class:`bnn.packing.PackedModel` uses these kernels by default: where they are
    available and, on x86, the CPU has AVX-512 VPOPCNTDQ. Without it they count bits one word
    at a time, and on an AVX2 CPU (Zen 3) the XLA kernels ran the packed MLP 2-3x faster (batch
    1: 0.57 against 1.12 ms; batch 100: 8.0 against 25.1 ms). ``BNN_NATIVE_KERNELS=1`` prefers
    them on any CPU."""
    if not available():
        return False
    if os.environ.get("BNN_NATIVE_KERNELS", "").strip().lower() in ("1", "true", "on", "yes"):
        return True
    flags = cpu.flags()
    return not (cpu.is_x86() and flags and "avx512_vpopcntdq" not in flags)


def available() -> bool:
    """Whether the native kernels are built, loaded and checked."""
    return library() is not None


def unavailable_reason() -> str | None:
    """Why :func:`available` is False (``None`` when it is True)."""
    library()
    return _state["reason"]  # type: ignore[return-value]


def xor_popcount(x_words: tf.Tensor, w_words: tf.Tensor) -> tf.Tensor:
    """``(batch, units)`` int32 ``sum_k popcount(x[b, k] XOR w[k, u])`` for int64 words
    ``x`` ``(batch, words)`` and ``w`` ``(words, units)``."""
    return library().bnn_xor_popcount(x_words, w_words)


def xor_popcount_sign(x_words: tf.Tensor, w_words: tf.Tensor, threshold: tf.Tensor,
                      flip: tf.Tensor, n: int) -> tf.Tensor:
    """Packed bits ``[n - 2 * xor_popcount(x, w) >= threshold] XOR flip``, ``(batch,
    ceil(units / 64))`` int64, for ``n`` real bits per row."""
    return library().bnn_xor_popcount_sign(x_words, w_words, threshold, flip, n=int(n))


def threshold_pack(a: tf.Tensor, threshold: tf.Tensor, flip: tf.Tensor) -> tf.Tensor:
    """Packed bits ``[a >= threshold] XOR flip`` of int32 ``a`` ``(batch, units)``."""
    return library().bnn_threshold_pack(a, threshold, flip)


def bitplane_sign(u: tf.Tensor, w_words: tf.Tensor, threshold: tf.Tensor, flip: tf.Tensor,
                  encoding: dict[str, float] | None = None) -> tf.Tensor:
    """Packed bits ``[u . w >= threshold] XOR flip`` for pixels ``u`` ``(batch, ...)`` in
    [0, 255] (each example flattened) and a packed ±1 kernel ``w`` ``(words, units)``, exact,
    from the 8 bit planes of ``u``. ``u`` is uint8, or float32 ``x`` with ``encoding``
    ``{"scale": s, "offset": o}``, encoded to ``clip(round((x - o) / s), 0, 255)``."""
    if encoding is None:
        return library().bnn_bitplane_sign(u, w_words, threshold, flip)
    return library().bnn_bitplane_sign(u, w_words, threshold, flip,
                                       scale=float(encoding["scale"]),
                                       offset=float(encoding["offset"]))
