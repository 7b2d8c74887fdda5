"""`training.distribute: mirrored` on 2 logical CPU devices matches a single-device run."""

import json

import pytest
import tensorflow as tf

from support import needs_mnist, run_cli, tiny_config, write_config


@needs_mnist
def test_mirrored_training_on_two_cpus_matches_single_device(tmp_path):
    if len(tf.config.list_logical_devices("CPU")) < 2:
        pytest.skip("needs 2 logical CPU devices, configured in conftest before TF starts")
    results = {}
    for distribute in ("none", "mirrored"):
        config = tiny_config(seed=11, epochs=1, distribute=distribute)
        path = write_config(tmp_path / f"{distribute}.yaml", config)
        run_dir = tmp_path / distribute
        assert run_cli("train", path, "--output-dir", run_dir) == 0
        results[distribute] = json.loads((run_dir / "report.json").read_text())["binary"]
    single, mirrored = results["none"], results["mirrored"]
    assert mirrored["test_accuracy"] > 0.2  # chance is 0.1
    assert mirrored["test_loss"] == pytest.approx(single["test_loss"], rel=0.05)
    assert mirrored["test_accuracy"] == pytest.approx(single["test_accuracy"], abs=0.05)
