"""bnn.normalization.BatchNormalization: Keras' layer, trained on the fused kernel outside XLA."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from bnn import models
from bnn.normalization import BatchNormalization


def _pair(**options):
    """A bnn and a Keras layer with the same arguments and the same random variables."""
    ours, theirs = BatchNormalization(**options), keras.layers.BatchNormalization(**options)
    rng = np.random.default_rng(1)
    for layer in (ours, theirs):
        layer.build((None, 6, 5, 7))
    for a, b in zip(ours.weights, theirs.weights):
        value = rng.uniform(0.5, 1.5, a.shape).astype(np.float32)
        a.assign(value)
        b.assign(value)
    return ours, theirs


def _train_step(layer, x, jit):
    @tf.function(jit_compile=jit)
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, training=True)
            loss = tf.reduce_sum(y * tf.linspace(-1.0, 1.0, int(y.shape[-1])))
        return y, tape.gradient(loss, [x] + layer.trainable_weights)

    return step(x)


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("options", [{}, {"scale": False}, {"center": False, "momentum": 0.5},
                                     {"epsilon": 1e-5}])
def test_training_step_matches_keras(options, jit):
    ours, theirs = _pair(**options)
    x = tf.constant(np.random.default_rng(0).normal(2.0, 3.0, (4, 6, 5, 7)).astype(np.float32))
    y1, g1 = _train_step(ours, x, jit)
    y2, g2 = _train_step(theirs, x, jit)
    np.testing.assert_allclose(y1.numpy(), y2.numpy(), rtol=1e-5, atol=1e-5)
    assert len(g1) == len(g2)
    for a, b in zip(g1, g2):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-4)
    for a, b in zip(ours.non_trainable_weights, theirs.non_trainable_weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


def test_fused_kernel_runs_outside_xla_only():
    layer = BatchNormalization()
    layer.build((None, 4, 4, 3))
    spec = tf.TensorSpec([2, 4, 4, 3])

    def ops(jit):
        fn = tf.function(lambda x: layer(x, training=True), jit_compile=jit)
        return {op.type for op in fn.get_concrete_function(spec).graph.get_operations()}

    assert "FusedBatchNormV3" in ops(False)
    assert "FusedBatchNormV3" not in ops(True)
    inference = tf.function(lambda x: layer(x, training=False)).get_concrete_function(spec)
    assert "FusedBatchNormV3" not in {op.type for op in inference.graph.get_operations()}


def test_one_value_per_channel_gives_keras_zero_variance():
    ours, theirs = _pair()
    x = tf.constant(np.random.default_rng(2).normal(size=(1, 1, 1, 7)).astype(np.float32))
    _train_step(ours, x, False)
    _train_step(theirs, x, False)
    for a, b in zip(ours.non_trainable_weights, theirs.non_trainable_weights):
        assert np.all(np.isfinite(a.numpy()))
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


def test_models_use_it_and_save_and_load(tmp_path):
    model = models.build("vgg_small", "binary", input_shape=(8, 8, 3), filters=(4, 4, 8, 8, 8, 8),
                         dense_units=(16, 16))
    norms = [layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)]
    assert norms and all(isinstance(layer, BatchNormalization) for layer in norms)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    x = np.random.default_rng(3).uniform(-1, 1, (2, 8, 8, 3)).astype(np.float32)
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))
    assert type(loaded.get_layer(norms[0].name)) is BatchNormalization
