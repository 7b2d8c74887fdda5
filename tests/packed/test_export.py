"""Export to .bnn and packed inference reproduce the Keras model; bad files fail loudly."""

import json
import struct

import keras
import numpy as np
import pytest
import tensorflow as tf

from bnn import models
from bnn.native import dispatch
from bnn.packed.export import (FORMAT_VERSION, ExportError, evaluate, export_model, load_any,
                        load_packed)
from bnn.native.dispatch import EAGER_BATCH
from bnn.layers import BinaryConv2D, BinaryDense


def _randomize_norms(model, rng):
    """Random moving statistics, offsets and gammas (about a third negative, one zero)."""
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            c = layer.moving_mean.shape[0]
            layer.moving_mean.assign(rng.normal(0, 4, c))
            layer.moving_variance.assign(rng.uniform(0.5, 30, c))
            if layer.scale:
                gamma = rng.normal(0.3, 1, c)
                gamma[0] = 0.0
                layer.gamma.assign(gamma)
            if layer.center:
                layer.beta.assign(rng.normal(0, 1, c))
    return model


def _small(name):
    rng = np.random.default_rng(len(name))
    if name == "mlp":
        model = models.build("binarynet_mlp", hidden_units=(64, 64), input_shape=(28, 28, 1))
    elif name in ("vgg", "vgg_real_first"):
        model = models.build("vgg_small", input_shape=(16, 16, 3), filters=(8, 8, 16, 16, 32, 32),
                             dense_units=(64, 64), real_first_layer=name == "vgg_real_first")
    else:  # Keras zero padding, strides, 'valid' padding, biases, >64 channels, input sign
        model = keras.Sequential([
            keras.Input((12, 12, 3)),
            BinaryConv2D(70, 3, padding="same", pad_values=0.0, input_quantizer="ste_sign",
                         name="c0"),
            keras.layers.BatchNormalization(name="b0"),
            BinaryConv2D(20, 3, strides=2, padding="same", pad_values=0.0, use_bias=True,
                         name="c1"),
            keras.layers.BatchNormalization(name="b1"),
            BinaryConv2D(9, 2, padding="valid", name="c2"),
            keras.layers.MaxPooling2D(2, name="p2"),
            keras.layers.BatchNormalization(name="b2"),
            keras.layers.Flatten(),
            keras.layers.Dropout(0.3),
            BinaryDense(5, name="out"),
            keras.layers.BatchNormalization(scale=False, name="b_out"),
        ])
        for layer in model.layers:
            if getattr(layer, "bias", None) is not None and not isinstance(
                    layer, keras.layers.BatchNormalization):
                layer.bias.assign(rng.normal(0, 2, layer.bias.shape))
    return _randomize_norms(model, rng)


@pytest.fixture(scope="module", params=["mlp", "vgg", "vgg_real_first", "zero_pad"])
def exported(request, tmp_path_factory):
    model = _small(request.param)
    path = tmp_path_factory.mktemp("export") / f"{request.param}.bnn"
    summary = export_model(model, path)
    x = np.random.default_rng(7).uniform(-1, 1, (64, *model.inputs[0].shape[1:]))
    return model, path, summary, x.astype(np.float32)


def test_packed_model_reproduces_keras_logits_and_classes(exported):
    model, path, _, x = exported
    expected = model(x, training=False).numpy()
    got = load_packed(path).predict(x, batch_size=len(x))  # one XLA compilation
    np.testing.assert_array_equal(got.argmax(-1), expected.argmax(-1))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.skipif(not dispatch.available(), reason="native kernels unavailable")
def test_native_kernels_give_the_xla_paths_logits(exported):
    _, path, _, x = exported
    native, xla = load_packed(path, native=True), load_packed(path, native=False)
    assert native.native and not xla.native
    for batch in (1, 5, len(x)):  # one example, a small batch, a large one
        np.testing.assert_array_equal(native(x[:batch]).numpy(), xla(x[:batch]).numpy())


def test_export_summary_describes_the_file(exported):
    model, path, summary, _ = exported
    assert summary["bytes"] == path.stat().st_size
    assert summary["float32_bytes"] == 4 * model.count_params()
    assert summary["bytes"] < summary["float32_bytes"]
    binary = [layer.name for layer in model.layers if isinstance(layer, (BinaryDense,
                                                                         BinaryConv2D))]
    assert [s["layer"] for s in summary["stages"]] == binary
    assert summary["stages"][-1]["output"] == "logits"


def test_mlp_file_is_over_20x_smaller_than_float32_weights(tmp_path):
    model = models.build("binarynet_mlp", hidden_units=(512, 512))
    summary = export_model(model, tmp_path / "m.bnn")
    assert summary["compression"] > 20


def test_savedmodel_serves_the_same_logits(exported, tmp_path):
    model, path, _, x = exported
    load_packed(path).save_savedmodel(tmp_path / "saved")
    served = tf.saved_model.load(str(tmp_path / "saved")).signatures["serving_default"]
    (out,) = served(tf.constant(x)).values()
    np.testing.assert_allclose(out.numpy(), model(x, training=False).numpy(), rtol=1e-5,
                               atol=1e-4)


def test_run_directory_export_and_evaluate_agree_with_keras(tmp_path):
    model = _small("mlp")
    (tmp_path / "binary").mkdir()
    model.save(tmp_path / "binary" / "model.keras")
    export_model(tmp_path, tmp_path / "m.bnn")
    x = np.random.default_rng(3).uniform(-1, 1, (50, 28, 28, 1)).astype(np.float32)
    y = model(x, training=False).numpy().argmax(-1)
    y[:10] = (y[:10] + 1) % 10  # 40 of 50 labels agree with the model
    packed = evaluate(tmp_path / "m.bnn", x, y, batch_size=50)
    keras_result = evaluate(tmp_path / "binary" / "model.keras", x, y, batch_size=50)
    assert packed["accuracy"] == keras_result["accuracy"] == 0.8
    assert packed["examples"] == 50 and packed["examples_per_second"] > 0
    np.testing.assert_allclose(load_any(tmp_path / "m.bnn").predict(x, batch_size=50),
                               model(x, training=False).numpy(), rtol=1e-5, atol=1e-4)


def _corrupt(path, tmp_path, how):
    data = bytearray(path.read_bytes())
    if how == "truncated":
        data = data[: len(data) // 2]
    elif how == "flipped byte":
        data[len(data) // 2] ^= 0x10
    elif how == "newer version":
        struct.pack_into("<I", data, 8, FORMAT_VERSION + 1)
    elif how == "version 0":
        struct.pack_into("<I", data, 8, 0)
    elif how == "wrong magic":
        data[:8] = b"NOTABNN!"
    bad = tmp_path / "bad.bnn"
    bad.write_bytes(bytes(data))
    return bad


@pytest.mark.parametrize("how, message", [("truncated", "checksum mismatch"),
                                          ("flipped byte", "checksum mismatch"),
                                          ("newer version",
                                           f"version {FORMAT_VERSION + 1}.*upgrade bnn"),
                                          ("version 0", "version 0.*re-export"),
                                          ("wrong magic", "bad magic")])
def test_damaged_files_raise_export_error(exported, tmp_path, how, message):
    _, path, _, _ = exported
    bad = _corrupt(path, tmp_path, how)
    with pytest.raises(ExportError, match=message) as error:
        load_packed(bad)
    assert str(bad) in str(error.value) and "\n" not in str(error.value)


def test_tiny_file_and_missing_file_raise_export_error(tmp_path):
    (tmp_path / "tiny.bnn").write_bytes(b"BNN")
    with pytest.raises(ExportError, match="truncated"):
        load_packed(tmp_path / "tiny.bnn")
    with pytest.raises(ExportError, match="cannot read"):
        load_packed(tmp_path / "missing.bnn")
    with pytest.raises(ExportError, match="unknown model file type"):
        load_any(tmp_path / "model.h5")


def test_manifest_lists_every_array_with_its_size(exported):
    _, path, _, _ = exported
    data = path.read_bytes()
    length = struct.unpack_from("<Q", data, 12)[0]
    manifest = json.loads(data[20:20 + length])
    assert manifest["blob_bytes"] == len(data) - 20 - length - 32
    assert sum(entry["nbytes"] for entry in manifest["arrays"]) == manifest["blob_bytes"]


@pytest.mark.parametrize("build, message", [
    (lambda: models.build("binarynet_mlp", "float", hidden_units=(8,)), "'dense0'.*float twin"),
    (lambda: models.build("binarynet_mlp", hidden_units=(8,), kernel_quantizer="approx_sign"),
     "'dense0'.*kernel_quantizer"),
    (lambda: models.build("binary_resnet", stages=(8,), blocks_per_stage=1),
     "not a keras.Sequential"),
    (lambda: keras.Sequential([keras.Input((4,)), BinaryDense(3, input_quantizer=None),
                               keras.layers.Dense(2)]), "not followed by BatchNormalization"),
])
def test_unsupported_models_raise_export_error_naming_the_problem(tmp_path, build, message):
    with pytest.raises(ExportError, match=message):
        export_model(build(), tmp_path / "x.bnn")
    assert not (tmp_path / "x.bnn").exists()


# ---- uint8 input encoding: exact integer first layer -------------------------------------------

MNIST_ENCODING = (1 / 127.5, -1.0)


@pytest.fixture(scope="module")
def encoded(tmp_path_factory):
    rng = np.random.default_rng(11)
    model = models.build("binarynet_mlp", hidden_units=(96, 64), input_shape=(28, 28, 1))
    _randomize_norms(model, rng)
    for layer in model.layers:  # first-layer pre-activations span about +-30: scale BN to it
        if isinstance(layer, keras.layers.BatchNormalization) and layer.moving_mean.shape[0] == 96:
            layer.moving_mean.assign(rng.normal(0, 10, 96))
            layer.moving_variance.assign(rng.uniform(50, 300, 96))
    path = tmp_path_factory.mktemp("encoded") / "mlp.bnn"
    summary = export_model(model, path, input_encoding=MNIST_ENCODING)
    pixels = rng.integers(0, 256, (EAGER_BATCH + 3, 28, 28, 1)).astype(np.uint8)
    x = (pixels.astype(np.float32) * np.float32(MNIST_ENCODING[0]) - 1.0).astype(np.float32)
    return model, path, summary, pixels, x


def test_encoded_model_reproduces_keras_from_pixels_and_normalized_inputs(encoded):
    model, path, summary, pixels, x = encoded
    assert summary["input_encoding"] == {"scale": MNIST_ENCODING[0], "offset": -1.0}
    packed = load_packed(path)
    expected = model(x, training=False).numpy()
    from_pixels = packed.predict(pixels, batch_size=len(pixels))
    np.testing.assert_array_equal(from_pixels.argmax(-1), expected.argmax(-1))
    np.testing.assert_allclose(from_pixels, expected, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(packed.predict(x, batch_size=len(x)), from_pixels)


def test_every_batch_path_gives_identical_logits(encoded, monkeypatch):
    _, path, _, pixels, _ = encoded
    packed = load_packed(path)
    large = packed(pixels).numpy()  # int8 oneDNN product (when available), then native or XLA
    small = np.concatenate([packed(pixels[i:i + 5]).numpy() for i in range(0, len(pixels), 5)])
    one = np.concatenate([packed(pixels[i:i + 1]).numpy() for i in range(9)])  # bit planes
    np.testing.assert_array_equal(small, large)
    np.testing.assert_array_equal(one, large[:9])
    xla = load_packed(path, native=False)  # the same batches without native kernels
    np.testing.assert_array_equal(xla(pixels).numpy(), large)
    np.testing.assert_array_equal(
        np.concatenate([xla(pixels[i:i + 5]).numpy() for i in range(0, len(pixels), 5)]), large)
    np.testing.assert_array_equal(xla(pixels[:1]).numpy(), large[:1])
    monkeypatch.setattr(dispatch, "int8_matmul_available",
                        lambda: False)  # TensorFlow without oneDNN
    np.testing.assert_array_equal(load_packed(path)(pixels).numpy(), large)


def test_int8_and_bit_plane_products_are_exact(encoded):
    from bnn.native.dispatch import int8_matmul_available
    _, path, _, pixels, _ = encoded
    stage = load_packed(path).stages[0]
    u = pixels.reshape(len(pixels), -1)
    expected = u.astype(np.int64) @ stage.kernel_int8.astype(np.int64)
    extreme = np.array([np.full(784, 255), np.zeros(784)], np.uint8)  # largest magnitudes, zero
    np.testing.assert_array_equal(stage.bitplane_product(tf.constant(u[:1])).numpy(),
                                  expected[:1])
    np.testing.assert_array_equal(stage.bitplane_product(tf.constant(extreme[:1])).numpy()[0],
                                  255 * stage.kernel_int8.sum(0))
    if int8_matmul_available():
        np.testing.assert_array_equal(stage.integer_product(tf.constant(u)).numpy(), expected)
        np.testing.assert_array_equal(stage.integer_product(tf.constant(extreme)).numpy()[0],
                                      255 * stage.kernel_int8.sum(0))


def test_integer_thresholds_match_the_float_decision_at_every_product(encoded):
    model, path, _, _, _ = encoded
    from bnn.ops.bitpack import unpack_bits
    from bnn.packed.fold import pixel_thresholds
    layer, bn = model.layers[1], model.layers[2]
    kernel = layer.binary_kernel().numpy()
    arrays = pixel_thresholds(bn, None, kernel, {"scale": MNIST_ENCODING[0],
                                                          "offset": -1.0})
    z = np.arange(-255 * 784, 255 * 784 + 1, 97)[:, None]
    pre = (MNIST_ENCODING[0] * z - kernel.sum(0)).astype(np.float32)
    expected = bn(tf.constant(pre), training=False).numpy() >= 0
    flip = unpack_bits(arrays["flip"], kernel.shape[1]) > 0
    np.testing.assert_array_equal((z >= arrays["threshold"]) ^ flip, expected)


def test_off_grid_inputs_of_an_encoded_model_raise(encoded):
    _, path, _, _, x = encoded
    with pytest.raises(ValueError, match="not pixels u in \\[0, 255\\]"):
        load_packed(path).predict(x + 0.001)


@pytest.mark.parametrize("build, encoding, message", [
    (lambda: _small("vgg"), MNIST_ENCODING, "is not a BinaryDense with real inputs"),
    (lambda: _small("vgg_real_first"), MNIST_ENCODING, "has a real-valued kernel"),
    (lambda: _small("mlp"), (0.0, 1.0), "scale 0.0 must be positive"),
    (lambda: _small("mlp"), "mnist", "is not a \\(scale, offset\\) pair"),
])
def test_bad_input_encodings_raise_export_error(tmp_path, build, encoding, message):
    with pytest.raises(ExportError, match=message):
        export_model(build(), tmp_path / "x.bnn", input_encoding=encoding)


@pytest.mark.parametrize("version", [1, 2])
def test_older_version_files_still_load(tmp_path, version):
    """Files without the later versions' features are laid out as version 1 and 2 wrote them."""
    import hashlib
    model = _small("mlp")
    export_model(model, tmp_path / "new.bnn")
    data = bytearray((tmp_path / "new.bnn").read_bytes()[:-32])
    struct.pack_into("<I", data, 8, version)
    old = tmp_path / f"v{version}.bnn"
    old.write_bytes(bytes(data) + hashlib.sha256(bytes(data)).digest())
    x = np.random.default_rng(5).uniform(-1, 1, (4, 28, 28, 1)).astype(np.float32)
    np.testing.assert_allclose(load_packed(old).predict(x), model(x, training=False).numpy(),
                               rtol=1e-5, atol=1e-4)
