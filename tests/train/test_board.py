"""The trainer's TensorBoard run (bnn.train.board): tags, the custom-scalars layout, which
histograms it writes and when, and the final test figures."""

import re
from pathlib import Path

import keras
import numpy as np
import pytest

from bnn import models
from bnn.train.board import METRICS, TAGS, Board, layout, main_hparams, tag_for
from bnn.train.metrics import FlipRatio
from support import run_events


def test_tags_group_the_comparison_first_and_histograms_last():
    assert tag_for("test_accuracy") == "accuracy/test"
    assert tag_for("val_loss") == "loss/validation"
    assert tag_for("flip_ratio/dense0") == "flips/dense0"
    assert tag_for("val_top5") == "top5/validation"
    assert tag_for("distill_loss") == "train/distill_loss"
    groups = sorted({tag.split("/")[0] for tag in TAGS.values()})
    # Time Series sorts groups by name: accuracy first, the step time next, histograms last
    assert groups[:2] == ["accuracy", "cost"] and max(groups) < "weights"


def test_layout_charts_match_the_tags_they_compare():
    categories = {c.title: c for c in layout().category}
    assert list(categories) == ["binary vs float", "train vs test"]
    charts = {chart.title: chart.multiline.tag for chart in categories["binary vs float"].chart}
    expected = {"test accuracy": "accuracy/test", "training loss": "loss/train",
                "train step (ms)": "cost/step_time_ms",
                "flip ratio (binary weights that changed sign)": "flips/all"}
    assert set(charts) == set(expected)
    for title, tag in expected.items():
        matched = [t for t in [*TAGS.values(), "flips/dense0"]
                   if any(re.search(p, t) for p in charts[title])]
        assert matched == [tag], title
    splits = categories["train vs test"].chart[0].multiline.tag[0]
    assert [t for t in TAGS.values() if re.search(splits, t)] == [
        "accuracy/test", "accuracy/train", "accuracy/validation"]


def test_hparams_columns_are_the_main_settings_and_the_explicit_model_options():
    values = {"model.precision": "binary", "model.name": "vgg_small", "training.xla": False,
              "model.options.filters": "[8]", "model.options.momentum": 0.9, "dataset.cutout": 0}
    assert main_hparams(values, {"filters": [8]}) == [
        "model.precision", "model.name", "training.xla", "model.options.filters"]
    assert [tag for tag, _ in METRICS][:1] == ["accuracy/test"]


def _trained(histograms: str, every: int, tmp_path, flips: bool = True):
    keras.utils.set_random_seed(0)
    model = models.binarynet_mlp(input_shape=(6,), hidden_units=(8,), num_classes=3)
    model.compile(optimizer=keras.optimizers.SGD(0.5),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callback = FlipRatio()
    board = Board(tmp_path, model, histograms, every, callback if flips else None)
    x = np.random.default_rng(1).normal(size=(64, 6)).astype("float32")
    y = np.random.default_rng(2).integers(0, 3, size=64)

    class Write(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            board.epoch(epoch, logs)

    model.fit(x, y, epochs=2, batch_size=16, verbose=0, callbacks=[callback, Write()])
    return model, board, callback


def test_binary_histograms_are_the_latent_kernels_and_their_flips_per_unit(tmp_path):
    model, board, callback = _trained("binary", 1, tmp_path)
    board.close()
    events = run_events(tmp_path)
    histograms = sorted(tag for tag in events if tag.startswith("weights/"))
    assert histograms == ["weights/dense0/kernel", "weights/dense0/kernel_flips",
                          "weights/dense_out/kernel", "weights/dense_out/kernel_flips"]
    assert [step for step, _ in events["weights/dense0/kernel"]] == [1, 2]
    # the flips histogram counts one entry per output unit, each a fraction of that unit's
    # weights, whose mean is the layer's flip ratio
    units = callback.unit_ratios[model.get_layer("dense0").kernel.path]
    assert units.shape == (8,) and ((0 <= units) & (units <= 1)).all()
    assert units.mean() == pytest.approx(events["flips/dense0"][-1][1], rel=1e-6)
    buckets = events["weights/dense0/kernel_flips"][-1][1]
    assert buckets[:, 2].sum() == 8
    assert [step for step, _ in events["flips/all"]] == [1, 2]


def test_all_histograms_add_every_variable_and_zero_frequency_writes_none(tmp_path):
    _, board, _ = _trained("all", 2, tmp_path / "all")
    board.close()
    events = run_events(tmp_path / "all")
    assert {"weights/bn0/moving_variance", "weights/bn0/gamma", "weights/dense0/kernel"} <= set(
        events)
    assert [step for step, _ in events["weights/bn0/gamma"]] == [2]  # every 2nd epoch

    _, board, _ = _trained("binary", 0, tmp_path / "none")
    board.close()
    assert not [tag for tag in run_events(tmp_path / "none") if tag.startswith("weights/")]


def test_final_test_figures_are_written_only_where_the_last_epoch_lacks_them(tmp_path):
    model = models.binarynet_mlp(input_shape=(6,), hidden_units=(8,), num_classes=3)
    board = Board(tmp_path / "a", model, histogram_every=0)
    board.epoch(0, {"loss": 1.0, "test_accuracy": 0.5, "test_loss": 2.0})
    board.epoch(1, {"loss": 0.5, "accuracy": float("nan")})  # not finite: left out
    board.final(2, 0.75, 1.5)
    board.close()
    events = run_events(tmp_path / "a")
    assert events["accuracy/test"] == [(1, 0.5), (2, 0.75)]
    assert "accuracy/train" not in events

    board = Board(tmp_path / "b", model, histogram_every=0)
    board.epoch(0, {"test_accuracy": 0.5, "test_loss": 2.0})
    board.final(1, 0.5, 2.0)
    board.close()
    assert run_events(tmp_path / "b")["accuracy/test"] == [(1, 0.5)]


def test_the_docs_keras_script_example_logs_the_flip_ratio(tmp_path, monkeypatch):
    doc = Path(__file__).resolve().parents[2] / "docs" / "tensorboard.md"
    [block] = re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.S)
    monkeypatch.chdir(tmp_path)
    exec(block, {})  # noqa: S102 - the page's own example
    tags = set(run_events(tmp_path / "logs" / "train"))
    assert {"epoch_flip_ratio", "epoch_flip_ratio/dense0", "epoch_accuracy"} <= tags
