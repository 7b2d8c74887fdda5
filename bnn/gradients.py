"""Custom-gradient toolkit: values from one function, gradients from another.

Three building blocks, all native TF2 (no graph-mode gradient registry):

* :func:`custom_gradient` -- like ``tf.custom_gradient``, but the gradient function may return a
  Python number or ``None`` ("zero"), which become tensors of the right shape and dtype; anything
  else is a ``TypeError`` that says what came back and what was expected.
* :func:`straight_through` -- an op whose value is ``forward(x)`` and whose gradient is that of a
  differentiable ``surrogate(x)``.  ``straight_through(sign, hard_tanh)`` is BinaryNet's estimator.
* :func:`reverse_gradient` and :class:`GradientReversal` -- identity forward, ``-scale * dy``
  backward (domain-adversarial training, Ganin & Lempitsky 2015).
"""

from __future__ import annotations

import functools
import numbers
from typing import Any, Callable

import keras
import tensorflow as tf

__all__ = ["custom_gradient", "straight_through", "reverse_gradient", "GradientReversal"]


def _as_gradient(value: Any, like: tf.Tensor, where: str, index: int) -> tf.Tensor:
    """Turns what a user's gradient function returned for one input into a tensor like ``like``."""
    if value is None:
        return tf.zeros_like(like)
    if isinstance(value, bool) or not isinstance(value, (numbers.Number, tf.Tensor, tf.Variable)):
        if hasattr(value, "__array__") and not isinstance(value, (str, bytes)):
            return tf.broadcast_to(tf.cast(value, like.dtype), tf.shape(like))
        raise TypeError(
            f"the gradient function of {where} returned {type(value).__name__} {value!r:.60} for "
            f"input {index}; expected a tensor shaped like that input, a Python number, or None "
            "(meaning zero)"
        )
    return tf.broadcast_to(tf.cast(value, like.dtype), tf.shape(like))


def custom_gradient(fn: Callable) -> Callable:
    """Decorator like ``tf.custom_gradient`` with forgiving gradient returns.

    ``fn(*xs)`` returns ``(y, grad)`` where ``grad(dy)`` returns one gradient per input (a single
    value when there is one input). Each gradient may be a tensor, a Python number (broadcast to
    the input's shape) or ``None`` (zero)::

        @bnn.gradients.custom_gradient
        def clip_gradient(x):
            return tf.identity(x), lambda dy: tf.clip_by_value(dy, -1.0, 1.0)

    Raises:
        TypeError: when ``grad`` returns something other than a tensor, a number or None, or the
            wrong number of gradients.
    """
    where = f"'{getattr(fn, '__name__', 'custom_gradient')}'"

    @functools.wraps(fn)
    def wrapper(*xs):
        xs = [tf.convert_to_tensor(x) for x in xs]

        @tf.custom_gradient
        def op(*inner):
            y, grad = fn(*inner)

            def checked_grad(dy):
                grads = grad(dy)
                if len(inner) == 1 and not isinstance(grads, (tuple, list)):
                    grads = (grads,)
                if not isinstance(grads, (tuple, list)) or len(grads) != len(inner):
                    got = (f"{len(grads)} gradients" if isinstance(grads, (tuple, list))
                           else f"a single {type(grads).__name__}")
                    raise TypeError(
                        f"the gradient function of {where} returned {got}; "
                        f"expected {len(inner)} gradients, one per input"
                    )
                return [_as_gradient(g, x, where, i) for i, (g, x) in enumerate(zip(grads, inner))]

            return y, checked_grad

        return op(*xs)

    return wrapper


def straight_through(
    forward: Callable[[tf.Tensor], tf.Tensor],
    surrogate: Callable[[tf.Tensor], tf.Tensor],
    name: str | None = None,
) -> Callable[[tf.Tensor], tf.Tensor]:
    """An op with the value of ``forward(x)`` and the gradient of ``surrogate(x)``.

    ``dL/dx = dL/dy * d surrogate(x)/dx``, computed by automatic differentiation of the surrogate,
    so any differentiable surrogate works::

        sign_ste = straight_through(tf.sign, lambda x: tf.clip_by_value(x, -1.0, 1.0))
    """

    def op(x):
        y = forward(x)

        def grad(dy):
            with tf.GradientTape() as tape:
                tape.watch(x)
                s = surrogate(x)
            return tape.gradient(s, x, output_gradients=dy)

        return y, grad

    op.__name__ = name or f"straight_through_{getattr(forward, '__name__', 'op')}"
    return custom_gradient(op)


@tf.custom_gradient
def _reverse(x, scale):
    return tf.identity(x), lambda dy: (-scale * dy, tf.zeros_like(scale))


def reverse_gradient(x: tf.Tensor, scale: float = 1.0) -> tf.Tensor:
    """Identity forward; backward ``dL/dx = -scale * dL/dy``."""
    x = tf.convert_to_tensor(x)
    return _reverse(x, tf.constant(scale, dtype=x.dtype))


@keras.saving.register_keras_serializable(package="bnn")
class GradientReversal(keras.layers.Layer):
    """Keras layer: identity forward, gradient multiplied by ``-scale`` backward.

    Put it between a feature extractor and a domain classifier for domain-adversarial training.
    """

    def __init__(self, scale: float = 1.0, **kwargs):
        super().__init__(**kwargs)
        self.scale = float(scale)

    def call(self, inputs):
        return reverse_gradient(inputs, self.scale)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "scale": self.scale}
