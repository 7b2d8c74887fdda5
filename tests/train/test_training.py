"""End-to-end: `bnn compare` on a few hundred MNIST images, its run directory, resume,
TensorBoard logs (read back from the files and through a real TensorBoard server: scalars and
the hparams dashboard) and report.json."""

import json
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from support import (needs_mnist, run_cli, run_events, tensorboard_server, tiny_config,
                     write_config)

pytestmark = needs_mnist
TINY = tiny_config(seed=3)


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    """One finished `bnn compare` run shared by the tests that only read it."""
    tmp = tmp_path_factory.mktemp("compare")
    config = write_config(tmp / "tiny.yaml", TINY)
    run_dir = tmp / "run"
    assert run_cli("compare", config, "--output-dir", run_dir) == 0
    return run_dir


def test_compare_writes_report_with_both_twins_and_step_ratio(compared):
    report = json.loads((compared / "report.json").read_text())
    assert set(report) >= {"binary", "float", "step_time_ratio"}
    for twin in ("binary", "float"):
        r = report[twin]
        for key in ("test_accuracy", "best_test_accuracy", "median_step_ms",
                    "examples_per_second", "params", "epochs", "wall_seconds"):
            assert key in r, key
        assert 0.0 <= r["test_accuracy"] <= r["best_test_accuracy"] <= 1.0
        assert r["epochs"] == 2 and r["median_step_ms"] > 0 and r["wall_seconds"] > 0
    assert report["binary"]["params"] == report["float"]["params"]
    ratio = report["binary"]["median_step_ms"] / report["float"]["median_step_ms"]
    assert report["step_time_ratio"] == pytest.approx(ratio)
    assert "| test accuracy (final) |" in (compared / "report.md").read_text()


def test_short_run_on_a_few_hundred_images_beats_chance(compared):
    report = json.loads((compared / "report.json").read_text())
    assert report["binary"]["test_accuracy"] > 0.3  # chance is 0.1
    assert report["float"]["test_accuracy"] > 0.3


def test_run_directory_holds_models_checkpoints_and_config(compared):
    for twin in ("binary", "float"):
        assert (compared / twin / "model.keras").is_file()
        assert sorted(p.name for p in (compared / twin / "checkpoints").glob("*.keras")) == [
            "epoch-0001.keras", "epoch-0002.keras"]
    assert yaml.safe_load((compared / "config.yaml").read_text())["name"] == "tiny"
    assert not (compared / ".lock").exists()


def test_tensorboard_has_one_run_per_twin_with_shared_tags(compared):
    history = json.loads((compared / "report.json").read_text())["history"]
    for twin in ("binary", "float"):
        events = run_events(compared / twin)
        for tag in ("accuracy/test", "accuracy/train", "loss/test", "loss/train",
                    "cost/step_time_ms", "optimizer/learning_rate"):
            assert [step for step, _ in events[tag]] == [1, 2], (twin, tag)
        tests = [value for _, value in events["accuracy/test"]]
        assert tests == pytest.approx([h["test_accuracy"] for h in history[twin]])
        assert not [tag for tag in events if tag.startswith("epoch_")]
        assert not [p for p in (compared / twin).iterdir() if p.name in ("train", "validation")]
        assert "custom_scalars__config__" in events and "_hparams_/session_start_info" in events
    binary, float_ = run_events(compared / "binary"), run_events(compared / "float")
    assert {"flips/all", "flips/dense0", "flips/dense1", "flips/dense_out"} <= set(binary)
    # histograms: the binary layers' latent kernels and their flips, nothing of batch norm
    histograms = sorted(tag for tag in binary if tag.startswith("weights/"))
    assert histograms == [f"weights/{layer}/kernel{suffix}" for layer in
                          ("dense0", "dense1", "dense_out") for suffix in ("", "_flips")]
    assert not [tag for tag in float_ if tag.startswith("weights/") or tag.startswith("flips/")]
    step, flips = binary["weights/dense0/kernel_flips"][-1]
    assert step == 2 and flips.ndim == 2 and flips.shape[1] == 3  # histogram buckets


def _post(url: str, body: dict):
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def test_real_tensorboard_server_serves_both_twins_and_their_hparams(compared):
    report = json.loads((compared / "report.json").read_text())
    with tensorboard_server(compared) as url:
        base = f"{url}/data/plugin/scalars"
        deadline, tags = time.time() + 90, {}
        while time.time() < deadline:
            with urllib.request.urlopen(f"{base}/tags", timeout=5) as response:
                tags = json.load(response)
            if {"binary", "float"} <= set(tags):
                break
            time.sleep(1)
        assert set(tags) == {"binary", "float"}, tags
        for run in ("binary", "float"):
            query = f"{base}/scalars?run={run}&tag=accuracy%2Ftrain"
            with urllib.request.urlopen(query, timeout=10) as response:
                points = json.load(response)
            assert [p[1] for p in points] == [1, 2]
            assert all(0.0 <= p[2] <= 1.0 for p in points)

        hparams = f"{url}/data/plugin/hparams"
        experiment = _post(f"{hparams}/experiment", {"experimentName": ""})
        columns = {info["name"] for info in experiment["hparamInfos"]}
        assert {"model.precision", "model.name", "optimizer.learning_rate",
                "model.options.hidden_units", "training.xla"} <= columns, columns
        groups = _post(f"{hparams}/session_groups", {
            "experimentName": "", "startIndex": 0, "sliceSize": 10,
            "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE",
                                "STATUS_RUNNING"]})["sessionGroups"]
        assert sorted(g["name"] for g in groups) == ["tiny/binary", "tiny/float"]
        for group in groups:
            twin = group["hparams"]["model.precision"]
            assert group["name"] == f"tiny/{twin}"
            metrics = {m["name"]["tag"]: m["value"] for m in group["sessions"][0]["metricValues"]}
            assert metrics["accuracy/test"] == pytest.approx(report[twin]["test_accuracy"])
            assert metrics["cost/step_time_ms"] > 0


def test_resume_continues_from_saved_epoch_and_matches_uninterrupted(tmp_path, compared):
    config = write_config(tmp_path / "tiny.yaml", TINY)
    run_dir = tmp_path / "run"
    assert run_cli("train", config, "--output-dir", run_dir, "--set", "training.epochs=1") == 0
    first = json.loads((run_dir / "report.json").read_text())["binary"]
    assert first["epochs"] == 1
    assert run_cli("train", config, "--output-dir", run_dir, "--resume") == 0
    resumed = json.loads((run_dir / "report.json").read_text())["binary"]
    state = json.loads((run_dir / "binary" / "checkpoints" / "state-0002.json").read_text())
    assert resumed["epochs"] == 2 and len(state["history"]) == 2
    uninterrupted = json.loads((compared / "report.json").read_text())["binary"]
    assert resumed["test_accuracy"] == pytest.approx(uninterrupted["test_accuracy"], abs=1e-6)
    assert resumed["test_loss"] == pytest.approx(uninterrupted["test_loss"], rel=1e-5)


def test_finished_run_is_not_overwritten_without_flag(tmp_path, compared, capsys):
    config = write_config(tmp_path / "tiny.yaml", TINY)
    before = (compared / "report.json").read_bytes()
    assert run_cli("compare", config, "--output-dir", compared) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "already holds a finished run; pass --overwrite" in err[0]
    assert (compared / "report.json").read_bytes() == before


def test_bad_config_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys):
    config = write_config(tmp_path / "bad.yaml", {**TINY, "training": {"epochs": 0}})
    run_dir = tmp_path / "never"
    assert run_cli("compare", config, "--output-dir", run_dir) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "training.epochs" in err[0]
    assert not run_dir.exists()


def test_nan_loss_stops_with_epoch_and_step_and_keeps_last_checkpoint(tmp_path, capsys):
    bad = {**TINY, "optimizer": {"name": "sgd", "learning_rate": 1e30, "momentum": 0.0},
           "model": {"name": "binarynet_mlp",
                     "options": {"hidden_units": [16], "kernel_quantizer": None}},
           "training": {**TINY["training"], "epochs": 3}}
    config = write_config(tmp_path / "nan.yaml", bad)
    assert run_cli("train", config, "--output-dir", tmp_path / "run", "--precision", "float") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the loss became" in err[0] and "at epoch" in err[0], err
    assert "Lower optimizer.learning_rate" in err[0]


def test_bop_from_yaml_trains_and_flips_binary_weights(tmp_path):
    config = tiny_config(seed=3, epochs=1)
    config["optimizer"] = {"name": "bop", "threshold": 1e-6, "gamma": 1e-3, "learning_rate": 0.01}
    path = write_config(tmp_path / "bop.yaml", config)
    assert run_cli("train", path, "--output-dir", tmp_path / "run") == 0
    state = json.loads((tmp_path / "run/binary/checkpoints/state-0001.json").read_text())
    assert 0.0 < state["history"][0]["flip_ratio"] < 1.0
    report = json.loads((tmp_path / "run/report.json").read_text())["binary"]
    assert report["test_accuracy"] > 0.1


def test_each_twin_reports_whether_xla_compiled_its_step_and_why(compared):
    report = json.loads((compared / "report.json").read_text())
    for twin in ("binary", "float"):
        assert report[twin]["xla"] is False
        assert report[twin]["xla_reason"] == "training.xla in the experiment"
    assert "| train step compiled by XLA | no | no |" in (compared / "report.md").read_text()


def test_xla_auto_times_both_ways_and_takes_the_faster_one(tmp_path):
    """``training.xla: auto`` (the default): each twin's step is timed with and without XLA on
    the run's own data, the faster is used, and the report says so with both figures; a resumed
    run keeps the choice."""
    config = write_config(tmp_path / "auto.yaml",
                          tiny_config(epochs=1, deterministic=False, xla="auto"))
    run_dir = tmp_path / "run"
    assert run_cli("compare", config, "--output-dir", run_dir) == 0
    report = json.loads((run_dir / "report.json").read_text())
    for twin in ("binary", "float"):
        reason = report[twin]["xla_reason"]
        assert reason.startswith("timed: ") and " ms per step without XLA, " in reason
        without, with_ = (float(part.split(" ms")[0].split()[-1])
                          for part in reason.split(", "))
        assert report[twin]["xla"] is (with_ < without)
    assert "XLA: binary: " in (run_dir / "report.md").read_text()
    state = json.loads((run_dir / "binary" / "checkpoints" / "state-0001.json").read_text())
    assert (state["xla"], state["xla_reason"]) == (report["binary"]["xla"],
                                                   report["binary"]["xla_reason"])


def test_xla_auto_under_op_determinism_trains_without_xla(tmp_path):
    config = write_config(tmp_path / "det.yaml", tiny_config(epochs=1, xla="auto"))
    run_dir = tmp_path / "run"
    assert run_cli("train", config, "--output-dir", run_dir, "--precision", "binary") == 0
    report = json.loads((run_dir / "report.json").read_text())
    assert report["binary"]["xla"] is False
    assert report["binary"]["xla_reason"].startswith("training.deterministic")
