"""`training.distribute: mirrored` on 2 logical CPU devices matches a single-device run."""

import json
import os
from pathlib import Path

import pytest
import tensorflow as tf
import yaml

from bnn.cli import main

ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = Path(os.environ.get("BNN_DATA_DIR", ROOT.parent / "shared" / "datasets"))

CONFIG = {
    "name": "dist",
    "dataset": {"name": "mnist", "limit_train": 400, "limit_test": 200},
    "model": {"name": "binarynet_mlp", "options": {"hidden_units": [64, 64]}},
    "optimizer": {"name": "adam", "learning_rate": 0.003},
    "training": {"epochs": 1, "batch_size": 50, "seed": 11, "deterministic": True,
                 "xla": False},
}


@pytest.mark.skipif(not (DATA_DIR / "mnist.npz").exists(), reason="needs mnist.npz")
def test_mirrored_training_on_two_cpus_matches_single_device(tmp_path):
    if len(tf.config.list_logical_devices("CPU")) < 2:
        pytest.skip("needs 2 logical CPU devices, configured in conftest before TF starts")
    results = {}
    for distribute in ("none", "mirrored"):
        config = {**CONFIG, "training": {**CONFIG["training"], "distribute": distribute}}
        path = tmp_path / f"{distribute}.yaml"
        path.write_text(yaml.safe_dump(config))
        run_dir = tmp_path / distribute
        assert main(["train", str(path), "--output-dir", str(run_dir), "--quiet",
                     "--data-dir", str(DATA_DIR)]) == 0
        results[distribute] = json.loads((run_dir / "report.json").read_text())["binary"]
    single, mirrored = results["none"], results["mirrored"]
    assert mirrored["test_accuracy"] > 0.3
    assert mirrored["test_loss"] == pytest.approx(single["test_loss"], rel=0.05)
    assert mirrored["test_accuracy"] == pytest.approx(single["test_accuracy"], abs=0.05)
