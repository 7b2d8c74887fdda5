"""bnn.larq against Larq itself: models saved by Larq 0.14 convert with identical outputs, and
Larq's quantizers and Bop give the values bnn.larq gives.

``tests/larq_reference.py`` runs once per session in Larq's own environment (Larq needs
tf-keras, which must not share a process with bnn): ``BNN_LARQ_PYTHON``, else
``larq-env/bin/python`` beside the repository. Without it these tests skip, saying so. The error
cases at the end need no Larq: they write tf-keras-style files with h5py.
"""

import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import h5py
import keras
import numpy as np
import pytest
import yaml

import bnn.larq as lq
from bnn import layers as bl
from bnn.packed import export
from bnn.larq import conversion
from bnn.cli import main
from support import larq_python, larq_script_output, needs_mnist, run_cli

MODELS = ("binarynet_mlp", "vgg_style", "scaled_quantizers")
FORMATS = (".h5", ".keras", "_savedmodel")


@pytest.fixture(scope="module")
def larq_reference(request):
    """Runs tests/larq_reference.py in Larq's environment; returns (out dir, arrays, manifest).

    The output is kept in pytest's cache, keyed by the script and the Larq python, so later
    sessions reuse it (``pytest --cache-clear`` rebuilds it)."""
    out = larq_script_output(request, "larq_reference.py", "manifest.json")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["larq"] == "0.14.0", manifest
    return out, np.load(out / "reference.npz"), manifest


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", MODELS)
def test_a_model_saved_by_larq_converts_with_the_same_outputs(larq_reference, name, fmt):
    out, reference, _ = larq_reference
    model = lq.convert(out / f"{name}{fmt}")
    x, expected = reference[f"model/{name}/x"], reference[f"model/{name}/y"]
    outputs = np.asarray(model(x, training=False))
    assert outputs.shape == expected.shape
    assert np.abs(outputs - expected).max() <= 1e-5
    assert np.std(expected) > 0.01  # the outputs are not a constant that any model would match
    binary = [layer for layer in model.layers if getattr(layer, "binary_kernels", None)]
    assert binary and all(layer.binary_kernels() for layer in binary
                          if layer.name not in ("dense_in",))


def test_conversion_maps_larq_layers_to_bnn_classes(larq_reference):
    out, _, _ = larq_reference
    model = lq.convert(out / "scaled_quantizers.h5")
    by_name = {layer.name: layer for layer in model.layers}
    assert type(by_name["conv_scaled"]) is bl.BinaryConv2D
    assert type(by_name["depthwise_tern"]) is bl.BinaryDepthwiseConv2D
    assert type(by_name["separable"]) is bl.BinarySeparableConv2D
    assert type(by_name["dense_dorefa"]) is bl.BinaryDense
    assert by_name["conv_scaled"].pad_values == -1.0
    assert by_name["conv_scaled"].kernel_constraint.clip_value == 1.3
    assert by_name["separable"].get_config()["depthwise_quantizer"]["config"] == {
        "k_bit": 3, "mode": "weights"}
    assert by_name["bn_frozen"].trainable is False


def _bop_model(kernel_quantizer: str) -> keras.Model:
    """The model of larq_reference.bop_model, built with bnn.larq."""
    quantizer = lq.quantizers.NoOp(precision=1) if kernel_quantizer == "noop" else "ste_sign"
    constraint = None if kernel_quantizer == "noop" else "weight_clip"
    return keras.Sequential([
        keras.Input((6,)),
        lq.layers.QuantDense(8, kernel_quantizer=quantizer, kernel_constraint=constraint,
                             use_bias=False, name="binary_0"),
        keras.layers.BatchNormalization(name="bn"),
        lq.layers.QuantDense(3, input_quantizer="ste_sign", kernel_quantizer=quantizer,
                             kernel_constraint=constraint, name="binary_1"),
    ])


@pytest.mark.parametrize("case", ["noop_constant", "ste_sign_schedule"])
def test_bop_training_gives_larqs_weights(larq_reference, case):
    _, reference, manifest = larq_reference
    spec = manifest["bop"][case]
    model = _bop_model(spec["kernel_quantizer"])
    count = len(model.get_weights())
    initial = [reference[f"bop/{case}/initial/{i}"] for i in range(count)]
    model.set_weights(initial)
    if spec["bop"] == "schedule":
        def schedule():
            return keras.optimizers.schedules.InverseTimeDecay(1e-3, decay_steps=1.0,
                                                               decay_rate=0.5)
        bop = lq.optimizers.Bop(threshold=schedule(), gamma=schedule())
    else:
        bop = lq.optimizers.Bop(**spec["bop"])
    model.compile(optimizer=lq.optimizers.CaseOptimizer(
        (lq.optimizers.Bop.is_binary_variable, bop),
        default_optimizer=keras.optimizers.SGD(0.1)), loss="mse")
    model.fit(reference["bop/x"], reference["bop/y"], batch_size=8, epochs=2, shuffle=False,
              verbose=0)
    final = model.get_weights()
    for i, (got, want) in enumerate(zip(final, (reference[f"bop/{case}/final/{i}"]
                                                for i in range(count)))):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"weight {i}")
    for kernel, start in ((final[0], initial[0]), (final[5], initial[5])):
        assert set(np.unique(kernel)) <= {-1.0, 1.0}
        assert (np.sign(kernel) != np.sign(start)).any()  # Bop flipped some weights


def test_a_converted_model_loads_in_a_process_that_only_imports_bnn(larq_reference, tmp_path):
    out, reference, _ = larq_reference
    converted = tmp_path / "scaled.keras"
    conversion.convert_file(out / "scaled_quantizers.keras", converted)
    x = tmp_path / "x.npy"
    np.save(x, reference["model/scaled_quantizers/x"])
    script = textwrap.dedent(f"""
        import sys, numpy as np
        import bnn, keras
        model = keras.saving.load_model({str(converted)!r})
        np.save({str(tmp_path / 'y.npy')!r}, np.asarray(model(np.load({str(x)!r}),
                                                                 training=False)))
        print(sorted(m for m in sys.modules if m.startswith("bnn.larq")))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"  # bnn.larq was not needed
    y = np.load(tmp_path / "y.npy")
    assert np.abs(y - reference["model/scaled_quantizers/y"]).max() <= 1e-5


def test_bnn_import_larq_writes_the_model_and_lists_its_layers(larq_reference, tmp_path,
                                                               capsys):
    out, reference, _ = larq_reference
    target = tmp_path / "vgg.keras"
    assert main(["import-larq", str(out / "vgg_style_savedmodel"), "-o", str(target)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["format"] == "savedmodel" and info["output"] == str(target)
    assert {"name": "quant_conv2d", "larq": "QuantConv2D", "bnn": "BinaryConv2D"} in info[
        "layers"]
    model = keras.saving.load_model(target)
    y = np.asarray(model(reference["model/vgg_style/x"], training=False))
    assert np.abs(y - reference["model/vgg_style/y"]).max() <= 1e-5
    assert info["params"] == model.count_params()


@needs_mnist
def test_a_converted_model_trains_with_bnn_train_and_exports(larq_reference, tmp_path,
                                                             capsys):
    out, _, _ = larq_reference
    converted = tmp_path / "tutorial.keras"
    assert main(["import-larq", str(out / "mnist_tutorial.h5"), "-o", str(converted)]) == 0
    config = tmp_path / "larq.yaml"
    config.write_text(yaml.safe_dump({
        "name": "larq_tutorial",
        "dataset": {"name": "mnist", "limit_train": 300, "limit_test": 200, "augment": False},
        "model": {"name": "keras_file", "options": {"path": str(converted)}},
        "training": {"epochs": 1, "batch_size": 50, "xla": False, "histogram_freq": 0},
    }))
    run_dir = tmp_path / "run"
    assert run_cli("train", config, "--output-dir", run_dir) == 0
    report = json.loads((run_dir / "report.json").read_text())
    assert report["binary"]["test_accuracy"] > 0.2  # chance is 0.1; 6 steps from Larq's weights
    trained = keras.saving.load_model(run_dir / "binary" / "model.keras")
    assert not isinstance(trained.layers[-1], keras.layers.Activation)  # trained on logits
    capsys.readouterr()
    packed = tmp_path / "tutorial.bnn"
    assert main(["export", str(converted), "-o", str(packed)]) == 0
    x = np.random.default_rng(0).uniform(-1, 1, (64, 28, 28, 1)).astype("float32")
    keras_model = keras.saving.load_model(converted)
    probabilities = np.asarray(keras_model(x, training=False))
    logits = export.load_packed(packed).predict(x)
    np.testing.assert_array_equal(logits.argmax(-1), probabilities.argmax(-1))


# -- errors: one line naming the file, the layer and the fix (no Larq needed) -----------------


def _tf_keras_h5(path: Path, layers: list, weights: dict | None = None,
                 with_config: bool = True) -> Path:
    """A file laid out as tf-keras' model.save("x.h5") lays it out."""
    with h5py.File(path, "w") as f:
        if with_config:
            f.attrs["model_config"] = json.dumps(
                {"class_name": "Sequential", "config": {"name": "m", "layers": layers}})
            group = f.create_group("model_weights")
        else:
            group = f
        names = [layer["config"]["name"] for layer in layers]
        group.attrs["layer_names"] = [n.encode() for n in names]
        for name in names:
            layer_group = group.create_group(name)
            arrays = (weights or {}).get(name, {})
            layer_group.attrs["weight_names"] = [f"{name}/{k}:0".encode() for k in arrays]
            for key, value in arrays.items():
                layer_group.create_dataset(f"{name}/{key}:0", data=value)
    return path


INPUT = {"class_name": "InputLayer",
         "config": {"batch_input_shape": [None, 4], "dtype": "float32", "name": "input"}}


def _dense(name="qd", **config):
    return {"class_name": "QuantDense",
            "config": {"name": name, "units": 2, "use_bias": False, "activation": "linear",
                       "kernel_quantizer": "ste_sign", **config}}


@pytest.mark.parametrize("layers, message", [
    ([INPUT, {"class_name": "QuantConv1D", "config": {"name": "qc"}}],
     "layer 'qc' (QuantConv1D): has no bnn counterpart; bnn converts QuantDense"),
    ([INPUT, {"class_name": "MyCustomLayer", "config": {"name": "mine"}}],
     "layer 'mine' (MyCustomLayer): is not a layer bnn can convert"),
    ([INPUT, _dense(kernel_quantizer={"class_name": "MyQuantizer", "config": {}})],
     "layer 'qd' (QuantDense): kernel_quantizer 'MyQuantizer' is not one of Larq's quantizers"),
    ([INPUT, {"class_name": "Sequential", "config": {"name": "inner", "layers": []}}],
     "is a nested model"),
    ([_dense()], "saved before it knew its input shape"),
])
def test_what_cannot_be_converted_is_named_in_one_line(tmp_path, layers, message):
    path = _tf_keras_h5(tmp_path / "m.h5", layers)
    with pytest.raises(conversion.ConversionError) as error:
        lq.convert(path)
    assert message in str(error.value)
    assert str(path) in str(error.value) and "\n" not in str(error.value)


def test_weights_that_do_not_fit_the_layer_are_named(tmp_path):
    path = _tf_keras_h5(tmp_path / "m.h5", [INPUT, _dense()],
                        {"qd": {"kernel": np.ones((3, 2), "float32")}})
    with pytest.raises(conversion.ConversionError, match=r"layer 'qd': weight 'kernel' has shape "
                       r"\(3, 2\) where the layer needs \(4, 2\)"):
        lq.convert(path)


def test_a_handwritten_tf_keras_file_converts_with_its_weights(tmp_path):
    kernel = np.array([[0.5, -0.2], [-0.1, 0.3], [0.7, 0.9], [-0.4, -0.6]], "float32")
    path = _tf_keras_h5(tmp_path / "m.h5", [INPUT, _dense(input_quantizer="ste_sign")],
                        {"qd": {"kernel": kernel}})
    model = lq.convert(path)
    x = np.array([[1.0, -2.0, 0.5, -0.1]], "float32")
    np.testing.assert_array_equal(np.asarray(model(x)), np.sign(x) @ np.sign(kernel))


@pytest.mark.parametrize("make, message", [
    (lambda p: p, "no such file or directory"),
    (lambda p: (p.write_text("not a model"), p)[1], "is not an HDF5 file, a zip file or a "
                                                    "SavedModel directory"),
    (lambda p: _tf_keras_h5(p, [INPUT], with_config=False), "holds weights only"),
    (lambda p: (p.mkdir(), p)[1], "is a directory but not a SavedModel"),
])
def test_files_that_are_not_larq_models_are_refused_in_one_line(tmp_path, make, message):
    path = make(tmp_path / "model.h5")
    with pytest.raises(conversion.ConversionError, match=message):
        lq.convert(path)


@pytest.mark.parametrize("suffix", [".keras", ".h5"])
def test_a_keras_3_file_is_refused_with_how_to_load_it(tmp_path, suffix):
    path = tmp_path / f"k3{suffix}"
    keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]).save(path)
    if suffix == ".keras":
        with zipfile.ZipFile(path) as archive:
            assert "metadata.json" in archive.namelist()
    with pytest.raises(conversion.ConversionError, match="Keras 3 model.*load_model"):
        lq.convert(path)


def test_cli_import_larq_errors_are_one_line_with_exit_code_2(tmp_path, capsys):
    path = _tf_keras_h5(tmp_path / "m.h5", [INPUT, {"class_name": "QuantConv3D",
                                                     "config": {"name": "q3"}}])
    assert main(["import-larq", str(path), "-o", str(tmp_path / "out.keras")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bnn: error: ") and err.count("\n") == 1 and "q3" in err
    assert not (tmp_path / "out.keras").exists()
    assert main(["import-larq", str(path), "-o", str(tmp_path / "out.h5")]) == 2
    assert "the output must be a .keras file" in capsys.readouterr().err


def test_larq_python_lookup_names_the_variable_when_missing(monkeypatch, tmp_path):
    monkeypatch.setenv("BNN_LARQ_PYTHON", str(tmp_path / "nowhere" / "python"))
    with pytest.raises(pytest.skip.Exception, match="set BNN_LARQ_PYTHON"):
        larq_python()

