import numpy as np
import keras
import pytest
import tensorflow as tf

import bnn
from bnn.layers import conv


def np_sign(a):
    return np.where(a >= 0, 1.0, -1.0).astype("float32")


def np_conv2d_valid(x, w):
    """Reference NHWC 'valid' convolution (cross-correlation), stride 1, in float64."""
    n, h, wd, _ = x.shape
    kh, kw, _, f = w.shape
    out = np.zeros((n, h - kh + 1, wd - kw + 1, f))
    for i in range(out.shape[1]):
        for j in range(out.shape[2]):
            patch = x[:, i:i + kh, j:j + kw, :].reshape(n, -1)
            out[:, i, j, :] = patch @ w.reshape(-1, f)
    return out


def test_binary_dense_forward_equals_numpy_sign_times_sign():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(7, 33)).astype("float32")
    layer = bnn.BinaryDense(5)
    y = layer(x).numpy()
    w = layer.kernel.numpy()
    np.testing.assert_array_equal(y, np_sign(x) @ np_sign(w))
    assert set(np.unique(y)) <= set(range(-33, 34, 2))


def test_binary_dense_under_bfloat16_policy_reads_its_latent_kernel_uncast(monkeypatch):
    """Under mixed_bfloat16 the packed product takes the float32 latent kernel as it is (no
    cast to bfloat16 first): the output is the bfloat16 product of the signs, and the kernel's
    gradient is float32, straight through."""
    monkeypatch.setenv("BNN_PACKED_FORWARD", "1")
    rng = np.random.default_rng(2)
    x = rng.normal(size=(6, 70)).astype("float32")
    layer = bnn.BinaryDense(9, dtype="mixed_bfloat16")
    layer.build((None, 70))
    reads = []
    original = layer._sign_source
    monkeypatch.setattr(layer, "_sign_source", lambda: reads.append(original()) or reads[-1])
    with tf.GradientTape() as tape:
        y = layer(x, training=True)
        loss = tf.reduce_sum(tf.cast(y, tf.float32))
    (dw,) = tape.gradient(loss, [layer.kernel.value])
    assert reads and all(kernel.dtype == tf.float32 for kernel in reads)
    w = layer.kernel.numpy()
    assert y.dtype == tf.bfloat16 and dw.dtype == tf.float32
    np.testing.assert_array_equal(y.numpy().astype("float32"), np_sign(x) @ np_sign(w))
    np.testing.assert_array_equal(dw.numpy(), np.repeat(np_sign(x).sum(0)[:, None], 9, axis=1))


def test_binary_dense_first_layer_keeps_real_inputs():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4, 6)).astype("float32")
    layer = bnn.BinaryDense(3, input_quantizer=None)
    np.testing.assert_allclose(layer(x).numpy(), x @ np_sign(layer.kernel.numpy()), rtol=1e-5)


@pytest.mark.parametrize("padding, pad_values", [("valid", 0.0), ("same", 1.0), ("same", -1.0)])
def test_binary_conv2d_forward_equals_numpy_sign_times_sign(padding, pad_values):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(2, 6, 5, 3)).astype("float32")
    layer = bnn.BinaryConv2D(4, 3, padding=padding, pad_values=pad_values)
    y = layer(x).numpy()
    xs = np_sign(x)
    if padding == "same":
        xs = np.pad(xs, [(0, 0), (1, 1), (1, 1), (0, 0)], constant_values=pad_values)
    np.testing.assert_array_equal(y, np_conv2d_valid(xs, np_sign(layer.kernel.numpy())))


def test_binary_conv2d_same_padding_with_zeros_matches_keras():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 5, 5, 2)).astype("float32")
    layer = bnn.BinaryConv2D(3, 3, padding="same", strides=2)
    y = layer(x).numpy()
    ref = keras.ops.conv(np_sign(x), np_sign(layer.kernel.numpy()), strides=2, padding="same")
    np.testing.assert_array_equal(y, ref.numpy())


def test_binary_kernel_is_what_the_forward_pass_uses():
    layer = bnn.BinaryDense(4, input_quantizer=None)
    eye = np.eye(6, dtype="float32")
    np.testing.assert_array_equal(layer(eye).numpy(), layer.binary_kernel().numpy())
    assert set(np.unique(layer.binary_kernel().numpy())) == {-1.0, 1.0}


def test_float_twin_has_same_shapes_and_no_quantization():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(3, 8)).astype("float32")
    twin = bnn.BinaryDense(4, precision="float")
    binary = bnn.BinaryDense(4)
    np.testing.assert_allclose(twin(x).numpy(), x @ twin.kernel.numpy(), rtol=1e-5)
    binary(x)
    assert twin.kernel.shape == binary.kernel.shape
    assert twin.kernel_constraint is None
    assert isinstance(binary.kernel_constraint, bnn.WeightClip)
    with pytest.raises(ValueError, match="has no binary kernel; read layer.kernel"):
        twin.binary_kernel()
    with pytest.raises(ValueError, match="precision must be one of"):
        bnn.BinaryDense(4, precision="half")


def test_vgg_small_real_first_layer_keeps_only_the_first_kernel_real():
    x = np.random.default_rng(6).normal(size=(2, 8, 8, 3)).astype("float32")
    model = bnn.models.vgg_small(input_shape=(8, 8, 3), filters=(4, 4, 8, 8, 8, 8),
                                 dense_units=(16,), real_first_layer=True)
    first, second = model.get_layer("conv0"), model.get_layer("conv1")
    assert first.kernel_quantizer is None and first.kernel_constraint is None
    assert isinstance(second.kernel_quantizer, bnn.quantizers.SteSign)
    first.kernel.assign(3.0 * first.kernel)  # beyond ±1: neither clipped nor binarized
    padded = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=1.0)
    np.testing.assert_allclose(first(x).numpy(), np_conv2d_valid(padded, first.kernel.numpy()),
                               rtol=1e-4, atol=1e-4)
    twin = bnn.models.vgg_small("float", input_shape=(8, 8, 3), filters=(4, 4, 8, 8, 8, 8),
                                dense_units=(16,), real_first_layer=True)
    assert twin.count_params() == model.count_params()


def test_scale_kernel_multiplies_by_mean_abs_per_output_channel():
    layer = bnn.BinaryDense(3, scale_kernel=True, input_quantizer=None)
    eye = np.eye(5, dtype="float32")
    layer.build((None, 5))
    w = layer.kernel.numpy()
    expected = np_sign(w) * np.abs(w).mean(axis=0)
    np.testing.assert_allclose(layer(eye).numpy(), expected, rtol=1e-6)


@pytest.mark.parametrize("make", [lambda: bnn.BinaryDense(16),
                                  lambda: bnn.BinaryConv2D(4, 3, padding="same", pad_values=1)])
def test_latent_weights_stay_clipped_after_a_large_learning_rate_step(make):
    layer = make()
    shape = (8, 12) if isinstance(layer, bnn.BinaryDense) else (2, 6, 6, 3)
    model = keras.Sequential([keras.Input(shape[1:]), layer, keras.layers.Flatten(),
                              keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(learning_rate=1000.0), "mse")
    rng = np.random.default_rng(5)
    model.fit(rng.normal(size=shape), rng.normal(size=(shape[0], 1)) * 100, epochs=2, verbose=0)
    kernel = layer.kernel.numpy()
    assert np.abs(kernel).max() <= 1.0
    assert np.isclose(np.abs(kernel).max(), 1.0)  # the step was large enough to need clipping


def test_xla_and_eager_forward_identical():
    rng = np.random.default_rng(6)
    model = keras.Sequential([keras.Input((8, 8, 3)),
                              bnn.BinaryConv2D(8, 3, input_quantizer=None, padding="same"),
                              keras.layers.BatchNormalization(),
                              bnn.BinaryConv2D(8, 3, padding="same", pad_values=1.0),
                              keras.layers.Flatten(), bnn.BinaryDense(10)])
    x = rng.normal(size=(4, 8, 8, 3)).astype("float32")
    eager = model(x, training=False).numpy()
    xla = tf.function(lambda t: model(t, training=False), jit_compile=True)(x).numpy()
    np.testing.assert_array_equal(eager, xla)


def test_save_and_load_without_custom_objects(tmp_path):
    model = keras.Sequential([
        keras.Input((6, 6, 2)),
        bnn.BinaryConv2D(4, 3, input_quantizer=None, pad_values=1.0, padding="same"),
        keras.layers.BatchNormalization(),
        keras.layers.Flatten(),
        bnn.BinaryDense(5, kernel_quantizer={"name": "ste_sign", "clip_value": 0.5},
                        scale_kernel=True),
        bnn.BinaryDense(3, precision="float"),
    ])
    x = np.random.default_rng(7).normal(size=(3, 6, 6, 2)).astype("float32")
    path = tmp_path / "m.keras"
    model.save(path)
    restored = keras.models.load_model(path)
    np.testing.assert_array_equal(model(x).numpy(), restored(x).numpy())
    dense = restored.layers[3]
    assert dense.kernel_quantizer.get_config() == {"clip_value": 0.5}
    assert dense.scale_kernel and restored.layers[4].precision == "float"


def test_train_step_under_mirrored_strategy_on_two_logical_cpus():
    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    if len(devices) < 2:
        pytest.skip("needs 2 logical CPU devices, configured in conftest before TF starts")
    strategy = tf.distribute.MirroredStrategy(
        devices[:2], cross_device_ops=tf.distribute.ReductionToOneDevice())
    with strategy.scope():
        model = keras.Sequential([keras.Input((10,)), bnn.BinaryDense(8, input_quantizer=None),
                                  keras.layers.BatchNormalization(), bnn.BinaryDense(2)])
        model.compile(keras.optimizers.Adam(0.1), "mse")
    before = model.layers[0].kernel.numpy()
    rng = np.random.default_rng(8)
    history = model.fit(rng.normal(size=(32, 10)), rng.normal(size=(32, 2)), batch_size=16,
                        epochs=1, verbose=0)
    after = model.layers[0].kernel.numpy()
    assert np.isfinite(history.history["loss"][0])
    assert not np.array_equal(before, after) and np.abs(after).max() <= 1.0


@pytest.mark.parametrize("make", [lambda **kw: bnn.BinaryDense(4, **kw),
                                  lambda **kw: bnn.BinaryConv2D(4, 3, **kw)])
def test_initial_kernel_is_clipped_into_the_weight_clip_range(make):
    layer = make(kernel_initializer=keras.initializers.RandomUniform(-3.0, 3.0))
    layer.build((2, 5, 5, 3) if isinstance(layer, bnn.BinaryConv2D) else (2, 6))
    kernel = layer.kernel.numpy()
    assert np.abs(kernel).max() <= 1.0 and (np.abs(kernel) == 1.0).any()
    unclipped = make(kernel_initializer=keras.initializers.Constant(3.0), kernel_constraint=None)
    unclipped.build((2, 5, 5, 3) if isinstance(unclipped, bnn.BinaryConv2D) else (2, 6))
    assert (unclipped.kernel.numpy() == 3.0).all()


def _kernel_gradient(layer, x):
    with tf.GradientTape() as tape:
        y = layer(x)
        loss = tf.reduce_sum(y * tf.range(1.0, y.shape[-1] + 1.0))
    return tape.gradient(loss, layer.kernel).numpy()


def test_kernel_gradient_is_the_straight_through_estimate_with_and_without_the_fast_path():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(8, 6)).astype("float32")
    upstream = np.arange(1.0, 4.0, dtype="float32")  # d loss / d y, per unit
    expected_in_range = np_sign(x).T @ np.tile(upstream, (8, 1))  # mask all ones
    clipped = bnn.BinaryDense(3)  # WeightClip(1): the mask is skipped, being all ones
    clipped.build((8, 6))
    assert clipped._kernel_in_range()
    np.testing.assert_allclose(_kernel_gradient(clipped, x), expected_in_range, rtol=1e-6)
    wide = bnn.BinaryDense(3, kernel_constraint=bnn.WeightClip(2.0))  # mask computed
    wide.build((8, 6))
    assert not wide._kernel_in_range()
    wide.kernel.assign(np.where(rng.random((6, 3)) < 0.3, 1.5, 0.5) * np_sign(
        rng.normal(size=(6, 3))))
    mask = (np.abs(wide.kernel.numpy()) <= 1.0).astype("float32")
    np.testing.assert_allclose(_kernel_gradient(wide, x), expected_in_range * mask, rtol=1e-6)


@pytest.mark.parametrize("strides, dilation", [(1, 1), (2, 1), (1, 2)])
def test_plus_one_padding_by_correction_equals_padding_the_inputs(strides, dilation):
    rng = np.random.default_rng(5)
    x = rng.normal(size=(3, 7, 9, 4)).astype("float32")
    layer = bnn.BinaryConv2D(5, 3, padding="same", pad_values=1.0, strides=strides,
                             dilation_rate=dilation)
    y = layer(x).numpy()
    pads = conv._same_padding(layer, x)
    padded = np.pad(np_sign(x), pads, constant_values=1.0)
    expected = tf.nn.conv2d(padded, np_sign(layer.kernel.numpy()), strides, "VALID",
                            dilations=dilation).numpy()
    np.testing.assert_array_equal(y, expected)
    assert layer._padding_correction(tf.constant(np_sign(x)), layer.kernel) is not None


def _np_signs(a):
    return np.where(np.asarray(a) >= 0, 1.0, -1.0).astype("float32")


@pytest.mark.parametrize("padding, pad_values", [("valid", 0.0), ("same", 0.0), ("same", 1.0),
                                                 ("same", -1.0)])
def test_binary_depthwise_and_separable_equal_keras_layers_on_signs(padding, pad_values):
    x = np.random.default_rng(4).normal(size=(2, 7, 6, 3)).astype("float32")
    depthwise = bnn.layers.BinaryDepthwiseConv2D(3, padding=padding, pad_values=pad_values,
                                                 depth_multiplier=2)
    separable = bnn.layers.BinarySeparableConv2D(4, 3, padding=padding, pad_values=pad_values)
    y_depthwise, y_separable = np.asarray(depthwise(x)), np.asarray(separable(x))
    signs = _np_signs(x)
    if pad_values:  # explicit 'same' padding of the binarized inputs, then a valid convolution
        signs = np.pad(signs, [(0, 0), (1, 1), (1, 1), (0, 0)], constant_values=pad_values)
    keras_padding = "valid" if pad_values else padding
    ref_d = keras.layers.DepthwiseConv2D(3, padding=keras_padding, depth_multiplier=2,
                                         use_bias=False)
    ref_d.build(signs.shape)
    ref_d.set_weights([_np_signs(depthwise.kernel)])
    ref_s = keras.layers.SeparableConv2D(4, 3, padding=keras_padding, use_bias=False)
    ref_s.build(signs.shape)
    ref_s.set_weights([_np_signs(separable.depthwise_kernel),
                       _np_signs(separable.pointwise_kernel)])
    np.testing.assert_allclose(y_depthwise, np.asarray(ref_d(signs)), atol=1e-5)
    np.testing.assert_allclose(y_separable, np.asarray(ref_s(signs)), atol=1e-5)


def test_depthwise_and_separable_float_twins_are_the_keras_layers():
    x = np.random.default_rng(5).normal(size=(2, 6, 6, 3)).astype("float32")
    for binary, keras_cls, args in (
            (bnn.layers.BinaryDepthwiseConv2D, keras.layers.DepthwiseConv2D, (3,)),
            (bnn.layers.BinarySeparableConv2D, keras.layers.SeparableConv2D, (4, 3))):
        twin = binary(*args, precision="float", use_bias=True, pad_values=1.0, padding="same")
        reference = keras_cls(*args, padding="same")
        twin.build(x.shape)
        reference.build(x.shape)
        reference.set_weights(twin.get_weights())
        assert twin.binary_kernels() == []
        np.testing.assert_allclose(np.asarray(twin(x)), np.asarray(reference(x)), atol=1e-6)


def test_depthwise_and_separable_kernels_are_clipped_listed_and_saved(tmp_path):
    model = keras.Sequential([
        keras.Input((6, 6, 3)),
        bnn.layers.BinaryDepthwiseConv2D(3, padding="same", pad_values=1.0, name="dw",
                                         depthwise_initializer=keras.initializers.Constant(3.0)),
        bnn.layers.BinarySeparableConv2D(4, 3, depthwise_quantizer=None, name="sep"),
    ])
    dw, sep = model.layers
    assert np.abs(dw.kernel.numpy()).max() == 1.0  # WeightClip on the initial kernel
    assert [v.path for v in dw.binary_kernels()] == [dw.kernel.path]
    assert [v.path for v in sep.binary_kernels()] == [sep.pointwise_kernel.path]
    assert set(bnn.optimizers.is_binary_variable_of(model).paths) == {"dw/kernel",
                                                                      "sep/pointwise_kernel"}
    x = np.random.default_rng(6).normal(size=(2, 6, 6, 3)).astype("float32")
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    np.testing.assert_array_equal(np.asarray(loaded(x)), np.asarray(model(x)))
    assert loaded.layers[1].get_config()["depthwise_quantizer"] is None
    assert loaded.layers[0].pad_values == 1.0
