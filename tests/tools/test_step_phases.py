"""``bnn bench --phases``: the forward and gradient timers run the work they name, and a quick run
writes the phase fields and table."""

import json
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from bnn import models, optimizers
from bnn.tools import benchmark, step_phases


@pytest.fixture(scope="module")
def quick_phases(tmp_path_factory):
    out = tmp_path_factory.mktemp("phases")
    code = benchmark.main(["--quick", "--models", "binarynet_mlp", "--xla", "on", "--phases",
                           "--json", str(out / "r.json"), "--markdown", str(out / "r.md")])
    return code, json.loads((out / "r.json").read_text()), (out / "r.md").read_text()


def test_quick_run_writes_phase_fields(quick_phases):
    code, data, _ = quick_phases
    assert code == 0
    [row] = data["results"]
    for twin in ("binary", "float"):
        for phase in ("forward", "gradient"):
            assert len(row[f"{twin}_{phase}_block_ms"]) == row["blocks"]
        assert math.isfinite(row[f"{twin}_forward_ms"]) and row[f"{twin}_forward_ms"] > 0
        assert row[f"{twin}_backward_ms"] == pytest.approx(
            row[f"{twin}_gradient_ms"] - row[f"{twin}_forward_ms"])
        assert row[f"{twin}_rest_ms"] == pytest.approx(
            row[f"{twin}_ms"] - row[f"{twin}_gradient_ms"])


def test_markdown_has_a_phase_row_per_twin(quick_phases):
    _, data, table = quick_phases
    [row] = data["results"]
    lines = table.splitlines()
    start = lines.index(next(line for line in lines if line.startswith("| model | XLA | twin")))
    binary, floating = lines[start + 2], lines[start + 3]
    assert binary.startswith("| binarynet_mlp | on | binary | "
                             f"{row['binary_forward_ms']:.1f} | {row['binary_backward_ms']:.1f} |")
    assert floating.startswith("| binarynet_mlp | on | float | ")
    assert binary.endswith(f"| {row['binary_ms'] - row['binary_forward_ms']:.1f} |")


def test_without_phases_there_are_no_phase_fields_or_table():
    data = benchmark.run(("binarynet_mlp",), (False,), quick=True)
    [row] = data["results"]
    assert "binary_forward_ms" not in row
    assert "twin" not in benchmark.to_markdown(data)


@pytest.mark.parametrize("loss", [keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                                  "sparse_categorical_crossentropy"])
def test_timers_run_the_forward_pass_and_the_gradients(loss):
    """The forward timer runs the training-mode forward pass (it moves the batch-norm moving
    mean); the gradient timer computes gradients but updates no weight. A loss given by name
    works too."""
    keras.utils.set_random_seed(0)
    model = models.build("binarynet_mlp", "binary", input_shape=(8, 8, 1), hidden_units=(16,))
    model.compile(optimizer=optimizers.Adam(1e-3), loss=loss)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 8, 8, 1), dtype=np.float32)
    y = rng.integers(0, 10, size=(4,))
    kernels = [v.numpy().copy() for v in model.trainable_variables]
    moving = [v for v in model.non_trainable_variables if "moving_mean" in v.path]
    assert moving
    before = [v.numpy().copy() for v in moving]
    timers = step_phases.phase_timers(model, x, y, xla=False, warmup_steps=1)
    assert set(timers) == {"forward", "gradient"}
    wall, cpu = timers["forward"](2)
    assert wall > 0 and cpu >= 0
    assert any(not np.array_equal(b, v.numpy()) for b, v in zip(before, moving))
    timers["gradient"](2)
    for old, v in zip(kernels, model.trainable_variables):
        np.testing.assert_array_equal(old, v.numpy())


@pytest.mark.parametrize("result", [lambda: tf.constant(float("nan")),
                                    lambda: (tf.constant(float("inf")), [tf.zeros(3)])])
def test_a_non_finite_phase_voids_the_timing(result):
    timer = step_phases.block_timer(result, "a phase")
    with pytest.raises(RuntimeError, match="non-finite"):
        timer(1)


def test_phases_time_a_bfloat16_model(tmp_path):
    """Under the mixed_bfloat16 policy the phase timers read their bfloat16 scalars too."""
    code = benchmark.main(["--quick", "--models", "binarynet_mlp", "--xla", "off", "--phases",
                           "--mixed-precision", "bfloat16", "--json", str(tmp_path / "r.json")])
    [row] = json.loads((tmp_path / "r.json").read_text())["results"]
    assert code == 0 and row["mixed_precision"] == "bfloat16"
    assert all(row[f"{twin}_forward_ms"] > 0 for twin in ("binary", "float"))
