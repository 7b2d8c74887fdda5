"""models.keras_file: a saved .keras model (e.g. converted from Larq) as a model to train."""

import keras
import numpy as np
import pytest
import yaml

import bnn
from bnn import models
from bnn.models import ModelFileError
from support import needs_mnist, run_cli


def _saved(tmp_path, last=("activation", "softmax"), name="m.keras"):
    layers = [keras.Input((6,)), bnn.BinaryDense(8, input_quantizer=None, name="d0"),
              keras.layers.BatchNormalization(name="bn"), bnn.BinaryDense(3, name="d1")]
    if last == ("activation", "softmax"):
        layers.append(keras.layers.Activation("softmax", name="probabilities"))
    elif last == ("dense", "softmax"):
        layers[-1] = bnn.BinaryDense(3, activation="softmax", name="d1")
    model = keras.Sequential(layers, name="saved")
    model.save(tmp_path / name)
    return tmp_path / name, model


def test_the_saved_model_loads_with_its_weights_and_without_its_final_softmax(tmp_path):
    path, original = _saved(tmp_path)
    model = models.build("keras_file", path=str(path), input_shape=[6], num_classes=3)
    assert [layer.name for layer in model.layers] == ["d0", "bn", "d1"]
    x = np.random.default_rng(0).normal(size=(5, 6)).astype("float32")
    logits = np.asarray(model(x, training=False))
    probabilities = np.asarray(original(x, training=False))
    np.testing.assert_allclose(np.exp(logits) / np.exp(logits).sum(-1, keepdims=True),
                               probabilities, rtol=1e-5)


def test_a_softmax_activation_on_the_last_layer_becomes_linear(tmp_path):
    path, original = _saved(tmp_path, last=("dense", "softmax"))
    model = models.keras_file(path=str(path), input_shape=(6,), num_classes=3)
    x = np.random.default_rng(1).normal(size=(4, 6)).astype("float32")
    logits = np.asarray(model(x, training=False))
    assert not np.allclose(logits.sum(-1), 1.0)
    np.testing.assert_allclose(np.exp(logits) / np.exp(logits).sum(-1, keepdims=True),
                               np.asarray(original(x, training=False)), rtol=1e-5)


def test_the_float_twin_starts_from_the_same_weights_without_quantizers(tmp_path):
    path, _ = _saved(tmp_path, last=None)
    binary = models.keras_file("binary", path=str(path), input_shape=(6,), num_classes=3)
    twin = models.keras_file("float", path=str(path), input_shape=(6,), num_classes=3,
                             synchronized_bn=True)
    assert [layer.precision for layer in twin.layers if hasattr(layer, "precision")] == [
        "float", "float"]
    assert all(layer.kernel_constraint is None for layer in twin.layers[::2])
    assert twin.layers[1].synchronized
    for a, b in zip(binary.get_weights(), twin.get_weights()):
        np.testing.assert_array_equal(a, b)
    x = np.random.default_rng(2).normal(size=(3, 6)).astype("float32")
    k0, k1 = binary.layers[0].kernel.numpy(), binary.layers[2].kernel.numpy()
    bn = twin.layers[1]
    h = x @ k0
    h = (h - bn.moving_mean.numpy()) / np.sqrt(bn.moving_variance.numpy() + bn.epsilon) * \
        bn.gamma.numpy() + bn.beta.numpy()
    np.testing.assert_allclose(np.asarray(twin(x, training=False)), h @ k1, rtol=1e-4,
                               atol=1e-5)


@pytest.mark.parametrize("options, message", [
    ({"path": ""}, "options.path is empty"),
    ({"path": "missing.keras"}, "missing.keras: no such .keras file"),
    ({"input_shape": (7,)}, r"takes inputs of shape \(6,\), the dataset has \(7,\)"),
    ({"num_classes": 10}, r"outputs \(3,\) values, the dataset has 10 classes"),
])
def test_files_that_do_not_fit_are_named_in_one_line(tmp_path, options, message):
    path, _ = _saved(tmp_path)
    arguments = {"path": str(path), "input_shape": (6,), "num_classes": 3, **options}
    with pytest.raises(ModelFileError, match=message) as error:
        models.keras_file(**arguments)
    assert "\n" not in str(error.value)


def test_a_file_keras_cannot_load_is_named(tmp_path):
    bad = tmp_path / "bad.keras"
    bad.write_bytes(b"not a zip")
    with pytest.raises(ModelFileError, match="bad.keras: cannot load the Keras model"):
        models.keras_file(path=str(bad), input_shape=(6,), num_classes=3)


@needs_mnist
def test_bnn_train_with_a_model_file_that_does_not_fit_exits_2(tmp_path, capsys):
    path, _ = _saved(tmp_path)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({
        "dataset": {"name": "mnist", "limit_train": 100, "limit_test": 100},
        "model": {"name": "keras_file", "options": {"path": str(path)}},
        "training": {"epochs": 1}}))
    assert run_cli("train", config, "--output-dir", tmp_path / "run") == 2
    err = capsys.readouterr().err
    assert err.startswith("bnn: error: ") and err.count("\n") == 1
    assert "takes inputs of shape (6,), the dataset has (28, 28, 1)" in err
