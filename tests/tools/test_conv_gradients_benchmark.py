"""benchmarks/conv_gradients.py runs in --quick mode and writes every field it reports."""

import json
import math

import pytest

from bnn.native import dispatch
from support import load_benchmark


@pytest.fixture(scope="module")
def conv_gradients():
    return load_benchmark("conv_gradients")


@pytest.mark.skipif(not dispatch.available(), reason="the benchmark needs the native kernels")
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_quick_run_writes_timings_choices_and_agreement(conv_gradients, tmp_path, capsys,
                                                        dtype):
    out = tmp_path / "r.json"
    assert conv_gradients.main(["--quick", "--dtype", dtype, "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["dtype"] == dtype and data["kernel_variant"] in ("generic", "avx2", "avx512")
    assert [(r["size"], r["in_channels"], r["filters"]) for r in data["layers"]] == [
        (32, 8, 16), (16, 16, 16), (16, 16, 32), (8, 32, 32), (8, 32, 64)]
    for row in data["layers"]:
        for key in ("forward_ms", "tensorflow_ms", "patches_product_ms", "bits_ms",
                    "lookup_ms", "tensorflow_over_lookup"):
            assert math.isfinite(row[key]) and row[key] > 0, key
        assert row["default_kernels"] in ("xla", "patches", "tensorflow")
        assert row["max_relative_difference"] < 1e-5  # float32 sums of the same operands
        assert math.isfinite(row["tensorflow_max_relative_difference"])
    assert data["total"]["lookup_ms"] == pytest.approx(
        sum(row["lookup_ms"] for row in data["layers"]))
    assert "| 8x8, 32 -> 64 |" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--filters", "1,2,3"], "--filters: six positive widths"),
    (["--filters", "a,b"], "--filters: six integers"),
    (["--blocks", "0"], "must be at least 1"),
])
def test_bad_arguments_are_one_line_usage_errors(conv_gradients, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        conv_gradients.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
