"""The custom-gradient toolkit: values from one function, gradients from another.

This is where bnn overrides gradients, the TF2 way (no graph-mode gradient registry, no
``gradient_override_map``); every custom gradient in bnn is built from these pieces:

* :func:`custom_gradient` -- like ``tf.custom_gradient``, but the gradient function may return a
  Python number or ``None`` ("zero"), which become tensors of the right shape and dtype; anything
  else is a ``TypeError`` that says what came back and what was expected.
* :func:`override` -- an op whose value is ``forward(x)`` and whose gradient is
  ``backward(dy, x)``: every quantizer is one.
* :func:`clipped_gradient` -- the straight-through rule of binary networks, ``dy`` where ``x``
  lies in ``[low, high]`` and 0 elsewhere (the derivative of hard-tanh for ``[-1, 1]``), in one
  fused pass. BinaryNet's estimator is ``override(sign, clipped_gradient)``; every
  straight-through quantizer reuses it.
* :func:`straight_through` -- the value of ``forward(x)`` with the gradient of a differentiable
  ``surrogate(x)``: ``straight_through(tf.sign, hard_tanh)`` is BinaryNet's estimator too.
* :func:`reverse_gradient` -- identity forward, ``-scale * dy`` backward (domain-adversarial
  training, Ganin & Lempitsky 2015; :class:`bnn.layers.GradientReversal` is its layer).
"""

from __future__ import annotations

import functools
import numbers
from typing import Any, Callable

import tensorflow as tf

from bnn.ops.xla import compiled

__all__ = ["custom_gradient", "override", "clipped_gradient", "straight_through",
           "reverse_gradient"]


def _like(value: Any, like: tf.Tensor) -> bool:
    """Whether ``value`` is a tensor of ``like``'s dtype and static shape."""
    return (isinstance(value, tf.Tensor) and value.dtype == like.dtype
            and value.shape.rank is not None and like.shape.rank is not None
            and value.shape.as_list() == like.shape.as_list())


def _as_gradient(value: Any, like: tf.Tensor, where: str, index: int) -> tf.Tensor:
    """What a gradient function returned for one input, as a tensor like ``like``: a tensor of
    its dtype and static shape as it is, anything else cast and broadcast."""
    if value is None:
        return tf.zeros_like(like)
    if _like(value, like):
        return value
    if isinstance(value, bool) or not isinstance(value, (numbers.Number, tf.Tensor, tf.Variable)):
        if not (hasattr(value, "__array__") and not isinstance(value, (str, bytes))):
            raise TypeError(
                f"the gradient function of {where} returned {type(value).__name__} "
                f"{value!r:.60} for input {index}; expected a tensor shaped like that input, a "
                "Python number, or None (meaning zero)")
    return tf.broadcast_to(tf.cast(value, like.dtype), tf.shape(like))


def custom_gradient(fn: Callable) -> Callable:
    """Decorator like ``tf.custom_gradient`` with forgiving gradient returns.

    ``fn(*xs)`` returns ``(y, grad)`` where ``grad(dy)`` returns one gradient per input (a single
    value when there is one input). Each gradient may be a tensor, a Python number (broadcast to
    the input's shape) or ``None`` (zero)::

        @bnn.custom_gradient
        def clip_gradient(x):
            return tf.identity(x), lambda dy: tf.clip_by_value(dy, -1.0, 1.0)

    A returned tensor of its input's dtype and static shape is used as it is (no extra op).

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
                    raise TypeError(f"the gradient function of {where} returned {got}; "
                                    f"expected {len(inner)} gradients, one per input")
                return [_as_gradient(g, x, where, i) for i, (g, x) in enumerate(zip(grads, inner))]

            return y, checked_grad

        return op(*xs)

    return wrapper


def override(forward: Callable[[tf.Tensor], tf.Tensor],
             backward: Callable[[tf.Tensor, tf.Tensor], Any],
             name: str | None = None) -> Callable[[tf.Tensor], tf.Tensor]:
    """The op ``x -> forward(x)`` whose gradient is ``backward(dy, x)``: the gradient override
    of one function, written once::

        ste_sign = override(sign, lambda dy, x: clipped_gradient(dy, x, -1.0, 1.0))
    """

    def op(x):
        return forward(x), lambda dy: backward(dy, x)

    op.__name__ = name or f"override_{getattr(forward, '__name__', 'op')}"
    return custom_gradient(op)


@compiled
def _inside(dy: tf.Tensor, x: tf.Tensor, low: tf.Tensor, high: tf.Tensor) -> tf.Tensor:
    return tf.where((x >= low) & (x <= high), dy, tf.zeros_like(dy))


def clipped_gradient(dy: tf.Tensor, x: tf.Tensor, low: float = -1.0,
                     high: float = 1.0) -> tf.Tensor:
    r"""The straight-through rule: :math:`\partial L/\partial x = \partial L/\partial y` where
    ``low <= x <= high``, else 0 (NaN ``x`` gets 0), in ``dy``'s dtype, as one fused (XLA) pass.
    With ``[-1, 1]`` it is the derivative of hard-tanh, BinaryNet's estimator for ``sign``."""
    return _inside(dy, x, tf.cast(low, x.dtype), tf.cast(high, x.dtype))


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

    def backward(dy, x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            s = surrogate(x)
        return tape.gradient(s, x, output_gradients=dy)

    return override(forward, backward,
                    name or f"straight_through_{getattr(forward, '__name__', 'op')}")


@custom_gradient
def _reverse(x, scale):
    return tf.identity(x), lambda dy: (-scale * dy, None)


def reverse_gradient(x: tf.Tensor, scale: float = 1.0) -> tf.Tensor:
    """Identity forward; backward ``dL/dx = -scale * dL/dy``."""
    x = tf.convert_to_tensor(x)
    return _reverse(x, tf.constant(scale, dtype=x.dtype))
