"""The command line around a trained run: export, evaluate, predict, summary, bench."""

import json

import numpy as np
import pytest

from bnn.cli import main
from support import DATA_DIR, ROOT, needs_mnist, run_cli, tiny_config, write_config

TINY = tiny_config(epochs=1, limit_train=1000)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    config = write_config(tmp / "tiny.yaml", TINY)
    assert run_cli("train", config, "--output-dir", tmp / "run") == 0
    return tmp / "run"


def test_a_quiet_run_leaves_progress_lines_on_for_what_comes_after(run_dir, capsys):
    import io

    from bnn import progress

    out = io.StringIO()
    with progress.phase("loading", out):
        pass
    assert out.getvalue().startswith("bnn: loading: ")


@needs_mnist
def test_export_evaluate_and_predict_agree_with_the_keras_model(run_dir, tmp_path, capsys):
    packed = tmp_path / "tiny.bnn"
    assert main(["export", str(run_dir), "-o", str(packed)]) == 0
    assert packed.stat().st_size * 25 < (run_dir / "binary" / "model.keras").stat().st_size
    figures = {}
    for model in (packed, run_dir / "binary" / "model.keras"):
        out = tmp_path / f"{model.suffix[1:]}.json"
        assert main(["evaluate", str(model), "--dataset", "mnist", "--data-dir", str(DATA_DIR),
                     "--json", str(out)]) == 0
        figures[model.suffix] = json.loads(out.read_text())
    assert figures[".bnn"]["accuracy"] == pytest.approx(figures[".keras"]["accuracy"], abs=2e-4)
    assert figures[".bnn"]["accuracy"] > 0.2 and figures[".bnn"]["examples_per_second"] > 0
    assert figures[".bnn"]["batch_size"] >= 1 and figures[".bnn"]["workers"] >= 1

    out = tmp_path / "compare.json"
    assert main(["evaluate", str(packed), "--dataset", "mnist", "--data-dir", str(DATA_DIR),
                 "--compare", str(run_dir / "binary" / "model.keras"), "--batch-size", "256",
                 "--json", str(out)]) == 0
    compared = json.loads(out.read_text())
    assert compared["batch_size"] == compared["compare"]["batch_size"] == 256
    assert compared["compare"]["accuracy"] == pytest.approx(compared["accuracy"], abs=2e-4)
    assert compared["compare"]["examples_per_second"] > 0 and compared["speedup"] > 0

    with np.load(DATA_DIR / "mnist.npz") as d:
        images, labels = d["x_test"][:20], d["y_test"][:20]
    np.save(tmp_path / "images.npy", images)
    capsys.readouterr()
    for model in (packed, run_dir / "binary" / "model.keras"):
        logits_path = tmp_path / f"logits{model.suffix}.npy"
        assert main(["predict", str(model), str(tmp_path / "images.npy"), "--dataset", "mnist",
                     "-o", str(logits_path)]) == 0
    assert main(["predict", str(packed), str(tmp_path / "images.npy"), "--dataset", "mnist",
                 "--compare", str(run_dir / "binary" / "model.keras")]) == 0
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    assert len(lines) == 60 and lines[0].startswith("0\t")
    report = captured.err.strip().splitlines()
    assert sum("examples/s" in line for line in report) == 4  # 2 runs, then both models
    assert report[-1].startswith("bnn: speed-up over ")
    a, b = (np.load(tmp_path / f"logits{s}.npy") for s in (".bnn", ".keras"))
    np.testing.assert_array_equal(a.argmax(-1), b.argmax(-1))
    assert (a.argmax(-1) == labels).mean() > 0.2


def test_export_of_a_keras_file_finds_its_run_or_notes_the_float_first_layer(run_dir, tmp_path,
                                                                           capsys):
    import shutil

    inside = run_dir / "binary" / "model.keras"
    outside = tmp_path / "model.keras"
    shutil.copy(inside, outside)
    infos, notes = {}, {}
    for name, source, pixels in [("inside", inside, "auto"), ("outside", outside, "auto"),
                                 ("float", outside, "float")]:
        capsys.readouterr()
        assert main(["export", str(source), "-o", str(tmp_path / f"{name}.bnn"), "--pixels",
                     pixels]) == 0
        captured = capsys.readouterr()
        infos[name] = json.loads(captured.out)
        notes[name] = [line for line in captured.err.splitlines() if "--pixels uint8" in line]
    assert infos["inside"]["input_encoding"] == {"scale": 1 / 127.5, "offset": -1.0}  # config
    assert infos["inside"]["stages"][0]["input"] == "uint8" and not notes["inside"]
    assert infos["outside"]["input_encoding"] is None
    assert infos["outside"]["uint8_input_possible"] and len(notes["outside"]) == 1
    assert notes["outside"][0].startswith("bnn: note: the first layer stays a float product")
    assert not notes["float"]  # asked for explicitly


def test_export_of_a_missing_source_is_one_line_exit_2(tmp_path, capsys):
    assert main(["export", str(tmp_path / "nope"), "-o", str(tmp_path / "x.bnn")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope" in err[0]
    assert not (tmp_path / "x.bnn").exists()


def test_evaluate_a_damaged_model_file_is_one_line_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.bnn"
    bad.write_bytes(b"BNNPACK\x00garbage")
    assert main(["evaluate", str(bad), "--dataset", "mnist", "--data-dir", str(DATA_DIR)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bad.bnn" in err[0]


def test_summary_prints_the_layer_table_with_compression(capsys):
    config = ROOT / "experiments" / "mnist_mlp_quick.yaml"
    assert main(["summary", str(config)]) == 0
    out = capsys.readouterr().out
    assert "dense0" in out and "dense_out" in out
    assert "compression" in out.lower()


def test_bench_quick_writes_json_fields(tmp_path):
    out = tmp_path / "bench.json"
    assert main(["bench", "--quick", "--models", "binarynet_mlp", "--xla", "on",
                 "--json", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    assert results and all(r["binary_ms"] > 0 and r["float_ms"] > 0 and r["ratio"] > 0
                           for r in results)
