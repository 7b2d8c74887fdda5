"""The sign of binary networks, ``+1`` where ``x >= 0`` and ``-1`` elsewhere (so ``sign(0) =
+1`` and every output is a binary value), and the check that a tensor lies in a range."""

from __future__ import annotations

import tensorflow as tf

from bnn.ops.xla import compiled

__all__ = ["sign", "all_inside"]


@compiled
def sign(x: tf.Tensor) -> tf.Tensor:
    """+1 where ``x >= 0``, -1 elsewhere (NaN gives -1), in ``x``'s dtype, as one fused pass."""
    return tf.where(x >= 0, tf.ones_like(x), -tf.ones_like(x))


def all_inside(x: tf.Tensor, low: tf.Tensor, high: tf.Tensor) -> tf.Tensor:
    """``all(low <= x <= high)`` as a bool scalar, from two read-only reductions (no temporary
    the size of ``x``)."""
    return tf.logical_and(tf.reduce_max(x) <= high, tf.reduce_min(x) >= low)
