"""`training.distribute: multi_worker`: two `bnn train` worker processes on loopback ports train
one model with Keras fit; only the chief writes the shared run directory."""

import json
import os
import socket
import subprocess
import sys

import pytest
import yaml

from bnn.train.config import load_config
from bnn.train.runtime import TrainingError, _is_chief_task, worker_run_dir
from support import DATA_DIR


CONFIG = {
    "name": "mw",
    "dataset": {"name": "mnist", "limit_train": 200, "limit_test": 200, "augment": False},
    "model": {"name": "binarynet_mlp", "options": {"hidden_units": [32, 32]}},
    "optimizer": {"name": "adam", "learning_rate": 0.01},
    "training": {"epochs": 2, "batch_size": 20, "seed": 5, "distribute": "multi_worker",
                 "xla": False},
}


def tf_config(ports: list[int], index: int, kind: str = "worker") -> str:
    return json.dumps({"cluster": {"worker": [f"localhost:{p}" for p in ports]},
                       "task": {"type": kind, "index": index}})


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "mw.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    return path


def test_chief_is_the_chief_task_else_worker_zero():
    workers = {"worker": ["localhost:1", "localhost:2"]}
    assert _is_chief_task(workers, "worker", 0)
    assert not _is_chief_task(workers, "worker", 1)
    with_chief = {"chief": ["localhost:3"], **workers}
    assert _is_chief_task(with_chief, "chief", 0)
    assert not _is_chief_task(with_chief, "worker", 0)
    assert _is_chief_task({}, None, 0)


@pytest.mark.parametrize("value", [None, "", "{not json", '{"cluster": {}}', "[1]"])
def test_missing_or_malformed_tf_config_is_a_clear_error(config_file, tmp_path, monkeypatch,
                                                         value):
    if value is None:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    else:
        monkeypatch.setenv("TF_CONFIG", value)
    with pytest.raises(TrainingError, match="TF_CONFIG .* is not JSON like"):
        with worker_run_dir(load_config(config_file), tmp_path):
            pass


@pytest.mark.skipif(not (DATA_DIR / "mnist.npz").exists(),
                    reason=f"needs mnist.npz in {DATA_DIR} (set BNN_DATA_DIR)")
def test_two_workers_train_and_only_the_chief_writes_the_run_directory(config_file, tmp_path):
    run_dir, scratch = tmp_path / "run", tmp_path / "tmp"
    scratch.mkdir()
    ports = free_ports(2)
    workers = []
    for index in range(2):
        env = {**os.environ, "TF_CONFIG": tf_config(ports, index), "TMPDIR": str(scratch),
               "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
        workers.append(subprocess.Popen(
            [sys.executable, "-m", "bnn.cli", "train", str(config_file), "--output-dir",
             str(run_dir), "--data-dir", str(DATA_DIR), "--quiet"],
            env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        outputs = [w.communicate(timeout=150)[0] for w in workers]
    finally:
        for w in workers:
            w.kill()
    for w, out in zip(workers, outputs):
        assert w.returncode == 0, out[-3000:]
    report = json.loads((run_dir / "report.json").read_text())["binary"]
    assert report["test_accuracy"] > 0.3  # chance is 0.1
    assert (run_dir / "binary" / "model.keras").is_file()
    assert [p.name for p in (run_dir / "binary" / "checkpoints").glob("epoch-*")] != []
    assert "the chief worker writes" in outputs[1]
    assert list(scratch.iterdir()) == []  # the non-chief's temporary run directory is gone
