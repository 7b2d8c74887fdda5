import numpy as np
import keras
import pytest
import tensorflow as tf

import bnn
from bnn import quantizers


def value_and_grad(fn, x, dtype=tf.float32):
    x = tf.constant(x, dtype=dtype)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
    return y.numpy(), tape.gradient(y, x).numpy()


def test_ste_sign_forward_is_plus_minus_one_with_sign_of_zero_positive():
    y, _ = value_and_grad(bnn.ste_sign, [-3.0, -1e-7, -0.0, 0.0, 1e-7, 3.0])
    np.testing.assert_array_equal(y, [-1, -1, 1, 1, 1, 1])


@pytest.mark.parametrize("clip", [1.0, 0.5, 2.0])
def test_ste_sign_gradient_mask_at_and_around_clip_value(clip):
    eps = 1e-3
    x = [-clip - eps, -clip, -clip + eps, -eps, 0.0, eps, clip - eps, clip, clip + eps]
    _, g = value_and_grad(lambda t: bnn.ste_sign(t, clip_value=clip), x)
    np.testing.assert_array_equal(g, [0, 1, 1, 1, 1, 1, 1, 1, 0])


def test_ste_sign_gradient_scales_incoming_gradient():
    x = tf.constant([0.3, -0.2, 4.0])
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(bnn.ste_sign(x) * tf.constant([2.0, -5.0, 7.0]))
    np.testing.assert_array_equal(tape.gradient(loss, x).numpy(), [2.0, -5.0, 0.0])


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float32, tf.float64])
def test_ste_sign_keeps_dtype(dtype):
    y, g = value_and_grad(bnn.ste_sign, [-2.0, -0.5, 0.0, 0.5, 2.0], dtype=dtype)
    assert y.dtype == dtype.as_numpy_dtype and g.dtype == dtype.as_numpy_dtype
    np.testing.assert_array_equal(y.astype("float32"), [-1, -1, 1, 1, 1])
    np.testing.assert_array_equal(g.astype("float32"), [0, 1, 1, 1, 0])


def test_ste_sign_same_under_tf_function_and_xla():
    x = tf.constant(np.linspace(-2, 2, 41), tf.float32)

    def run(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = bnn.ste_sign(x)
        return y, tape.gradient(y, x)

    eager = run(x)
    for compiled in (tf.function(run), tf.function(run, jit_compile=True)):
        out = compiled(x)
        np.testing.assert_array_equal(out[0], eager[0])
        np.testing.assert_array_equal(out[1], eager[1])


def test_lookup_by_string_name_and_config_round_trip():
    q = quantizers.get("ste_sign")
    assert isinstance(q, quantizers.SteSign)
    q2 = quantizers.get({"name": "ste_sign", "clip_value": 0.5})
    assert q2.get_config() == {"clip_value": 0.5}
    restored = keras.saving.deserialize_keras_object(quantizers.serialize(q2))
    assert restored == q2
    assert quantizers.get(bnn.ste_sign) == quantizers.SteSign()
    assert "ste_sign" in quantizers.names()


def test_unknown_quantizer_name_lists_known_ones():
    with pytest.raises(ValueError, match="unknown quantizer 'ste_sing'.*ste_sign"):
        quantizers.get("ste_sing")


def test_ste_sign_as_keras_activation_saves_and_loads(tmp_path):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation=bnn.ste_sign),
                              keras.layers.Activation(bnn.ste_sign)])
    x = np.random.default_rng(0).normal(size=(6, 4)).astype("float32")
    path = tmp_path / "act.keras"
    model.save(path)
    restored = keras.models.load_model(path)
    np.testing.assert_array_equal(model(x), restored(x))
    assert set(np.unique(restored(x))) <= {-1.0, 1.0}


def test_ste_sign_with_infinite_clip_passes_every_gradient():
    x = tf.constant([-5.0, -1.0, 0.0, 0.5, 3.0])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = bnn.quantizers.ste_sign(x, clip_value=float("inf"))
        loss = tf.reduce_sum(y * tf.constant([1.0, 2.0, 3.0, 4.0, 5.0]))
    np.testing.assert_array_equal(y.numpy(), [-1.0, -1.0, 1.0, 1.0, 1.0])
    np.testing.assert_array_equal(tape.gradient(loss, x).numpy(), [1.0, 2.0, 3.0, 4.0, 5.0])
