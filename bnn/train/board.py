"""TensorBoard logs of one twin, laid out for comparing twins.

Each twin writes one run, named by its label (``binary``, ``float``, ``binary_no_distill``), and
every figure has the same tag in every twin, so TensorBoard draws the twins as lines of one chart.
Tags are grouped so that the Time Series dashboard, which sorts groups and tags by name, opens on
the comparison:

======================  ===============================================================
``accuracy/test``        test accuracy (also ``accuracy/train``, ``accuracy/validation``)
``cost/step_time_ms``    median train step of the epoch (compilation steps excluded)
``flips/all``            fraction of binary weights whose sign changed in the epoch, and
                         ``flips/<layer>`` for each binary layer
``loss/test``            losses (also ``loss/train``, ``loss/validation``)
``optimizer/learning_rate``  the rate the epoch's last step used
``weights/...``          histograms, after every scalar: each binary layer's latent kernel
                         (``weights/<layer>/kernel``) and, per output unit, the fraction of
                         its weights that flipped sign in the epoch
                         (``weights/<layer>/kernel_flips``); with ``training.histograms:
                         all``, every variable of the model (batch-norm statistics too)
======================  ===============================================================

Each run also holds the custom-scalars layout of :func:`layout` (a "binary vs float" category:
test accuracy, training loss, step time and flip ratio of all twins, one chart each) and its
hparams dashboard entry: the recipe's main settings as columns, the final figures as metrics.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np
import tensorflow as tf

from bnn.layers.walk import binary_kernel_layers

__all__ = ["TAGS", "tag_for", "layout", "Board", "METRICS", "main_hparams"]

#: Epoch-log key -> tag, for the keys the trainer logs.
TAGS: dict[str, str] = {
    "test_accuracy": "accuracy/test",
    "accuracy": "accuracy/train",
    "val_accuracy": "accuracy/validation",
    "step_time_ms": "cost/step_time_ms",
    "flip_ratio": "flips/all",
    "test_loss": "loss/test",
    "loss": "loss/train",
    "val_loss": "loss/validation",
    "learning_rate": "optimizer/learning_rate",
}

#: The hparams dashboard's metric columns: ``(tag, display name)``.
METRICS: tuple[tuple[str, str], ...] = (
    ("accuracy/test", "test accuracy"),
    ("accuracy/train", "train accuracy"),
    ("loss/test", "test loss"),
    ("cost/step_time_ms", "train step (ms)"),
    ("flips/all", "flip ratio"),
)

#: The hparams dashboard's columns besides the model options the experiment sets.
_MAIN_SETTINGS = ("model.precision", "model.name", "dataset.name", "optimizer.name",
                  "optimizer.learning_rate", "schedule.name", "training.epochs",
                  "training.batch_size", "training.mixed_precision", "training.xla",
                  "training.distill", "training.seed")

_HISTOGRAMS = "weights"


def tag_for(key: str) -> str:
    """The tag of an epoch-log ``key``: :data:`TAGS`, ``flips/<layer>`` for
    ``flip_ratio/<layer>``, ``<metric>/validation`` for another ``val_<metric>``, and
    ``train/<key>`` for any other figure."""
    if key in TAGS:
        return TAGS[key]
    if key.startswith("flip_ratio/"):
        return "flips/" + key[len("flip_ratio/"):]
    if key.startswith("val_"):
        return f"{key[4:]}/validation"
    return f"train/{key}"


def layout():
    """The custom-scalars layout of a comparison: one chart per figure with every twin's line
    (category "binary vs float"), and each twin's train, validation and test curves on one
    chart (category "train vs test")."""
    from tensorboard.plugins.custom_scalar import layout_pb2

    def chart(title: str, pattern: str):
        return layout_pb2.Chart(title=title,
                                multiline=layout_pb2.MultilineChartContent(tag=[pattern]))

    return layout_pb2.Layout(category=[
        layout_pb2.Category(title="binary vs float", chart=[
            chart("test accuracy", r"^accuracy/test$"),
            chart("training loss", r"^loss/train$"),
            chart("train step (ms)", r"^cost/step_time_ms$"),
            chart("flip ratio (binary weights that changed sign)", r"^flips/all$"),
        ]),
        layout_pb2.Category(title="train vs test", chart=[
            chart("accuracy", r"^accuracy/(train|validation|test)$"),
            chart("loss", r"^loss/(train|validation|test)$"),
        ]),
    ])


def main_hparams(values: Mapping[str, Any], explicit_options: Mapping[str, Any]) -> list[str]:
    """The hparams dashboard's columns among ``values`` (:func:`bnn.train.config.hparams` with
    the twin's ``model.precision`` and ``training.xla``): the main settings, and the model
    options the experiment sets (``explicit_options``)."""
    names = [*_MAIN_SETTINGS, *(f"model.options.{key}" for key in sorted(explicit_options))]
    return [name for name in names if name in values]


class Board:
    """The TensorBoard run of one twin, in ``directory``.

    Args:
        directory: the twin's directory; its events go there (one run per twin).
        model: the twin's model (the student, when distilling), for histograms.
        histograms: ``"binary"``: the binary layers' latent kernels and their sign flips;
            ``"all"``: every variable of the model as well.
        histogram_every: epochs between histograms; 0 writes none.
        flips: the :class:`bnn.train.metrics.FlipRatio` callback of a binary twin (its per-unit
            flips go into the histograms), or None.
    """

    def __init__(self, directory: Path, model, histograms: str = "binary",
                 histogram_every: int = 1, flips=None):
        self.directory = Path(directory)
        self.model = model
        self.histograms = histograms
        self.histogram_every = int(histogram_every)
        self.flips = flips
        self.writer = tf.summary.create_file_writer(str(self.directory))
        self.last_epoch = 0
        self.last_keys: set[str] = set()

    def start(self, hparams: Mapping[str, Any], columns: list[str], trial: str) -> None:
        """Writes the custom-scalars layout and the hparams entry (``columns`` of ``hparams``
        as the dashboard's columns, :data:`METRICS` as its metrics)."""
        from tensorboard.plugins.custom_scalar import summary as custom_scalar
        from tensorboard.plugins.hparams import api as hp

        with self.writer.as_default():
            tf.summary.experimental.write_raw_pb(
                custom_scalar.pb(layout()).SerializeToString(), step=0)
            hp.hparams_config(hparams=[hp.HParam(name) for name in columns],
                              metrics=[hp.Metric(tag, display_name=name) for tag, name in METRICS])
            hp.hparams(dict(hparams), trial_id=trial)
        self.writer.flush()

    def epoch(self, epoch: int, logs: Mapping[str, Any]) -> None:
        """Writes the figures of epoch ``epoch`` (0-based; its step is ``epoch + 1``, the
        number of epochs trained), and its histograms when they are due."""
        step = epoch + 1
        with self.writer.as_default():
            for key, value in logs.items():
                if np.ndim(value) == 0 and np.isfinite(float(value)):
                    tf.summary.scalar(tag_for(key), float(value), step=step)
            if self.histogram_every and step % self.histogram_every == 0:
                self._histograms(step)
        self.writer.flush()
        self.last_epoch, self.last_keys = step, set(logs)

    def final(self, epochs: int, test_accuracy: float, test_loss: float) -> None:
        """Writes the final test figures at step ``epochs`` where the last epoch did not log
        them (``training.test_every`` > 1), so the dashboards end on them."""
        if self.last_epoch == epochs and {"test_accuracy", "test_loss"} <= self.last_keys:
            return
        with self.writer.as_default():
            tf.summary.scalar(TAGS["test_accuracy"], test_accuracy, step=epochs)
            tf.summary.scalar(TAGS["test_loss"], test_loss, step=epochs)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()

    def _histograms(self, step: int) -> None:
        seen = set()
        for layer in binary_kernel_layers(self.model):
            for kernel in layer.binary_kernels():
                name = self._histogram_tag(kernel)
                tf.summary.histogram(name, kernel, step=step)
                seen.add(kernel.path)
                units = getattr(self.flips, "unit_ratios", {}).get(kernel.path)
                if units is not None:
                    tf.summary.histogram(name + "_flips", units, step=step)
        if self.histograms == "all":
            for variable in self.model.weights:
                if variable.path not in seen:
                    tf.summary.histogram(self._histogram_tag(variable), variable, step=step)

    def _histogram_tag(self, variable) -> str:
        """``weights/<layer>/<variable>``: the variable's path without the model's name, which
        differs between twins."""
        return f"{_HISTOGRAMS}/{variable.path.removeprefix(self.model.name + '/')}"
