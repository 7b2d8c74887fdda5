"""Shared by the end-to-end tests: where the datasets are, a tiny experiment, the CLI, the
benchmark scripts, a TensorBoard server, Larq's environment and its documentation's examples."""

import contextlib
import importlib.util
import json
import os
import re
import textwrap
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

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


def run_events(run: Path) -> dict[str, list[tuple[int, object]]]:
    """``{tag: [(step, value), ...]}`` of the TensorBoard events directly in ``run`` (one run,
    its event files in order): floats for scalars, numpy arrays for histograms and other
    tensors."""
    import tensorflow as tf

    found: dict[str, list[tuple[int, object]]] = {}
    for path in sorted(run.glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                array = tf.make_ndarray(value.tensor) if value.HasField("tensor") else None
                numeric = array is not None and array.ndim == 0 and array.dtype.kind == "f"
                point = float(array) if numeric else array
                found.setdefault(value.tag, []).append((event.step, point))
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def tensorboard_server(logdir: Path, timeout: float = 90.0) -> Iterator[str]:
    """A real TensorBoard serving ``logdir`` on a free loopback port; yields its base URL once
    it answers, stops it afterwards."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host",
         "127.0.0.1", "--port", str(port), "--load_fast", "false"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + timeout
        while True:
            try:
                urllib.request.urlopen(f"{url}/data/runs", timeout=5).close()
                break
            except OSError:
                if time.time() > deadline or server.poll() is not None:
                    raise
                time.sleep(0.5)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


def load_with_bnn_alone(model, x, tmp_path: Path, describe: str) -> list[str]:
    """Saves ``model`` to ``tmp_path``, loads it in a fresh process that imports ``bnn`` alone
    (no ``bnn.larq``), checks that its outputs on ``x`` are the saved model's, and returns the
    words that process prints for ``describe`` (a Python expression of ``model``)."""
    import numpy as np

    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", np.asarray(model(x)))
    model.save(tmp_path / "m.keras")
    script = textwrap.dedent(f"""
        import sys, numpy as np
        import bnn, keras
        model = keras.saving.load_model({str(tmp_path / 'm.keras')!r})
        y = np.asarray(model(np.load({str(tmp_path / 'x.npy')!r})))
        assert np.array_equal(y, np.load({str(tmp_path / 'y.npy')!r})), "outputs differ"
        assert not any(m.startswith("bnn.larq") for m in sys.modules), "bnn.larq was imported"
        print({describe})
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.split()


def larq_script_output(request, script: str, last_file: str) -> Path:
    """Runs ``tests/larq/<script>`` in Larq's environment (:func:`larq_python`, which skips the
    test where there is none) with an output folder, and returns the folder. The folder is kept
    in pytest's cache, keyed by the script's text and the Larq python, so later sessions reuse
    it while ``last_file`` (the file the script writes last) is there (``pytest --cache-clear``
    redoes it)."""
    import hashlib

    python = larq_python()
    path = ROOT / "tests" / "larq" / script
    key = hashlib.sha256(path.read_bytes() + str(python).encode()).hexdigest()[:16]
    out = Path(request.config.cache.mkdir(f"{path.stem}_{key}"))
    if not (out / last_file).exists():
        env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
        result = subprocess.run([str(python), str(path), str(out)], env=env,
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
    return out


def larq_python() -> Path:
    """The Python of an environment with Larq and tf-keras (which must not share a process
    with bnn): ``$BNN_LARQ_PYTHON``, else ``larq-env/bin/python`` beside the repository.
    Skips the calling test, saying why, where there is none."""
    configured = os.environ.get("BNN_LARQ_PYTHON")
    python = Path(configured) if configured else ROOT.parent / "larq-env" / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no Larq environment at {python} (set BNN_LARQ_PYTHON to the python of a "
                    "venv with: pip install tensorflow-cpu tf-keras larq)")
    check = subprocess.run([str(python), "-c", "import importlib.util as u, sys; sys.exit("
                            "u.find_spec('larq') is None or u.find_spec('tf_keras') is None)"],
                           capture_output=True)
    if check.returncode:
        pytest.skip(f"{python} has no larq and tf_keras (pip install tf-keras larq there)")
    return python


_LARQ_DOCS = """
import importlib.metadata, json
larq = importlib.metadata.distribution("larq")
print(json.dumps({"version": larq.version, "readme": larq.read_text("METADATA"),
                  "optimizers": larq.locate_file("larq/optimizers.py").read_text()}))
"""


def larq_documentation_examples() -> dict[str, list[str]]:
    """The Python examples of Larq's own documentation, as installed in Larq's environment
    (nothing of Larq's is kept in this repository): ``"readme"``, the code blocks of the README
    that is the package's description, and ``"optimizers"``, those of ``larq.optimizers``'
    docstrings, dedented. Also ``"version"``: ``[larq's version]``."""
    found = json.loads(subprocess.run([str(larq_python()), "-c", _LARQ_DOCS], check=True,
                                      capture_output=True, text=True, timeout=120).stdout)

    def blocks(text: str) -> list[str]:
        return [textwrap.dedent(b) for b in re.findall(r"```python\n(.*?)```", text, re.S)]

    return {"version": [found["version"]], "readme": blocks(found["readme"]),
            "optimizers": blocks(found["optimizers"])}
