"""Fused elementwise work of binary networks' layers, each one XLA pass forward and one backward
with its gradient through :mod:`bnn.ops.gradients`: the per-channel shift of ReActNet's RSign,
a shifted activation (the float twin's RSign), RPReLU of a sum, and max-pooling as strided
slices (fast under XLA; docs/speed.md).

The per-channel sums of the gradients (of thresholds, slopes and shifts) run as TensorFlow ops
of their own: XLA's CPU compiler turns such a column sum into a windowed loop several times
slower than TensorFlow's kernel.
"""

from __future__ import annotations

from typing import Callable

import tensorflow as tf

from bnn.ops.gradients import custom_gradient
from bnn.ops.xla import compiled

__all__ = ["channel_shift", "shifted_activation", "rprelu", "max_pool_slices"]


def _channel_shape(rank: int) -> tuple[int, ...]:
    """Broadcast shape of a per-channel vector: ``(1, ..., 1, channels)``."""
    return (1,) * (rank - 1) + (-1,)


def _channel_sum(t: tf.Tensor) -> tf.Tensor:
    """Sum over every axis but the last, as a TensorFlow op of its own: XLA's CPU compiler turns
    such a column sum into a windowed loop several times slower than TensorFlow's kernel."""
    return tf.reduce_sum(t, axis=list(range(t.shape.rank - 1)))


@compiled
def _shift(x: tf.Tensor, t: tf.Tensor) -> tf.Tensor:
    return x - tf.reshape(t, _channel_shape(x.shape.rank))


@custom_gradient
def channel_shift(x: tf.Tensor, t: tf.Tensor):
    """``x - t`` with ``t`` per channel, in one pass; gradients ``dy`` and ``-sum(dy)``."""
    return _shift(x, t), lambda dy: (tf.identity(dy), -_channel_sum(dy))


def shifted_activation(activation: Callable) -> Callable:
    """``activation(x - t)`` with ``t`` per channel, one fused pass forward and one backward
    (the activation's derivative by automatic differentiation inside that pass), and the
    threshold's gradient ``-sum(dx)`` as a TensorFlow sum."""

    @compiled
    def forward(x, t):
        return activation(x - tf.reshape(t, _channel_shape(x.shape.rank)))

    @compiled
    def backward(dy, x, t):
        z = x - tf.reshape(t, _channel_shape(x.shape.rank))
        with tf.GradientTape() as tape:
            tape.watch(z)
            y = activation(z)
        return tape.gradient(y, z, output_gradients=dy)

    @custom_gradient
    def op(x, t):
        def grad(dy):
            dx = backward(dy, x, t)
            return dx, -_channel_sum(dx)

        return forward(x, t), grad

    return op


@compiled
def _rprelu_forward(xs, gamma, beta, zeta):
    shape = _channel_shape(xs[0].shape.rank)
    z = tf.add_n(xs) - tf.reshape(gamma, shape)
    return tf.where(z > 0, z, tf.reshape(beta, shape) * z) + tf.reshape(zeta, shape)


@compiled
def _rprelu_backward(dy, xs, gamma, beta):
    """``dy/dx * dy`` and ``dy/dbeta * dy``, elementwise, in one pass."""
    shape = _channel_shape(dy.shape.rank)
    z = tf.add_n(xs) - tf.reshape(gamma, shape)
    positive = z > 0
    return (tf.where(positive, dy, tf.reshape(beta, shape) * dy),
            tf.where(positive, tf.zeros_like(dy), dy * z))


@custom_gradient
def rprelu(gamma, beta, zeta, *xs):
    """RPReLU of ``sum(xs)`` in one pass forward and one backward, plus the three per-channel
    sums; every summand gets the same gradient."""
    def grad(dy):
        dx, dbeta = _rprelu_backward(dy, list(xs), gamma, beta)
        return (-_channel_sum(dx), _channel_sum(dbeta), _channel_sum(dy), *([dx] * len(xs)))

    return _rprelu_forward(list(xs), gamma, beta, zeta), grad


def max_pool_slices(x: tf.Tensor, k: int) -> tf.Tensor:
    """``k x k`` max-pooling with stride ``k``, ``"valid"`` padding, of ``x`` ``(batch, h, w,
    c)``, as the maximum of ``k * k`` strided slices. The gradient of each window goes to its
    first maximum in row-major order, the choice of TensorFlow's and XLA's max-pool gradients,
    so values and gradients equal ``tf.nn.max_pool2d(x, k, k, "VALID")``'s. Which slice won is
    found in the forward pass and kept for the backward pass, which then reads one index per
    window instead of recomputing its input (docs/speed.md)."""
    h, w = int(x.shape[1]), int(x.shape[2])
    ho, wo = h // k, w // k

    @custom_gradient
    def pool(x):
        crop = x[:, :ho * k, :wo * k]
        parts = [crop[:, i::k, j::k] for i in range(k) for j in range(k)]
        top = parts[0]
        for part in parts[1:]:
            top = tf.maximum(top, part)
        # First maximal slice of each window; ties go to the lowest index, as MaxPoolGrad's.
        winner = tf.argmax(tf.stack(parts, axis=-1), axis=-1, output_type=tf.int32)

        def grad(dy):
            zero = tf.zeros_like(dy)
            routed = [tf.where(tf.equal(winner, index), dy, zero) for index in range(k * k)]
            rows = [tf.stack(routed[i * k:(i + 1) * k], axis=3) for i in range(k)]
            windows = tf.stack(rows, axis=2)  # (batch, ho, k, wo, k, c)
            full = tf.reshape(windows, [-1, ho * k, wo * k, int(dy.shape[-1])])
            return tf.pad(full, [[0, 0], [0, h - ho * k], [0, w - wo * k], [0, 0]])

        return top, grad

    return pool(x)
