import numpy as np
import keras
import pytest
import tensorflow as tf

import bnn
from bnn.ops import gradients


def grad_of(fn, x):
    x = tf.constant(x, tf.float32)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
    return y.numpy(), tape.gradient(y, x).numpy()


def test_straight_through_sign_with_hard_tanh_surrogate_matches_ste_sign():
    op = gradients.straight_through(bnn.ste_sign, lambda x: tf.clip_by_value(x, -1.0, 1.0))
    x = np.linspace(-2, 2, 81)
    y1, g1 = grad_of(op, x)
    y2, g2 = grad_of(bnn.ste_sign, x)
    np.testing.assert_array_equal(y1, y2)
    np.testing.assert_array_equal(g1, g2)


def test_straight_through_any_pair_round_with_tanh_surrogate():
    op = gradients.straight_through(tf.round, tf.tanh)
    x = np.array([-1.7, -0.2, 0.4, 2.6])
    y, g = grad_of(op, x)
    np.testing.assert_array_equal(y, np.round(x))
    np.testing.assert_allclose(g, 1 - np.tanh(x) ** 2, rtol=1e-4)


@pytest.mark.parametrize("returned, expected", [(0, 0.0), (None, 0.0), (2.5, 2.5), (1, 1.0)])
def test_gradient_function_may_return_number_or_none(returned, expected):
    @gradients.custom_gradient
    def op(x):
        return tf.identity(x), lambda dy: returned

    x = tf.constant([[1.0, 2.0], [3.0, 4.0]], tf.float64)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = op(x)
    g = tape.gradient(y, x)
    assert g.dtype == tf.float64 and g.shape == x.shape
    np.testing.assert_array_equal(g.numpy(), np.full((2, 2), expected))


def test_gradient_function_returning_wrong_type_is_a_clear_type_error():
    @gradients.custom_gradient
    def bad(x):
        return tf.identity(x), lambda dy: "zero"

    x = tf.constant([1.0])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = bad(x)
    with pytest.raises(TypeError, match=r"'bad' returned str 'zero' for input 0; expected a tensor"):
        tape.gradient(y, x)


def test_gradient_function_returning_wrong_count_is_a_clear_type_error():
    @gradients.custom_gradient
    def two_inputs(a, b):
        return a * b, lambda dy: dy

    a, b = tf.constant(1.0), tf.constant(2.0)
    with tf.GradientTape() as tape:
        tape.watch([a, b])
        y = two_inputs(a, b)
    with pytest.raises(TypeError, match="returned a single EagerTensor; expected 2 gradients"):
        tape.gradient(y, [a, b])


@pytest.mark.parametrize("scale", [1.0, 0.25, 3.0])
def test_reverse_gradient_is_identity_forward_and_negated_backward(scale):
    x = np.array([-1.5, 0.0, 2.0])
    y, g = grad_of(lambda t: gradients.reverse_gradient(t, scale) * 3.0, x)
    np.testing.assert_array_equal(y, x * 3.0)
    np.testing.assert_allclose(g, [-3.0 * scale] * 3)


def test_gradient_reversal_layer_trains_adversarially_and_saves(tmp_path):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, name="feature"),
                              bnn.GradientReversal(0.5), keras.layers.Dense(1)])
    x = tf.constant([[1.0, -2.0]])
    with tf.GradientTape(persistent=True) as tape:
        out = model(x)
    features = model.get_layer("feature")
    with tf.GradientTape() as plain_tape:
        plain = model.layers[2](features(x))
    g_reversed = tape.gradient(out, features.kernel)
    g_plain = plain_tape.gradient(plain, features.kernel)
    np.testing.assert_allclose(g_reversed.numpy(), -0.5 * g_plain.numpy(), rtol=1e-6)
    model.save(tmp_path / "grl.keras")
    restored = keras.models.load_model(tmp_path / "grl.keras")
    assert restored.layers[1].scale == 0.5
    np.testing.assert_array_equal(restored(x), model(x))


def test_tf1_gradient_override_map_and_ste_sign_give_identical_gradients():
    """The TF1 recipe (RegisterGradient + gradient_override_map on Sign) versus bnn."""
    rng = np.random.default_rng(1)
    x_value = rng.uniform(-2, 2, size=(16, 32)).astype("float32")
    x_value[0, :5] = [-1.0, 1.0, -1.0001, 1.0001, 0.5]
    w_value = rng.normal(size=(32, 8)).astype("float32")

    graph = tf.Graph()
    with graph.as_default():
        name = f"HardTanhSTE_{id(graph)}"

        @tf.RegisterGradient(name)
        def _hard_tanh_ste(op, dy):
            return dy * tf.cast(tf.abs(op.inputs[0]) <= 1.0, dy.dtype)

        x = tf.compat.v1.placeholder(tf.float32, x_value.shape)
        with graph.gradient_override_map({"Sign": name}):
            y = tf.sign(x)
        loss = tf.reduce_sum(tf.matmul(y, w_value) ** 2)
        (dx,) = tf.compat.v1.gradients(loss, [x])
        with tf.compat.v1.Session(graph=graph) as session:
            tf1_grad = session.run(dx, {x: x_value})

    xt = tf.constant(x_value)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        tf2_loss = tf.reduce_sum(tf.matmul(bnn.ste_sign(xt), w_value) ** 2)
    np.testing.assert_allclose(tape.gradient(tf2_loss, xt).numpy(), tf1_grad, rtol=1e-5)
    assert np.count_nonzero(tf1_grad == 0) > 0
