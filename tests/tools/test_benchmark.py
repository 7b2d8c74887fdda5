"""The step-time harness: a --quick run writes complete, sane JSON and a markdown table; the fast
ste_sign keeps the binary forward exact."""

import json
import math

import numpy as np
import pytest
import tensorflow as tf

from bnn.tools import benchmark
from bnn.layers import BinaryDense

FIELDS = ("model", "xla", "batch_size", "binary_ms", "float_ms", "ratio",
          "binary_examples_per_second", "float_examples_per_second", "binary_cpu_ms",
          "float_cpu_ms", "cpu_ratio")
NUMBERS = ("binary_ms", "float_ms", "ratio", "binary_examples_per_second",
           "float_examples_per_second", "binary_cpu_ms", "float_cpu_ms", "cpu_ratio")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    code = benchmark.main(["--quick", "--models", "binarynet_mlp", "--xla", "off",
                           "--json", str(out / "r.json"), "--markdown", str(out / "r.md")])
    return code, json.loads((out / "r.json").read_text()), (out / "r.md").read_text()


def test_quick_run_writes_json_with_every_field_positive_and_finite(quick_run):
    code, data, _ = quick_run
    assert code == 0
    assert {"cpu", "cores", "device", "tensorflow", "keras", "date",
            "cpu_allocator"} <= set(data["machine"])
    assert data["machine"]["cpu_allocator"] in ("bfc", "default")
    assert data["machine"]["tensorflow"] == tf.__version__
    [row] = data["results"]
    assert set(FIELDS) <= set(row)
    assert (row["model"], row["xla"]) == ("binarynet_mlp", False)
    for field in NUMBERS:
        assert math.isfinite(row[field]) and row[field] > 0, field
    assert row["binary_examples_per_second"] == pytest.approx(
        row["batch_size"] / row["binary_ms"] * 1e3)
    assert len(row["binary_block_ms"]) == len(row["float_block_ms"]) == row["blocks"]


def test_markdown_has_a_row_per_result(quick_run):
    _, data, table = quick_run
    lines = table.splitlines()
    assert lines[0].startswith("| model | XLA | batch | binary ms | float ms | binary/float")
    assert lines[1].startswith("|---|")
    assert lines[2].startswith("| binarynet_mlp | off | 8 |")
    assert f"{data['results'][0]['ratio']:.2f}" in lines[2]
    assert table == benchmark.to_markdown(data)


def test_markdown_shows_larq_columns_when_present(quick_run):
    _, data, _ = quick_run
    row = dict(data["results"][0], larq_binary_ms=80.0, larq_float_ms=60.0, larq_ratio=1.33,
               bnn_over_larq=0.5, bnn_over_larq_cpu=0.55)
    table = benchmark.to_markdown({**data, "results": [row]})
    assert "bnn binary / Larq binary" in table.splitlines()[0]
    assert "| 80.0 | 60.0 | 1.33 | 0.50 | 0.55 |" in table


@pytest.mark.parametrize("argv, message", [
    (["--models", "resnet9000"], "resnet9000"),
    (["--xla", "sometimes"], "on, off or both"),
])
def test_bad_flags_exit_with_a_one_line_reason(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        benchmark.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_run_rejects_zero_blocks():
    with pytest.raises(ValueError, match="blocks must be >= 1"):
        benchmark.run(("binarynet_mlp",), (False,), blocks=0)


@pytest.mark.parametrize("jit", [False, True])
def test_binary_forward_is_exact_against_fp32_sign_reference(jit):
    """Sums of 2048 ±1 products, far beyond what a bf16 result could hold exactly."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((16, 2048)).astype(np.float32)
    layer = BinaryDense(300)
    layer.build((None, 2048))
    layer.kernel.assign(rng.uniform(-1, 1, (2048, 300)).astype(np.float32))
    call = tf.function(layer.__call__, jit_compile=jit)
    got = call(tf.constant(x)).numpy()
    sign = lambda a: np.where(a >= 0, 1.0, -1.0)  # noqa: E731
    want = sign(x).astype(np.float64) @ sign(layer.kernel.numpy()).astype(np.float64)
    np.testing.assert_array_equal(got, want)


def test_mixed_precision_builds_the_twins_under_that_policy_and_restores_the_global_one():
    import keras

    seen = []

    def companions(spec):
        seen.append(keras.mixed_precision.global_policy().name)
        return {}

    results = benchmark.run(("reactnet_resnet", "binarynet_mlp"), xla=(False,), quick=True,
                            mixed_precision="bfloat16", companions=companions)
    row, mlp = results["results"]
    assert row["mixed_precision"] == "bfloat16" and row["binary_ms"] > 0
    # every row, not only the first: clearing the Keras session between rows resets the policy
    assert seen == ["mixed_bfloat16", "mixed_bfloat16"]
    assert keras.mixed_precision.global_policy().name == "float32"
    assert "reactnet_resnet (bfloat16)" in benchmark.to_markdown(results)
    with pytest.raises(ValueError, match="mixed_precision must be one of"):
        benchmark.run(("reactnet_resnet",), quick=True, mixed_precision="fp8")
