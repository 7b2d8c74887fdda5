"""Shared by the end-to-end tests: where the datasets are, a tiny experiment, the CLI, the
benchmark scripts."""

import importlib.util
import os
from pathlib import Path

import pytest
import yaml

from bnn.cli import main

ROOT = Path(__file__).resolve().parents[1]
# absolute, so that it means the same in subprocesses started in other folders
DATA_DIR = Path(os.path.abspath(os.environ.get("BNN_DATA_DIR",
                                               ROOT.parent / "shared" / "datasets")))
needs_mnist = pytest.mark.skipif(not (DATA_DIR / "mnist.npz").exists(),
                                 reason=f"needs mnist.npz in {DATA_DIR} (set BNN_DATA_DIR)")


def tiny_config(seed: int = 3, epochs: int = 2, limit_train: int = 400, **training) -> dict:
    """A BinaryNet MLP 64-64 on a few hundred MNIST images: seconds per epoch."""
    return {
        "name": "tiny",
        "dataset": {"name": "mnist", "limit_train": limit_train, "limit_test": 200},
        "model": {"name": "binarynet_mlp", "options": {"hidden_units": [64, 64]}},
        "optimizer": {"name": "adam", "learning_rate": 0.01},
        "training": {"epochs": epochs, "batch_size": 50, "seed": seed, "deterministic": True,
                     "xla": False, **training},
    }


def write_config(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config))
    return path


def run_cli(*args) -> int:
    """``bnn ARGS --data-dir DATA_DIR --quiet``; returns the exit code."""
    return main([str(a) for a in args] + ["--data-dir", str(DATA_DIR), "--quiet"])


def load_benchmark(name: str):
    """``benchmarks/<name>.py`` imported as a module (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(f"{name}_benchmark",
                                                  ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
