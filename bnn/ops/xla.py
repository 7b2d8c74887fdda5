"""XLA helpers: compiled functions that every binary layer calls with its own shapes, the
check by which layers pick the kernels that are fastest with or without XLA, and a way to keep
a cheap result in memory rather than recompute it in each of its consumers.

``tf.function`` warns ("N out of the last M calls ... triggered tf.function retracing") when one
function is traced again and again. A helper that each binary layer calls with its own shapes is
traced once per layer shape, and once more for each new batch size of an eager call: that is
how it is meant to work, not the mistake the warning describes. :func:`compiled` makes such
helpers without the warning.
"""

from __future__ import annotations

from typing import Callable

import tensorflow as tf

try:  # TensorFlow's own test for XLA tracing; not public API, so its absence is tolerated
    from tensorflow.python.framework import ops as tf_ops
    from tensorflow.python.ops import control_flow_util
except ImportError:  # pragma: no cover
    control_flow_util = None

__all__ = ["compiled", "in_xla_context", "computed_once"]


def compiled(fn: Callable) -> Callable:
    """``tf.function(fn, jit_compile=True)`` that does not warn about retracing.

    TensorFlow keeps its retracing statistics per Python function and skips the warning for a
    ``tf.function`` whose ``_omit_frequent_tracing_warning`` is set (a private attribute; if a
    later TensorFlow ignores it, the only change is that the warning comes back)."""
    function = tf.function(fn, jit_compile=True)
    function._omit_frequent_tracing_warning = True
    return function


def in_xla_context() -> bool:
    """Whether the graph being traced will be compiled by XLA (``jit_compile=True``); False
    eagerly, in a plain graph, and where this TensorFlow cannot say (layers then keep their
    non-XLA kernels, which are correct either way)."""
    if control_flow_util is None:
        return False
    return control_flow_util.GraphOrParentsInXlaContext(tf_ops.get_default_graph())


def computed_once(t: tf.Tensor) -> tf.Tensor:
    """``t``, unchanged, which XLA computes once and keeps in memory. ``t`` must be floating
    point and finite.

    XLA's CPU compiler fuses cheap elementwise work into every consumer, so a value that is
    cheap per element but reads many arrays is recomputed in each of them. A binary layer's
    output is such a value: the sum of a dozen or more partial popcount sums, each its own
    array, read again by the batch-norm statistics, the normalization and each part of their
    gradient. Division is one of the operations XLA will not duplicate, so dividing by a 1
    computed at run time (from ``t``'s first element: ``1 + 0 * t[0]``, which the compiler
    cannot fold) makes the sum a loop of its own whose result the consumers read. An
    optimization barrier does not do this: the CPU compiler removes barriers before it fuses.
    """
    first = tf.reshape(tf.slice(t, [0] * t.shape.rank, [1] * t.shape.rank), [])
    return t / (1.0 + 0.0 * first)
