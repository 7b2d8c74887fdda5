"""Building and loading the native kernels: the only place that runs a compiler or loads a
shared library.

The first call to :func:`load` compiles the TensorFlow glue in ``src/tf`` (which includes the
framework-free kernels in ``src/core``) with the host's C++ compiler (``$CXX``, else ``g++``,
``c++`` or ``clang++``) against the installed TensorFlow's headers, for the target the caller
gives (:mod:`bnn.native.dispatch` chooses it), caches the shared library under
:func:`bnn.settings.cache_dir` keyed by the sources, TensorFlow, compiler, command and CPU, and
loads it with ``tf.load_op_library``. Later processes load the cached file (about 0.1 s); a build
takes under a minute on 2 cores. The kernels are checked by their own C++ tests
(``bnn/native/tests``), not at load time.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import NamedTuple

import tensorflow as tf

from bnn import progress, settings

__all__ = ["SOURCE_DIR", "SOURCES", "HEADERS", "Built", "compiler", "command", "load"]

#: The kernels' sources: ``core/`` (framework-free kernels) and ``tf/`` (TensorFlow ops).
SOURCE_DIR = Path(__file__).with_name("src")
#: Every source compiled into the library: the TensorFlow ops, one file per op family.
SOURCES = tuple(sorted((SOURCE_DIR / "tf").glob("*.cc")))
#: Every header the sources include (part of the build's cache key).
HEADERS = tuple(sorted(SOURCE_DIR.glob("*/*.h")))
_BUILD_TIMEOUT_S = 600


class Built(NamedTuple):
    """The loaded library and the instruction-set variants this CPU runs, slowest first; or
    ``None`` and why not."""

    library: object | None
    variants: tuple[str, ...] = ()
    reason: str | None = None


def compiler() -> str | None:
    """The C++ compiler to build with: the first of :func:`bnn.settings.compilers` found."""
    for name in settings.compilers():
        if shutil.which(name):
            return shutil.which(name)
    return None


def command(compiler_: str, output: Path, target: list[str]) -> list[str]:
    """The command that builds the library into ``output`` for the ``target`` flags."""
    return [compiler_, "-O3", *target, "-ffp-contract=off", "-fno-math-errno", "-shared",
            "-fPIC", "-w", f"-I{SOURCE_DIR}", *(str(source) for source in SOURCES),
            "-o", str(output), *tf.sysconfig.get_compile_flags(), *tf.sysconfig.get_link_flags()]


def _compile(compiler_: str, target_flags: list[str], path: Path) -> str | None:
    """Compiles the library into ``path`` (atomically: concurrent builders write the same
    file); returns why it failed, or ``None``."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            partial = Path(tmp) / path.name
            with progress.phase("building the native kernels (once)"):
                done = subprocess.run(command(compiler_, partial, target_flags),
                                      capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S)
            if done.returncode != 0:
                errors = [line for line in done.stderr.splitlines() if "error" in line]
                last = (errors or done.stderr.strip().splitlines() or ["no output"])[-1]
                return f"compiling the native kernels in {SOURCE_DIR} failed: {last.strip()}"
            os.replace(partial, path)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"could not build native kernels in {path.parent}: {exc}"
    return None


@functools.lru_cache(maxsize=None)
def _load(target: tuple[str, ...], cpu_signature: str, compiler_: str | None,
          cache: Path) -> Built:
    if platform.system() != "Linux":
        return Built(None, reason=f"native kernels are built on Linux only, not "
                     f"{platform.system()}")
    if compiler_ is None:
        return Built(None, reason="no C++ compiler found (set CXX or install g++)")
    key = hashlib.sha256("\n".join([
        *(path.read_text() for path in (*SOURCES, *HEADERS)), tf.__version__,
        tf.sysconfig.get_lib(), compiler_, *command(compiler_, Path("OUT"), list(target)),
        cpu_signature]).encode()).hexdigest()[:20]
    path = cache / f"kernels-{key}.so"
    if not path.exists():
        problem = _compile(compiler_, list(target), path)
        if problem:
            return Built(None, reason=problem)
    try:
        library = tf.load_op_library(str(path))
        variants = tuple(name.decode() for name in library.bnn_kernel_variants().numpy())
    except (tf.errors.OpError, OSError, AttributeError) as exc:
        return Built(None, reason=f"could not load {path}: "
                     f"{str(exc).strip().splitlines()[0]}")
    return Built(library, variants)


def load(target: list[str], cpu_signature: str) -> Built:
    """The library built for the compiler flags ``target`` on the CPU that ``cpu_signature``
    describes, with :func:`compiler` into :func:`bnn.settings.cache_dir` (built once per cache
    key, loaded once per process)."""
    return _load(tuple(target), cpu_signature, compiler(), settings.cache_dir())
