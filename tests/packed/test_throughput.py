"""Calibrated inference timing: candidate settings, calibration, interleaved passes, and the
fields bnn evaluate / predict report (their values are timings; only their sanity is checked)."""

import numpy as np
import pytest

from bnn import models
from bnn.packed import throughput
from bnn.packed.export import ExportError, evaluate, export_model, load_packed, predict


def test_candidates_cap_batches_at_the_data_and_workers_at_the_batches(monkeypatch):
    monkeypatch.setattr(throughput, "cores", lambda: 2)
    assert throughput.candidates(5000) == [throughput.Setting(b, w) for b in (64, 256, 1024)
                                           for w in (1, 2)]
    assert throughput.candidates(100) == [throughput.Setting(64, 1), throughput.Setting(64, 2),
                                          throughput.Setting(100, 1)]  # one batch: one worker
    assert throughput.candidates(100, batch_size=10) == [throughput.Setting(10, 1),
                                                         throughput.Setting(10, 2)]
    assert throughput.candidates(100, workers=3) == [throughput.Setting(64, 3),
                                                     throughput.Setting(100, 3)]
    monkeypatch.setattr(throughput, "cores", lambda: 1)
    assert {s.workers for s in throughput.candidates(5000)} == {1}


def test_runner_gives_the_models_logits_in_order_with_any_setting(tmp_path):
    model = models.build("binarynet_mlp", hidden_units=(32,), input_shape=(6,))
    export_model(model, tmp_path / "m.bnn")
    packed = load_packed(tmp_path / "m.bnn")
    x = np.random.default_rng(0).normal(size=(70, 6)).astype(np.float32)
    expected = packed.predict(x)
    for setting in (throughput.Setting(7, 1), throughput.Setting(16, 2), throughput.Setting(70, 2)):
        np.testing.assert_array_equal(throughput.runner(packed, x).run(setting), expected)
    assert set(throughput.runner(packed, x).predict) == {False}  # it picks its own kernels
    for xla in (False, True):
        keras_logits = throughput.runner(model, x).run(throughput.Setting(16, 2, xla))
        np.testing.assert_allclose(keras_logits, model(x, training=False).numpy(), rtol=1e-5,
                                   atol=1e-5)


def test_calibration_picks_a_candidate_per_model_and_measure_reports_every_pass(tmp_path):
    model = models.build("binarynet_mlp", hidden_units=(32,), input_shape=(6,))
    export_model(model, tmp_path / "m.bnn")
    x = np.random.default_rng(1).normal(size=(300, 6)).astype(np.float32)
    runners = {"packed": throughput.runner(load_packed(tmp_path / "m.bnn"), x),
               "keras": throughput.runner(model, x)}
    settings = throughput.calibrate(runners, sample=300)
    assert set(settings) == {"packed", "keras"} and not settings["packed"].xla
    assert all(throughput.Setting(s.batch_size, s.workers) in throughput.candidates(300)
               for s in settings.values())
    fixed = throughput.calibrate(runners, batch_size=50, workers=1)
    assert fixed["packed"] == throughput.Setting(50, 1)
    assert (fixed["keras"].batch_size, fixed["keras"].workers) == (50, 1)  # XLA or not: timed
    timed = throughput.measure(runners, settings, rounds=3)
    for name, figures in timed.items():
        assert len(figures["round_seconds"]) == 3 and all(t > 0 for t in figures["round_seconds"])
        assert figures["seconds"] == pytest.approx(float(np.median(figures["round_seconds"])))
        assert figures["examples"] == 300
        assert figures["examples_per_second"] == pytest.approx(300 / figures["seconds"])
        assert figures["logits"].shape == (300, 10)
        assert (figures["batch_size"], figures["workers"], figures["xla"]) == (
            settings[name].batch_size, settings[name].workers, settings[name].xla)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("throughput")
    binary = models.build("binarynet_mlp", hidden_units=(64, 64), input_shape=(28, 28, 1))
    rng = np.random.default_rng(2)
    for layer in binary.layers:  # zero means would put pixel-grid inputs on exact ties
        if hasattr(layer, "moving_mean"):
            layer.moving_mean.assign(rng.normal(0, 3, layer.moving_mean.shape))
    binary.save(tmp / "binary.keras")
    export_model(binary, tmp / "m.bnn", input_encoding=(1 / 127.5, -1.0))
    models.build("binarynet_mlp", "float", hidden_units=(64, 64),
                 input_shape=(28, 28, 1)).save(tmp / "float.keras")
    pixels = rng.integers(0, 256, (400, 28, 28, 1))
    x = (pixels / np.float32(127.5) - 1).astype(np.float32)
    return tmp, binary, x


def test_evaluate_with_compare_reports_both_models_and_the_speedup(files):
    tmp, binary, x = files
    y = binary(x, training=False).numpy().argmax(-1)
    y[:100] = (y[:100] + 1) % 10
    result = evaluate(tmp / "m.bnn", x, y, compare=tmp / "float.keras", rounds=2)
    assert result["model"] == str(tmp / "m.bnn") and result["accuracy"] == 0.75
    other = result["compare"]
    assert other["model"] == str(tmp / "float.keras") and 0 <= other["accuracy"] <= 1
    for figures in (result, other):
        assert figures["examples"] == 400 and figures["seconds"] > 0
        assert figures["examples_per_second"] == pytest.approx(400 / figures["seconds"])
        assert throughput.Setting(figures["batch_size"], figures["workers"]) in \
            throughput.candidates(400)
        assert "logits" not in figures and isinstance(figures["xla"], bool)
    assert result["xla"] is False  # a packed model picks its own kernels
    assert result["speedup"] > 0 and np.isfinite(result["speedup"])


def test_predict_returns_the_logits_of_the_model_file(files):
    tmp, binary, x = files
    result = predict(tmp / "m.bnn", x, batch_size=64, workers=2)
    assert (result["batch_size"], result["workers"]) == (64, 2)
    np.testing.assert_array_equal(result["logits"], load_packed(tmp / "m.bnn").predict(x))
    assert "compare" not in result and "speedup" not in result


def test_comparing_models_of_another_input_shape_is_a_one_line_export_error(files, tmp_path):
    tmp, _, x = files
    models.build("binarynet_mlp", "float", hidden_units=(8,), input_shape=(6,)).save(
        tmp_path / "other.keras")
    with pytest.raises(ExportError, match=r"other.keras: takes inputs of shape \(6,\)") as error:
        evaluate(tmp / "m.bnn", x, np.zeros(len(x)), compare=tmp_path / "other.keras")
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("times, chosen", [
    ({(256, 2): 1.00, (1024, 1): 1.03, (1024, 2): 1.20}, (1024, 1)),  # within the tie: larger
    ({(256, 2): 1.00, (1024, 1): 1.10, (1024, 2): 1.20}, (256, 2)),   # clearly faster
    ({(256, 1): 1.02, (256, 2): 1.00, (1024, 2): 1.50}, (256, 2)),    # tie: more workers
], ids=["larger batches in a tie", "the clearly fastest", "more workers in a tie"])
def test_calibration_keeps_the_same_setting_when_options_are_within_noise(monkeypatch, times,
                                                                          chosen):
    runner = throughput.Runner({False: lambda batch: batch}, np.zeros((4096, 1), np.float32))
    options = [throughput.Setting(b, w) for b, w in times]
    monkeypatch.setattr(throughput, "_timed", lambda run, setting, count: (
        times[setting.batch_size, setting.workers] * count, None))
    best = throughput._fastest({"m": runner}, {"m": options}, sample=4096, rounds=3)
    assert (best["m"].batch_size, best["m"].workers) == chosen
