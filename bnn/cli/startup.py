"""TensorFlow started quietly, for the ``bnn`` command and the scripts in ``benchmarks/``.

TensorFlow's native libraries print a dozen log lines while they load and while the accelerator
platforms are first probed (oneDNN notices, CUDA probes, CPU-feature notes), before any
log-level setting made inside the process applies. :func:`start_tensorflow` runs those two steps
with standard error silenced, then keeps TensorFlow's informational lines and warnings out with
``TF_CPP_MIN_LOG_LEVEL=2`` (unless set already), and selects the pooling CPU allocator
(:func:`bnn.settings.select_pooling_allocator`). ``verbose=True`` or ``BNN_TF_LOG=1`` leaves
every line in.

Importing this module imports neither TensorFlow nor the rest of bnn.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator

from bnn import settings

__all__ = ["start_tensorflow", "stderr_silenced"]


@contextlib.contextmanager
def stderr_silenced() -> Iterator[None]:
    """Standard error (file descriptor 2, so C++ code's writes too) sent to the null device."""
    sys.stderr.flush()
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def start_tensorflow(verbose: bool = False) -> None:
    """Selects the pooling CPU allocator, imports TensorFlow without its start-up log lines
    (unless ``verbose`` or ``BNN_TF_LOG=1``, or TensorFlow is imported already) and registers
    bnn's Keras objects (:func:`bnn.import_all`)."""
    settings.select_pooling_allocator()
    verbose = verbose or settings.tensorflow_log()
    if not verbose and "tensorflow" not in sys.modules:
        settings.quiet_tensorflow_logs()
        with stderr_silenced():
            import tensorflow as tf

            tf.config.list_physical_devices()
        tf.get_logger().setLevel("ERROR")
    import bnn

    bnn.import_all()
