"""Larq's ``larq.math``: a sign that is never zero, and the Heaviside step."""

from __future__ import annotations

import tensorflow as tf

__all__ = ["sign", "heaviside"]


def sign(x: tf.Tensor) -> tf.Tensor:
    """+1 where ``x >= 0``, -1 elsewhere (``tf.sign`` gives 0 at 0); same dtype as ``x``.
    Plain TensorFlow gradient (zero): for a straight-through sign use
    :func:`bnn.larq.quantizers.ste_sign`."""
    x = tf.convert_to_tensor(x)
    return tf.where(x >= 0, tf.ones_like(x), -tf.ones_like(x))


def heaviside(x: tf.Tensor) -> tf.Tensor:
    """1 where ``x > 0``, else 0; same dtype as ``x``."""
    x = tf.convert_to_tensor(x)
    return tf.cast(x > 0, x.dtype)
