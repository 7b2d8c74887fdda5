"""bnn.pooling: max-pooling by strided slices equals tf.nn.max_pool2d, values and gradients,
ties included; the layer takes that path only under XLA and saves and loads as itself."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from bnn import models
from bnn.layers.pooling import MaxPooling2D
from bnn.ops.fused import max_pool_slices


def _value_and_grad(pool, x, dy, jit):
    def f(x, dy):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = pool(x)
        return y, tape.gradient(y, x, dy)
    return [t.numpy() for t in tf.function(f, jit_compile=jit)(x, dy)]


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("k, shape", [(2, (3, 8, 6, 5)), (2, (2, 7, 5, 3)), (3, (2, 9, 7, 4))])
def test_slices_equal_max_pool_values_and_gradients_with_ties(k, shape, jit):
    rng = np.random.default_rng(k + shape[1])
    x = tf.constant(rng.integers(-2, 3, shape).astype(np.float32))  # many ties per window
    out_shape = (shape[0], shape[1] // k, shape[2] // k, shape[3])
    dy = tf.constant(rng.standard_normal(out_shape).astype(np.float32))
    # The reference runs without XLA: under op determinism (which other tests enable for the
    # whole process) XLA refuses TensorFlow's max-pool gradient.
    want = _value_and_grad(lambda t: tf.nn.max_pool2d(t, k, k, "VALID"), x, dy, False)
    got = _value_and_grad(lambda t: max_pool_slices(t, k), x, dy, jit)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    assert np.count_nonzero(got[1]) == np.count_nonzero(dy)  # one input per window


def _paths_taken(monkeypatch):
    calls = []
    real = max_pool_slices
    monkeypatch.setattr("bnn.pooling.max_pool_slices",
                        lambda x, k: calls.append(k) or real(x, k))
    return calls


@pytest.mark.parametrize("jit, sliced", [(True, True), (False, False)])
def test_layer_slices_only_under_xla(monkeypatch, jit, sliced):
    calls = _paths_taken(monkeypatch)
    layer = MaxPooling2D(2)
    x = tf.constant(np.arange(64, dtype=np.float32).reshape(2, 4, 4, 2))
    got = _value_and_grad(layer, x, tf.ones([2, 2, 2, 2]), jit)
    assert bool(calls) == sliced
    want = _value_and_grad(lambda t: tf.nn.max_pool2d(t, 2, 2, "VALID"), x,
                           tf.ones([2, 2, 2, 2]), False)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_overlapping_or_padded_pools_are_keras_pools(monkeypatch):
    calls = _paths_taken(monkeypatch)
    x = tf.constant(np.random.default_rng(0).standard_normal((1, 6, 6, 2)).astype(np.float32))
    for layer, want in ((MaxPooling2D(3, strides=2), tf.nn.max_pool2d(x, 3, 2, "VALID")),
                        (MaxPooling2D(2, padding="same"), tf.nn.max_pool2d(x, 2, 2, "SAME"))):
        got = tf.function(layer, jit_compile=True)(x)
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert calls == []


def test_vgg_small_uses_it_and_round_trips(tmp_path):
    model = models.build("vgg_small", "binary", input_shape=(8, 8, 3),
                         filters=(4, 4, 8, 8, 8, 8), dense_units=(16, 16))
    pools = [layer for layer in model.layers if isinstance(layer, keras.layers.MaxPooling2D)]
    assert len(pools) == 3 and all(type(p) is MaxPooling2D for p in pools)
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    assert [type(layer) for layer in loaded.layers] == [type(layer) for layer in model.layers]

