"""Crash safety and user mistakes at the command line: signals, SIGKILL, locks, damaged
checkpoints, and a table of bad experiment files."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bnn.train import callbacks
from bnn.cli import main
from bnn.errors import RunDirError
from bnn.files import atomic_write
from bnn.train.rundir import Checkpoints, RunLock
from support import DATA_DIR, needs_mnist, run_cli, run_events, tiny_config, write_config

TINY = tiny_config(seed=5)


def binary_report(run_dir: Path) -> dict:
    return json.loads((run_dir / "report.json").read_text())["binary"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("uninterrupted")
    config = write_config(tmp / "tiny.yaml", TINY)
    assert run_cli("train", config, "--output-dir", tmp / "run") == 0
    return binary_report(tmp / "run")


@needs_mnist
def test_sigterm_mid_epoch_saves_and_resume_ends_like_an_uninterrupted_run(
        tmp_path, monkeypatch, capsys, uninterrupted):
    original = callbacks.SignalStop.on_train_batch_end

    def signal_at_epoch_2_batch_3(self, batch, logs=None):
        original(self, batch, logs)
        if self.epoch == 1 and batch == 2 and self.received is None:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(callbacks.SignalStop, "on_train_batch_end", signal_at_epoch_2_batch_3)
    config = write_config(tmp_path / "tiny.yaml", TINY)
    run_dir = tmp_path / "run"
    assert run_cli("train", config, "--output-dir", run_dir) == 130
    assert "continue with --resume" in capsys.readouterr().err
    state = json.loads((run_dir / "binary/checkpoints/interrupted.json").read_text())
    assert (state["epoch"], state["batches_done"]) == (1, 3)
    assert not (run_dir / "report.json").exists()

    monkeypatch.setattr(callbacks.SignalStop, "on_train_batch_end", original)
    assert run_cli("train", config, "--output-dir", run_dir, "--resume") == 0
    resumed = binary_report(run_dir)
    assert resumed["test_loss"] == pytest.approx(uninterrupted["test_loss"], rel=1e-5)
    assert resumed["test_accuracy"] == pytest.approx(uninterrupted["test_accuracy"], abs=1e-6)
    assert not (run_dir / "binary/checkpoints/interrupted.keras").exists()
    # TensorBoard has each epoch once, the one cut short only when it was finished
    steps = [step for step, _ in run_events(run_dir / "binary")["accuracy/train"]]
    assert steps == list(range(1, TINY["training"]["epochs"] + 1))


@needs_mnist
def test_sigkill_then_resume_ends_like_an_uninterrupted_run(tmp_path):
    config = {**TINY, "dataset": {**TINY["dataset"], "limit_train": 2000},
              "training": {**TINY["training"], "epochs": 4}}
    path = write_config(tmp_path / "kill.yaml", config)
    env = {**os.environ, "BNN_DATA_DIR": str(DATA_DIR)}
    command = [sys.executable, "-m", "bnn.cli", "train", str(path), "--quiet"]
    killed_dir = tmp_path / "killed"
    process = subprocess.Popen(command + ["--output-dir", str(killed_dir)], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = killed_dir / "binary/checkpoints/state-0001.json"
    deadline = time.time() + 240
    while not state.exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    process.kill()
    process.wait()
    assert state.exists() and not (killed_dir / "report.json").exists(), \
        "the run must be killed after its first checkpoint and before it finished"
    assert (killed_dir / ".lock").exists()  # left behind by the killed process: stale

    assert run_cli("train", path, "--output-dir", killed_dir, "--resume") == 0
    assert run_cli("train", path, "--output-dir", tmp_path / "straight") == 0
    resumed, straight = binary_report(killed_dir), binary_report(tmp_path / "straight")
    assert resumed["test_loss"] == pytest.approx(straight["test_loss"], rel=1e-5)
    assert resumed["test_accuracy"] == pytest.approx(straight["test_accuracy"], abs=1e-6)


@needs_mnist
def test_damaged_checkpoint_is_a_clear_error_on_resume(tmp_path, capsys):
    config = write_config(tmp_path / "tiny.yaml", {**TINY, "training": {**TINY["training"],
                                                                         "epochs": 1}})
    run_dir = tmp_path / "run"
    assert run_cli("train", config, "--output-dir", run_dir) == 0
    checkpoint = run_dir / "binary/checkpoints/epoch-0001.keras"
    checkpoint.write_bytes(checkpoint.read_bytes()[:100])
    assert run_cli("train", config, "--output-dir", run_dir, "--resume",
                   "--set", "training.epochs=2") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "epoch-0001.keras cannot be read" in err[0] and "delete it" in err[0]


def test_lock_refuses_a_second_live_writer_and_takes_over_a_stale_one(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / ".lock").write_text(str(sleeper.pid))
        with pytest.raises(RunDirError, match=f"another bnn process \\(pid {sleeper.pid}\\)"):
            RunLock(tmp_path).acquire()
    finally:
        sleeper.kill()
        sleeper.wait()
    with RunLock(tmp_path) as lock:  # the pid is dead now: stale
        assert lock.path.read_text() == str(os.getpid())
    assert not (tmp_path / ".lock").exists()


def test_atomic_write_leaves_old_file_when_writing_fails(tmp_path, monkeypatch):
    target = tmp_path / "report.json"
    atomic_write(target, "old")

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        atomic_write(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_checkpoints_keep_only_the_last_n(tmp_path):
    class Model:
        def save(self, path):
            Path(path).write_bytes(b"model")

    ckpts = Checkpoints(tmp_path, keep=2)
    for epoch in range(1, 5):
        ckpts.save(Model(), epoch, {"history": []})
    assert ckpts.epochs() == [3, 4]
    assert ckpts.latest()[0] == 4
    (tmp_path / "state-0004.json").write_text("{not json")
    with pytest.raises(RunDirError, match="state-0004.json is damaged"):
        ckpts.latest()


BAD_CONFIGS = {
    "unknown top-level key": ("epochs: 3\n", "epochs"),
    "unknown nested key": ("training: {epoch: 3}\n", "training.epoch"),
    "string for int": ("training: {epochs: three}\n", "training.epochs"),
    "bool for int": ("training: {batch_size: true}\n", "training.batch_size"),
    "zero epochs": ("training: {epochs: 0}\n", "training.epochs"),
    "negative epochs": ("training: {epochs: -2}\n", "training.epochs"),
    "zero batch size": ("training: {batch_size: 0}\n", "training.batch_size"),
    "negative batch size": ("training: {batch_size: -100}\n", "training.batch_size"),
    "zero learning rate": ("optimizer: {learning_rate: 0}\n", "optimizer.learning_rate"),
    "negative seed": ("training: {seed: -1}\n", "training.seed"),
    "unknown dataset": ("dataset: {name: imagenet}\n", "dataset.name"),
    "unknown model": ("model: {name: resnet50}\n", "model.name"),
    "unknown model option": ("model: {options: {width: 3}}\n", "model.options.width"),
    "unknown optimizer": ("optimizer: {name: lamb}\n", "optimizer.name"),
    "unknown loss": ("training: {loss: hinge}\n", "training.loss"),
    "unknown quantizer": ("model: {options: {kernel_quantizer: ste_sgn}}\n",
                          "model.options.kernel_quantizer"),
    "unknown schedule": ("schedule: {name: step}\n", "schedule.name"),
    "unknown device": ("training: {device: tpu}\n", "training.device"),
    "unknown precision": ("model: {precision: half}\n", "model.precision"),
    "validation split 1": ("dataset: {validation_split: 1.0}\n", "dataset.validation_split"),
    "label smoothing 1": ("training: {label_smoothing: 1}\n", "training.label_smoothing"),
    "keep zero checkpoints": ("training: {checkpoints_keep: 0}\n", "training.checkpoints_keep"),
    "section not a mapping": ("training: 5\n", "training"),
    "list for float": ("optimizer: {learning_rate: [1, 2]}\n", "optimizer.learning_rate"),
    "yaml syntax error": ("training: {epochs: 3\n", "line"),
    "empty file": ("", "empty"),
    "top level a list": ("- 1\n- 2\n", "mapping"),
    "negative hidden units": ("model: {options: {hidden_units: [-1]}}\n",
                              "model.options.hidden_units"),
    "unknown distribute": ("training: {distribute: horovod}\n", "training.distribute"),
}


@pytest.mark.parametrize("text, needle", BAD_CONFIGS.values(), ids=BAD_CONFIGS.keys())
def test_bad_config_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys, text, needle):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    run_dir = tmp_path / "run"
    assert main(["compare", str(path), "--output-dir", str(run_dir)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bnn: error: "), captured.err
    assert needle in lines[0] and "Traceback" not in captured.err
    assert not run_dir.exists()


@pytest.mark.parametrize("argv, needle", [
    (["compare", "missing.yaml"], "missing.yaml"),
    (["train", "."], "directory"),
    (["compare", "{config}", "--set", "training.epochs"], "training.epochs"),
    (["compare", "{config}", "--set", "training.nope=1"], "training.nope"),
], ids=["missing file", "directory", "override without value", "override of unknown key"])
def test_bad_command_line_exits_2_with_one_line(tmp_path, capsys, argv, needle):
    config = write_config(tmp_path / "ok.yaml", TINY)
    argv = [a.replace("{config}", str(config)) for a in argv]
    assert main(argv + ["--output-dir", str(tmp_path / "run")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], lines
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("variable, value", [("BNN_CONV_GRADIENTS", "fast"),
                                             ("BNN_PACKED_FORWARD", "flase")])
def test_bad_kernel_setting_in_the_environment_exits_2_with_one_line(tmp_path, capsys,
                                                                     monkeypatch, variable,
                                                                     value):
    monkeypatch.setenv(variable, value)
    config = write_config(tmp_path / "ok.yaml", TINY)
    assert main(["compare", str(config), "--output-dir", str(tmp_path / "run")]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"bnn: error: {variable} must be "), lines
    assert repr(value) in lines[0] and "Traceback" not in captured.err
    assert not (tmp_path / "run").exists()
