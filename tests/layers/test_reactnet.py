"""RSign, RPReLU and the ReActNet-style binary ResNet: values and gradients against numpy
formulas, serialization, and the twins built from one spec."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import bnn
from bnn import models
from bnn.layers import RPReLU, RSign


def np_sign(a):
    return np.where(a >= 0, 1.0, -1.0)


def value_and_gradients(layer, x, upstream):
    """``layer(x)`` and the gradients of ``sum(upstream * layer(x))`` for x and the weights."""
    x = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x)
        loss = tf.reduce_sum(y * upstream)
    grads = tape.gradient(loss, [x] + layer.trainable_weights)
    return y.numpy(), [g.numpy() for g in grads]


@pytest.fixture
def batch():
    rng = np.random.default_rng(0)
    x = rng.normal(scale=1.5, size=(3, 4, 5, 6)).astype("float32")
    upstream = rng.normal(size=x.shape).astype("float32")
    return rng, x, upstream


def test_rsign_is_the_sign_of_x_minus_a_per_channel_threshold_with_the_ste_gradient(batch):
    rng, x, upstream = batch
    layer = RSign()
    layer.build(x.shape)
    t = rng.normal(scale=0.5, size=6).astype("float32")
    layer.threshold.assign(t)
    y, (dx, dt) = value_and_gradients(layer, x, upstream)
    inside = np.abs(x - t) <= 1.0
    np.testing.assert_array_equal(y, np_sign(x - t))
    np.testing.assert_allclose(dx, upstream * inside, rtol=1e-6)
    np.testing.assert_allclose(dt, -(upstream * inside).sum(axis=(0, 1, 2)), rtol=1e-5, atol=1e-5)


def test_rsign_with_approx_sign_has_the_bireal_gradient(batch):
    rng, x, upstream = batch
    layer = RSign("approx_sign")
    layer.build(x.shape)
    t = rng.normal(scale=0.5, size=6).astype("float32")
    layer.threshold.assign(t)
    y, (dx, dt) = value_and_gradients(layer, x, upstream)
    slope = np.maximum(2 - 2 * np.abs(x - t), 0)
    np.testing.assert_array_equal(y, np_sign(x - t))
    np.testing.assert_allclose(dx, upstream * slope, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dt, -(upstream * slope).sum(axis=(0, 1, 2)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs", [{"quantizer": None}, {"precision": "float"}])
def test_rsign_without_a_sign_is_the_shift_alone(batch, kwargs):
    rng, x, upstream = batch
    layer = RSign(**kwargs)
    layer.build(x.shape)
    t = rng.normal(size=6).astype("float32")
    layer.threshold.assign(t)
    y, (dx, dt) = value_and_gradients(layer, x, upstream)
    np.testing.assert_allclose(y, x - t, rtol=1e-6)
    np.testing.assert_allclose(dx, upstream, rtol=1e-6)
    np.testing.assert_allclose(dt, -upstream.sum(axis=(0, 1, 2)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("activation, value, slope", [
    ("relu", lambda z: np.maximum(z, 0), lambda z: (z > 0).astype("float32")),
    ("tanh", np.tanh, lambda z: 1 - np.tanh(z) ** 2)])
def test_float_rsign_applies_its_float_activation_after_the_shift(batch, activation, value, slope):
    rng, x, upstream = batch
    layer = RSign(precision="float", float_activation=activation)
    layer.build(x.shape)
    t = rng.normal(scale=0.5, size=6).astype("float32")
    layer.threshold.assign(t)
    y, (dx, dt) = value_and_gradients(layer, x, upstream)
    np.testing.assert_allclose(y, value(x - t), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dx, upstream * slope(x - t), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dt, -(upstream * slope(x - t)).sum(axis=(0, 1, 2)), rtol=1e-4,
                               atol=1e-4)
    binary = RSign(precision="binary", float_activation=activation)  # the sign, unchanged
    binary.build(x.shape)
    np.testing.assert_array_equal(binary(x).numpy(), np_sign(x))


def test_rprelu_values_and_gradients_match_the_formula(batch):
    rng, x, upstream = batch
    layer = RPReLU()
    layer.build(x.shape)
    gamma, beta, zeta = (rng.normal(scale=0.5, size=6).astype("float32") for _ in range(3))
    for variable, value in zip((layer.gamma, layer.beta, layer.zeta), (gamma, beta, zeta)):
        variable.assign(value)
    y, (dx, dgamma, dbeta, dzeta) = value_and_gradients(layer, x, upstream)
    z = x - gamma
    slope = np.where(z > 0, 1.0, beta)
    np.testing.assert_allclose(y, np.where(z > 0, z, beta * z) + zeta, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dx, upstream * slope, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dgamma, -(upstream * slope).sum(axis=(0, 1, 2)), rtol=1e-4,
                               atol=1e-4)
    np.testing.assert_allclose(dbeta, (upstream * np.minimum(z, 0)).sum(axis=(0, 1, 2)),
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dzeta, upstream.sum(axis=(0, 1, 2)), rtol=1e-4, atol=1e-4)


def test_rprelu_of_a_list_is_the_rprelu_of_the_sum_with_the_same_gradient_for_each_term(batch):
    rng, x, upstream = batch
    other = rng.normal(size=x.shape).astype("float32")
    fused, plain = RPReLU(), RPReLU()
    for layer in (fused, plain):
        layer.build(x.shape)
    for a, b in zip(fused.weights, plain.weights):
        value = rng.normal(scale=0.5, size=a.shape).astype("float32")
        a.assign(value)
        b.assign(value)
    terms = [tf.constant(x), tf.constant(other)]
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(terms)
        y = fused(terms)
        reference = plain(terms[0] + terms[1])
        loss, loss_ref = tf.reduce_sum(y * upstream), tf.reduce_sum(reference * upstream)
    np.testing.assert_allclose(y.numpy(), reference.numpy(), rtol=1e-6, atol=1e-6)
    d_terms = tape.gradient(loss, terms)
    d_sum = tape.gradient(loss_ref, terms[0])
    for d in d_terms:
        np.testing.assert_allclose(d.numpy(), d_sum.numpy(), rtol=1e-6, atol=1e-6)
    for a, b in zip(tape.gradient(loss, fused.weights), tape.gradient(loss_ref, plain.weights)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-4)


def test_rprelu_starts_as_a_prelu_with_slope_one_quarter():
    layer = RPReLU()
    x = np.array([[-2.0, -0.5, 0.0, 3.0]], "float32")
    np.testing.assert_allclose(layer(x).numpy(), [[-0.5, -0.125, 0.0, 3.0]])
    assert RPReLU(slope=0.1)(x).numpy()[0, 0] == pytest.approx(-0.2)


def test_rsign_and_rprelu_compute_in_bfloat16_with_float32_weights_under_mixed_precision():
    x = tf.random.normal([2, 3, 3, 4])
    policy = "mixed_bfloat16"
    for layer in (RSign(dtype=policy), RSign(None, dtype=policy), RPReLU(dtype=policy)):
        with tf.GradientTape() as tape:
            y = layer(x)
            loss = tf.reduce_sum(tf.cast(y, tf.float32))
        assert y.dtype == tf.bfloat16
        grads = tape.gradient(loss, layer.trainable_weights)
        assert all(w.dtype == "float32" and g is not None for w, g in
                   zip(layer.trainable_weights, grads))


def test_layers_round_trip_through_save_and_load(tmp_path):
    model = keras.Sequential([keras.Input((4, 4, 3)), RSign("approx_sign", name="rs"),
                              RSign(None, precision="float", name="shift"),
                              RSign(precision="float", float_activation="elu", name="elu"),
                              RPReLU(slope=0.1, name="rp")])
    rng = np.random.default_rng(1)
    for w in model.weights:
        w.assign(rng.normal(size=w.shape).astype("float32"))
    x = rng.normal(size=(2, 4, 4, 3)).astype("float32")
    model.save(tmp_path / "m.keras")
    restored = keras.models.load_model(tmp_path / "m.keras")
    np.testing.assert_array_equal(model(x).numpy(), restored(x).numpy())
    assert restored.get_layer("rs").quantizer == bnn.quantizers.get("approx_sign")
    assert restored.get_layer("shift").precision == "float"
    assert restored.get_layer("shift").quantizer is None
    assert restored.get_layer("elu").float_activation == "elu"
    assert restored.get_layer("rp").slope == 0.1


def test_rsign_refuses_an_unknown_precision():
    with pytest.raises(ValueError, match="precision must be one of"):
        RSign(precision="half")


TINY = dict(input_shape=(8, 8, 3), stages=(4, 8), blocks_per_stage=2)


def test_reactnet_twins_have_the_same_parameters_and_only_the_binary_one_binarizes():
    binary = models.build("reactnet_resnet", "binary", **TINY)
    float_twin = models.build("reactnet_resnet", "float", **TINY)
    assert [w.shape for w in binary.weights] == [w.shape for w in float_twin.weights]
    convs = [layer for layer in binary.layers if isinstance(layer, bnn.BinaryConv2D)]
    assert len(convs) == 4 and all(c.quantized and c.pad_values == 1.0 for c in convs)
    assert [c.strides for c in convs] == [(1, 1), (1, 1), (2, 2), (1, 1)]
    assert not any(getattr(layer, "quantized", False) for layer in float_twin.layers)
    names = [layer.name for layer in binary.layers]
    assert "s1b0_proj" in names and "s0b0_proj" not in names  # downsampling shortcut only
    assert sum(isinstance(layer, RSign) for layer in binary.layers) == 4
    assert sum(isinstance(layer, RPReLU) for layer in binary.layers) == 4
    assert binary.output_shape == (None, 10)


def test_reactnet_binary_block_computes_bn_of_the_sign_convolution_plus_the_shortcut():
    model = models.build("reactnet_resnet", "binary", input_shape=(6, 6, 2), stages=(2,),
                         blocks_per_stage=1, rprelu=False)
    rng = np.random.default_rng(2)
    for w in model.weights:  # variances positive, the rest anything
        value = rng.normal(scale=0.5, size=w.shape).astype("float32")
        w.assign(np.abs(value) + 0.1 if "variance" in w.path else value)
    x = rng.normal(size=(2, 6, 6, 2)).astype("float32")
    stem = keras.Model(model.input, model.get_layer("stem_bn").output)(x).numpy()
    added = keras.Model(model.input, model.get_layer("s0b0_add").output)(x).numpy()
    t = model.get_layer("s0b0_rsign").threshold.numpy()
    kernel = np_sign(model.get_layer("s0b0_conv").kernel.numpy())
    signs = np.pad(np_sign(stem - t), [(0, 0), (1, 1), (1, 1), (0, 0)], constant_values=1.0)
    conv = np.zeros((2, 6, 6, 2))
    for i in range(6):
        for j in range(6):
            conv[:, i, j] = signs[:, i:i + 3, j:j + 3].reshape(2, -1) @ kernel.reshape(-1, 2)
    bn = model.get_layer("s0b0_bn")
    mean, var = bn.moving_mean.numpy(), bn.moving_variance.numpy()
    expected = stem + (conv - mean) / np.sqrt(var + bn.epsilon) * bn.gamma.numpy() + bn.beta.numpy()
    assert np.isfinite(expected).all()
    np.testing.assert_allclose(added, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rprelu", [True, False])
def test_reactnet_float_twin_has_its_float_activation_where_the_binary_model_takes_the_sign(
        rprelu):
    binary = models.build("reactnet_resnet", "binary", rprelu=rprelu, **TINY)
    float_twin = models.build("reactnet_resnet", "float", rprelu=rprelu, float_activation="tanh",
                              **TINY)
    assert not any(isinstance(layer, keras.layers.Activation) for layer in binary.layers)
    for block in ("s0b0", "s0b1", "s1b0", "s1b1"):
        rsign = float_twin.get_layer(f"{block}_rsign")  # tanh(x - t), fused
        assert rsign.float_activation == "tanh" and rsign.precision == "float"
        assert float_twin.get_layer(f"{block}_conv").input is rsign.output
    assert sum(isinstance(layer, RPReLU) for layer in float_twin.layers) == (4 if rprelu else 0)
    plain = models.build("reactnet_resnet", "float", learnable_threshold=False,
                         float_activation="tanh", **TINY)
    assert plain.get_layer("s0b0_act").activation.__name__ == "tanh"
    assert plain.get_layer("s0b0_conv").input is plain.get_layer("s0b0_act").output


def test_reactnet_model_trains_a_step_and_round_trips_through_save(tmp_path):
    model = models.build("reactnet_resnet", "binary", **TINY)
    model.compile(bnn.optimizers.Adam(1e-2),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(8, 8, 8, 3)).astype("float32"), rng.integers(0, 10, 8)
    loss = model.train_on_batch(x, y)
    assert np.isfinite(loss)
    model.save(tmp_path / "r.keras")
    restored = keras.models.load_model(tmp_path / "r.keras")
    np.testing.assert_allclose(model.predict(x, verbose=0), restored.predict(x, verbose=0),
                               rtol=1e-6)
