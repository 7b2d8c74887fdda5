"""XLA-compiled helpers that every binary layer calls with its own shapes.

``tf.function`` warns ("N out of the last M calls ... triggered tf.function retracing") when one
function is traced again and again. A helper that each binary layer calls with its own shapes is
traced once per layer shape, and once more for each new batch size of an eager call: that is
how it is meant to work, not the mistake the warning describes. :func:`compiled` makes such
helpers without the warning.
"""

from __future__ import annotations

from typing import Callable

import tensorflow as tf

__all__ = ["compiled"]


def compiled(fn: Callable) -> Callable:
    """``tf.function(fn, jit_compile=True)`` that does not warn about retracing.

    TensorFlow keeps its retracing statistics per Python function and skips the warning for a
    ``tf.function`` whose ``_omit_frequent_tracing_warning`` is set (a private attribute; if a
    later TensorFlow ignores it, the only change is that the warning comes back)."""
    function = tf.function(fn, jit_compile=True)
    function._omit_frequent_tracing_warning = True
    return function
