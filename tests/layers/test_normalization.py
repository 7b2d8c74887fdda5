"""bnn.normalization.BatchNormalization: Keras' layer, trained on the fused kernel outside XLA and
on a matrix view of its input under XLA, with Keras' results either way."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from bnn import models
from bnn.layers.normalization import BatchNormalization


def _pair(shape=(None, 6, 5, 7), **options):
    """A bnn and a Keras layer with the same arguments and the same random variables."""
    ours, theirs = BatchNormalization(**options), keras.layers.BatchNormalization(**options)
    rng = np.random.default_rng(1)
    for layer in (ours, theirs):
        layer.build(shape)
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
            loss = tf.reduce_sum(y * tf.cast(tf.linspace(-1.0, 1.0, int(y.shape[-1])), y.dtype))
        return y, tape.gradient(loss, [x] + layer.trainable_weights)

    return step(x)


@pytest.mark.parametrize("shape", [(4, 6, 5, 7), (12, 7)], ids=["images", "dense"])
@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("options", [{}, {"scale": False}, {"center": False, "momentum": 0.5},
                                     {"epsilon": 1e-5}])
def test_training_step_matches_keras(options, jit, shape):
    ours, theirs = _pair((None, *shape[1:]), **options)
    x = tf.constant(np.random.default_rng(0).normal(2.0, 3.0, shape).astype(np.float32))
    y1, g1 = _train_step(ours, x, jit)
    y2, g2 = _train_step(theirs, x, jit)
    np.testing.assert_allclose(y1.numpy(), y2.numpy(), rtol=1e-5, atol=1e-5)
    assert len(g1) == len(g2)
    for a, b in zip(g1, g2):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-4)
    for a, b in zip(ours.non_trainable_weights, theirs.non_trainable_weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


def test_a_dense_layers_outputs_take_the_fused_kernel_outside_xla():
    layer = BatchNormalization()
    layer.build((None, 5))
    fn = tf.function(lambda x: layer(x, training=True))
    graph = fn.get_concrete_function(tf.TensorSpec([3, 5])).graph
    assert "FusedBatchNormV3" in {op.type for op in graph.get_operations()}


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


@pytest.mark.parametrize("shape", [(4, 9, 7), (3, 2, 4, 5, 7)])
def test_training_step_matches_keras_under_xla_for_other_ranks(shape):
    ours, theirs = _pair(shape=(None,) + shape[1:])
    x = tf.constant(np.random.default_rng(4).normal(-1.0, 2.0, shape).astype(np.float32))
    y1, g1 = _train_step(ours, x, True)
    y2, g2 = _train_step(theirs, x, True)
    np.testing.assert_allclose(y1.numpy(), y2.numpy(), rtol=1e-5, atol=1e-5)
    for a, b in zip(g1, g2):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-4)
    for a, b in zip(ours.non_trainable_weights, theirs.non_trainable_weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


def test_mixed_precision_under_xla_matches_keras():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        ours, theirs = _pair()
        x = tf.constant(np.random.default_rng(5).normal(1.0, 2.0, (4, 6, 5, 7)), tf.float16)
        y1, _ = _train_step(ours, x, True)
        y2, _ = _train_step(theirs, x, True)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert y1.dtype == y2.dtype == tf.float16
    np.testing.assert_allclose(y1.numpy().astype(np.float32), y2.numpy().astype(np.float32),
                               rtol=1e-2, atol=1e-2)
    for a, b in zip(ours.non_trainable_weights, theirs.non_trainable_weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


def _moment_input_ranks(layer, jit, training=True):
    """Ranks of the tensors whose means the traced step of ``layer`` takes."""
    spec = tf.TensorSpec([2, 4, 4, 3])
    fn = tf.function(lambda x: layer(x, training=training), jit_compile=jit)
    graph = fn.get_concrete_function(spec).graph
    return {op.inputs[0].shape.rank for op in graph.get_operations() if op.type == "Mean"}


def test_statistics_of_a_matrix_view_only_under_xla_in_training():
    layer = BatchNormalization()
    layer.build((None, 4, 4, 3))
    assert _moment_input_ranks(layer, True) == {2}
    assert _moment_input_ranks(layer, False) == set()  # the fused kernel
    assert _moment_input_ranks(layer, True, training=False) == set()  # moving statistics
    renorm = BatchNormalization(renorm=True)
    renorm.build((None, 4, 4, 3))
    assert _moment_input_ranks(renorm, True) == {4}  # Keras' own path


@pytest.mark.parametrize("training", [True, False])
def test_bfloat16_batch_norm_takes_the_fused_kernel_with_keras_results(training):
    ours, theirs = _pair(dtype="mixed_bfloat16", scale=training, momentum=0.8)
    x = tf.cast(tf.random.stateless_normal((4, 6, 5, 7), [2, 3]) * 2 + 1, tf.bfloat16)
    mine = ours(x, training=training)
    keras_out = theirs(x, training=training)
    assert mine.dtype == keras_out.dtype == tf.bfloat16
    np.testing.assert_allclose(tf.cast(mine, tf.float32).numpy(),
                               tf.cast(keras_out, tf.float32).numpy(), rtol=2e-2, atol=2e-2)
    for a, b in zip(ours.non_trainable_weights, theirs.non_trainable_weights):  # moving stats
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
    graph = tf.function(lambda t: ours(t, training=training)).get_concrete_function(x).graph
    assert any(op.type == "FusedBatchNormV3" for op in graph.get_operations())
