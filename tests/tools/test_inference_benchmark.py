"""benchmarks/inference.py runs in --quick mode and writes every field it reports."""

import json
import math

import pytest

from support import DATA_DIR, load_benchmark, needs_mnist


@pytest.fixture(scope="module")
def inference():
    return load_benchmark("inference")


@needs_mnist
def test_quick_mlp_run_writes_timings_sizes_and_mnist_agreement(inference, tmp_path, capsys,
                                                                 monkeypatch):
    monkeypatch.setenv("BNN_DATA_DIR", str(DATA_DIR))
    assert inference.main(["--quick", "--models", "mlp", "--json", str(tmp_path / "r.json")]) == 0
    data = json.loads((tmp_path / "r.json").read_text())
    assert list(data["models"]) == ["mlp"]
    mlp = data["models"]["mlp"]
    assert mlp["size_ratio"] > 25 and mlp["bnn_bytes"] > 0
    assert sorted(mlp["batches"]) == ["1", "100"]
    timings = ["packed_ms", "packed_uint8_ms", "float_ms", "float_xla_ms"]
    if data["native_kernels"]:
        timings.append("packed_xla_ms")
    for batch in mlp["batches"].values():
        for key in timings + ["speedup_vs_best_float"]:
            assert math.isfinite(batch[key]) and batch[key] > 0, key
        assert batch["max_abs_logit_difference"] < 1e-3
    assert mlp["native_kernels"] == data["native_kernels"]  # the MLP uses them where preferred
    assert data["native_kernels_built"] or not data["native_kernels"]
    assert data["native_kernel_variant"] in (("generic", "avx2", "avx512")
                                             if data["native_kernels_built"] else (None,))
    for key in ("integer_first_layer", "float_first_layer"):
        assert data["mnist"][key]["disagreements"] == 0
    table = capsys.readouterr().out
    assert "| mlp | 100 |" in table and "10000/10000" in table


def test_unknown_model_is_a_one_line_usage_error(inference, capsys):
    with pytest.raises(SystemExit) as exit_info:
        inference.main(["--models", "mlp,resnet"])
    assert exit_info.value.code == 2
    assert "--models: unknown resnet" in capsys.readouterr().err
