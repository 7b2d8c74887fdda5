"""Property-based tests of the custom-gradient toolkit on any finite input, shape and dtype."""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import bnn
from bnn.ops import gradients

DTYPES = [np.float16, np.float32, np.float64]


def finite_arrays():
    return st.sampled_from(DTYPES).flatmap(lambda dtype: hnp.arrays(
        dtype, hnp.array_shapes(min_dims=0, max_dims=3, max_side=5),
        elements=st.floats(-1e3, 1e3, width=np.dtype(dtype).itemsize * 8)))


def value_and_grad(fn, x, dy):
    x = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
    return y.numpy(), tape.gradient(y, x, output_gradients=tf.constant(dy)).numpy()


@settings(max_examples=40, deadline=None)
@given(finite_arrays(), st.floats(0.1, 10.0))
def test_reverse_gradient_is_identity_forward_and_minus_scale_backward(x, scale):
    dy = np.ones_like(x)
    y, g = value_and_grad(lambda t: gradients.reverse_gradient(t, scale), x, dy)
    assert y.dtype == x.dtype and y.shape == x.shape
    np.testing.assert_array_equal(y, x)
    np.testing.assert_allclose(g, -np.asarray(scale, x.dtype) * dy, rtol=1e-3)


@settings(max_examples=40, deadline=None)
@given(finite_arrays())
def test_straight_through_sign_hard_tanh_equals_ste_sign(x):
    op = gradients.straight_through(bnn.ste_sign, lambda t: tf.clip_by_value(t, -1.0, 1.0))
    dy = np.full_like(x, 0.5)
    y1, g1 = value_and_grad(op, x, dy)
    y2, g2 = value_and_grad(bnn.ste_sign, x, dy)
    np.testing.assert_array_equal(y1, y2)
    np.testing.assert_array_equal(g1, g2)
    assert set(np.unique(y1)) <= {-1, 1}
    np.testing.assert_array_equal(g2, np.where(np.abs(x) <= 1, dy, 0))


@settings(max_examples=30, deadline=None)
@given(finite_arrays(), st.sampled_from([0, 0.0, None, 2, -1.5]))
def test_number_or_none_gradients_become_tensors_like_the_input(x, returned):
    @gradients.custom_gradient
    def op(t):
        return tf.identity(t), lambda dy: returned

    _, g = value_and_grad(op, x, np.ones_like(x))
    assert g.dtype == x.dtype and g.shape == x.shape
    np.testing.assert_array_equal(g, np.full_like(x, 0 if returned is None else returned))


@pytest.mark.parametrize("returned", ["0", {"dy": 1}, object()])
def test_any_other_gradient_return_is_a_type_error(returned):
    @gradients.custom_gradient
    def op(t):
        return tf.identity(t), lambda dy: returned

    x = tf.constant([1.0, 2.0])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = op(x)
    with pytest.raises(TypeError, match="expected a tensor shaped like that input"):
        tape.gradient(y, x)
