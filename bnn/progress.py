"""A progress line for the long, silent phases of a run: loading a dataset, the first train step
(tracing, and XLA's compilation), building the native kernels.

:func:`phase` shows, on standard error, a spinner with the phase's name and its elapsed seconds
while the phase runs when standard error is a terminal, and one line ``bnn: <what>: <seconds> s``
when it ends, on a terminal or not. :func:`set_enabled` turns it off (``--quiet``). Nothing here
imports TensorFlow.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
import threading
import time
from typing import Iterator, TextIO

__all__ = ["phase", "Phase", "set_enabled", "enabled"]

_FRAMES = "|/-\\"
_state = {"enabled": True}


def set_enabled(enabled: bool) -> None:
    """Shows progress lines (the default) or not."""
    _state["enabled"] = bool(enabled)


@contextlib.contextmanager
def enabled(flag: bool) -> Iterator[None]:
    """Shows progress lines or not inside the block, then restores the setting before it."""
    before = _state["enabled"]
    set_enabled(flag)
    try:
        yield
    finally:
        set_enabled(before)


class Phase:
    """One phase's progress line; :meth:`start` and :meth:`stop` may be called from callbacks."""

    def __init__(self, what: str, stream: TextIO | None = None, interval: float = 0.1):
        self.what = what
        self.stream = stream or sys.stderr
        self.interval = interval
        self.started: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Phase:
        self.started = time.perf_counter()
        if _state["enabled"] and _isatty(self.stream):
            self._thread = threading.Thread(target=self._spin, daemon=True)
            self._thread.start()
        return self

    def _spin(self) -> None:
        for frame in itertools.cycle(_FRAMES):
            if self._stop.wait(self.interval):
                return
            elapsed = time.perf_counter() - self.started
            self.stream.write(f"\r{frame} {self.what}: {elapsed:.0f} s\033[K")
            self.stream.flush()

    def stop(self, report: bool = True) -> float:
        """Ends the phase and, with ``report``, prints its line; returns its seconds (0 if it
        never started)."""
        if self.started is None:
            return 0.0
        elapsed = time.perf_counter() - self.started
        self.started = None
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self.stream.write("\r\033[K")
        if _state["enabled"] and report:
            self.stream.write(f"bnn: {self.what}: {elapsed:.1f} s\n")
            self.stream.flush()
        return elapsed


@contextlib.contextmanager
def phase(what: str, stream: TextIO | None = None) -> Iterator[Phase]:
    """``with phase("loading cifar10"): ...``: a spinner while the block runs, then one line.
    A phase that raises prints no line: the error speaks for itself."""
    line = Phase(what, stream).start()
    try:
        yield line
    except BaseException:
        line.stop(report=False)
        raise
    line.stop()


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
