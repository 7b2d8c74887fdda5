"""The trainer: one twin (binary or float) of an experiment, trained with Keras ``fit``.

``train_twin`` builds the data pipelines and the model from a :class:`bnn.train.config.Config`, trains
with a checkpoint after every epoch, logs to TensorBoard and returns the twin's figures.
``--resume`` continues from the newest complete checkpoint and, with a fixed seed and
``deterministic: true`` on the CPU, ends where an uninterrupted run ends: the data order depends
only on (seed, epoch) and the checkpoint holds the weights, the batch-norm statistics and the
optimizer state.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import keras
import numpy as np

from bnn import models, optimizers, progress
from bnn.errors import Interrupted, RunDirError, TrainingError
from bnn.native import dispatch
from bnn.train import callbacks as cb
from bnn.train import data as data_lib
from bnn.train import distill as distill_lib
from bnn.train import losses
from bnn.train.board import Board, main_hparams
from bnn.train.config import Config, hparams
from bnn.train.fitting import FitModel
from bnn.train.rundir import Checkpoints
from bnn.train.runtime import configure_runtime, is_chief, make_strategy
from bnn.train.schedules import EpochSchedule, decay_rate_for
from bnn.train.twins import NO_DISTILL, plan_twins

__all__ = ["TrainingError", "Interrupted", "TwinResult", "train_twin", "plan_twins",
           "build_model", "NO_DISTILL"]


@dataclass
class TwinResult:
    precision: str
    test_accuracy: float
    best_test_accuracy: float
    test_loss: float
    median_step_ms: float
    examples_per_second: float
    params: int
    epochs: int
    wall_seconds: float
    xla: bool = False
    xla_reason: str = ""
    history: list[dict] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """The figures for ``report.json`` (everything but the per-epoch history)."""
        return {k: v for k, v in self.__dict__.items() if k not in ("history", "precision")}


def _learning_rate(config: Config, steps_per_epoch: int):
    s, o = config.schedule, config.optimizer
    decay = s.decay_rate
    if s.name == "exponential" and s.final_learning_rate is not None:
        decay = decay_rate_for(o.learning_rate, s.final_learning_rate, config.training.epochs)
    if s.name == "constant" and s.warmup_epochs == 0:
        return o.learning_rate
    return EpochSchedule(s.name, o.learning_rate, steps_per_epoch, config.training.epochs,
                         decay_rate=decay, alpha=s.alpha, warmup_epochs=s.warmup_epochs)


def _optimizer(config: Config, model: keras.Model, learning_rate) -> keras.optimizers.Optimizer:
    """The experiment's optimizer, by :func:`bnn.optimizers.make_optimizer`."""
    o = config.optimizer
    options = {
        "adam": dict(beta_1=o.beta_1, beta_2=o.beta_2, epsilon=o.epsilon,
                     weight_decay=o.weight_decay or None),
        "sgd": dict(momentum=o.momentum, nesterov=o.nesterov,
                    weight_decay=o.weight_decay or None),
        "bop": dict(threshold=o.threshold, gamma=o.gamma),
    }[o.name]
    return optimizers.make_optimizer(o.name, model, learning_rate, **options)


def build_model(config: Config, precision: str, info: data_lib.Datasets,
                xla: bool = False) -> keras.Model:
    """The configured architecture in ``precision``, compiled with loss, optimizer, accuracy,
    and the train step compiled by XLA where ``xla``."""
    options = {"input_shape": info.input_shape, "num_classes": info.num_classes,
               "synchronized_bn": config.training.distribute != "none", **config.model.options}
    model = models.build(config.model.name, precision, **options)
    loss = losses.get(config.training.loss, info.num_classes, config.training.label_smoothing)
    optimizer = _optimizer(config, model, _learning_rate(config, info.steps_per_epoch))
    model.compile(optimizer=optimizer, loss=loss,
                  metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
                  jit_compile=xla)
    return model


def _load_checkpoint(path: Path) -> keras.Model:
    try:
        return keras.models.load_model(path)
    except Exception as error:  # noqa: BLE001 - any failure to read is a damaged file
        raise RunDirError(f"checkpoint {path} cannot be read ({type(error).__name__}: "
                          f"{str(error).splitlines()[0][:160]}); delete it (and its state file) "
                          "to resume from the previous checkpoint") from None


class _EpochCheckpoint(keras.callbacks.Callback):
    """Saves a complete-epoch checkpoint unless the epoch was cut short."""

    def __init__(self, trainer: _Twin):
        super().__init__()
        self.trainer = trainer

    def on_epoch_end(self, epoch, logs=None):
        t = self.trainer
        if t.nonfinite.where:
            return
        if t.signals.received is not None:
            t.save_interrupted(epoch, t.skipped + t.signals.batches_done)
            return
        t.history.append({k: float(v) for k, v in (logs or {}).items()})
        t.save_checkpoint(epoch + 1)
        if t.board is not None:
            t.board.epoch(epoch, t.history[-1])


class _Twin:
    """State of one twin's training run; ``run()`` does the work."""

    def __init__(self, config: Config, precision: str, run_dir: Path, data_dir=None,
                 resume: bool = False, verbose: int | str = "auto", label: str | None = None):
        self.config = config
        self.precision = precision
        self.run_dir = Path(run_dir)
        self.label = label or precision
        self.dir = self.run_dir / self.label
        self.data_dir = data_dir
        self.resume = resume
        self.verbose = verbose
        self.checkpoints = Checkpoints(self.dir / "checkpoints", config.training.checkpoints_keep)
        self.history: list[dict] = []
        self.step_medians: list[float] = []
        self.wall_before = 0.0
        self.started = time.perf_counter()
        self.timer = cb.StepTimer()
        self.nonfinite = cb.NonFiniteStop()
        self.signals = cb.SignalStop()
        self.strategy = make_strategy(config)
        self.chief = is_chief(self.strategy)
        self.xla, self.xla_reason = False, ""  # the train step's compiler, and why
        self.model: keras.Model | None = None  # the student: what checkpoints hold
        self.fit_model: keras.Model | None = None  # what fit runs: the student or a FitModel
        self.board: Board | None = None  # the twin's TensorBoard run (the chief's only)
        self.skipped = 0  # batches of the current epoch done before a mid-epoch resume

    def _datasets(self, initial_epoch: int, epochs: int) -> data_lib.Datasets:
        """Pipelines for epochs ``[initial_epoch, epochs)``; when nothing is left to train
        (a finished twin), those of the last epoch, for the test set."""
        d, t = self.config.dataset, self.config.training
        with progress.phase(f"loading {d.name}"):
            return data_lib.make_datasets(
                d.name, t.batch_size, t.seed, epochs=epochs,
                initial_epoch=min(initial_epoch, epochs - 1),
                validation_split=d.validation_split, augment=d.augment,
                limit_train=d.limit_train, limit_test=d.limit_test, data_dir=self.data_dir,
                cutout=d.cutout, on_device=d.on_device)

    def state(self) -> dict:
        return {"history": self.history, "step_medians": self.step_medians + self.timer.epoch_medians,
                "wall_seconds": self.wall_before + time.perf_counter() - self.started,
                "precision": self.precision, "xla": self.xla, "xla_reason": self.xla_reason}

    def save_checkpoint(self, epoch: int) -> None:
        if self.chief:
            self.checkpoints.save(self.model, epoch, self.state())

    def save_interrupted(self, epoch: int, batches_done: int) -> None:
        if self.chief:
            self.checkpoints.save_interrupted(self.model, epoch, batches_done, self.state())

    def _callbacks(self, test_ds) -> list:
        from bnn.train.metrics import FlipRatio

        t = self.config.training
        compile_ = "tracing and XLA compilation" if self.xla else "tracing"
        cbs = [cb.FirstStepProgress(f"{self.label}: first train step ({compile_})"),
               self.timer, cb.LearningRateLogger(),
               cb.TestEvaluation(test_ds, t.test_every), self.nonfinite]
        flips = FlipRatio(every="epoch") if self.precision == "binary" else None
        if flips is not None:
            cbs.append(flips)
        if self.chief:
            self.board = Board(self.dir, self.model, t.histograms, t.histogram_freq, flips)
            values = {**hparams(self.config), "model.precision": self.precision,
                      "training.xla": self.xla}
            self.board.start(values, main_hparams(values, self.config.model.options),
                             trial=f"{self.config.name}/{self.label}")
        cbs += [_EpochCheckpoint(self), self.signals]
        return cbs

    def run(self) -> TwinResult:
        epochs = self.config.training.epochs
        latest = self.checkpoints.latest() if self.resume else None
        start, self.skipped = 0, 0
        if latest:
            start, path, state = latest
            self.skipped = int(state.get("batches_done", 0))
            self.history = list(state.get("history", []))
            self.step_medians = list(state.get("step_medians", []))
            self.wall_before = float(state.get("wall_seconds", 0.0))
        data = self._datasets(start, epochs)
        if latest and "xla" in state:
            self.xla, self.xla_reason = bool(state["xla"]), str(state.get("xla_reason", ""))
        else:
            self.xla, self.xla_reason = self._choose_xla(data)
        with self.strategy.scope():
            self.model = _load_checkpoint(path) if latest else build_model(
                self.config, self.precision, data, self.xla)
            self.fit_model = self._fit_model(data)
        if start < epochs and self.verbose:
            where = f" from epoch {start + 1}" if latest else ""
            print(f"bnn: training {self.precision} {self.config.model.name} on "
                  f"{self.config.dataset.name}{where} -> {self.dir}", flush=True)
        callbacks = self._callbacks(data.test)
        try:
            if self.skipped and start < epochs:
                # finish the epoch a signal cut short: the same batches, minus those done
                rest = self._datasets(start, start + 1)
                self._fit(rest.train.skip(self.skipped), start, start + 1,
                          rest.steps_per_epoch - self.skipped, data, callbacks)
                self.skipped = 0
                start += 1
                data = self._datasets(start, epochs)
            if start < epochs and not self._stopped():
                self._fit(data.train, start, epochs, data.steps_per_epoch, data, callbacks)
            return self._finish(data)
        finally:
            if self.board is not None:
                self.board.close()

    def _choose_xla(self, data: data_lib.Datasets) -> tuple[bool, str]:
        """Whether XLA compiles this twin's train step, and why: as ``training.xla`` says, or,
        for ``auto``, whichever of the two is faster for this model on this machine, timed on a
        few steps of each (a model built for the timing only; the random state is set back
        afterwards, so the twin starts from the same weights either way)."""
        t = self.config.training
        if t.xla != "auto":
            return bool(t.xla), "training.xla in the experiment"
        if t.deterministic:
            return False, "training.deterministic: Keras trains without XLA under op determinism"
        if t.distribute != "none":
            gpu = dispatch.has_gpu() and t.device != "cpu"
            return gpu, f"training.distribute on {'GPUs' if gpu else 'CPUs'}"
        with progress.phase(f"{self.label}: timing the train step with and without XLA"):
            times = {xla: self._step_ms(data, xla) for xla in (False, True)}
        keras.utils.set_random_seed(t.seed)
        return times[True] < times[False], (f"timed: {times[False]:.1f} ms per step without "
                                            f"XLA, {times[True]:.1f} ms with it")

    def _step_ms(self, data: data_lib.Datasets, xla: bool, warm: int = 5, timed: int = 10
                 ) -> float:
        """The median train step of this twin with or without XLA, in ms, after ``warm``
        steps (tracing, compilation), on the first batches of the training data."""
        with self.strategy.scope():
            model = build_model(self.config, self.precision, data, xla)
            fit = self._fit_model(data, model, xla)
        timer = cb.StepTimer(skip=warm)
        fit.fit(data.train.repeat().take(warm + timed), epochs=1, steps_per_epoch=warm + timed,
                callbacks=[timer], verbose=0, shuffle=False)
        return timer.epoch_medians[-1]

    def _fit_model(self, data: data_lib.Datasets, model: keras.Model | None = None,
                   xla: bool | None = None) -> keras.Model:
        """The student (``model``, default the twin's) itself, or a :class:`FitModel` around it
        for distillation (binary twins), device-side batches or test-time augmentation, compiled
        with the student's optimizer, by XLA where ``xla`` (default the twin's choice)."""
        t = self.config.training
        model = self.model if model is None else model
        xla = self.xla if xla is None else xla
        distill = t.distill if self.precision == "binary" else None
        if (distill is None and data.prepare is None and not t.test_time_flip
                and not t.test_time_translate):
            return model
        shape = tuple(data.input_shape)
        if t.test_time_translate and (len(shape) != 3 or t.test_time_translate >= min(shape[:2])):
            raise TrainingError(f"training.test_time_translate={t.test_time_translate} needs "
                                f"images larger than that, but the inputs have shape {shape}; "
                                "set it to 0 or a few pixels")
        if data.prepare is not None and t.distribute != "none":
            raise TrainingError("dataset.on_device trains on one device; set "
                                "training.distribute=none or dataset.on_device=false")
        teacher = None if distill is None else distill_lib.load_teacher(
            distill.teacher, self.run_dir, data.input_shape, data.num_classes)
        fit = FitModel(model, teacher,
                       temperature=distill.temperature if distill else 1.0,
                       weight=distill.weight if distill else 0.0,
                       prepare=data.prepare, test_time_flip=t.test_time_flip,
                       test_time_translate=t.test_time_translate)
        fit.compile(optimizer=model.optimizer, loss=model.loss,
                    metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
                    jit_compile=xla)
        return fit

    def _stopped(self) -> bool:
        return bool(self.nonfinite.where) or self.signals.received is not None

    def _fit(self, train, initial_epoch, epochs, steps, data, callbacks) -> None:
        self.fit_model.fit(train, epochs=epochs, initial_epoch=initial_epoch,
                           steps_per_epoch=steps, validation_data=data.validation,
                           callbacks=callbacks, verbose=self.verbose, shuffle=False)

    def _finish(self, data: data_lib.Datasets) -> TwinResult:
        if self.nonfinite.where:
            epoch, step, loss = self.nonfinite.where
            last = self.checkpoints.epochs()
            kept = (f"the last good checkpoint is {self.checkpoints.model_path(last[-1])}"
                    if last else "no checkpoint was written")
            raise TrainingError(
                f"{self.precision}: the loss became {loss} at epoch {epoch}, step {step}; {kept}. "
                "Lower optimizer.learning_rate or check the data")
        if self.signals.received is not None:
            raise Interrupted(
                f"{self.precision}: stopped by signal {self.signals.received} during epoch "
                f"{self.signals.epoch + 1} and saved {self.checkpoints.interrupted_model_path}; "
                "continue with --resume")
        result = self._final_test(data)
        medians = self.step_medians + self.timer.epoch_medians
        median_ms = float(np.median(medians)) if medians else float("nan")
        tests = [h["test_accuracy"] for h in self.history if "test_accuracy" in h]
        accuracy = float(result["accuracy"])
        twin = TwinResult(
            precision=self.precision,
            test_accuracy=accuracy,
            best_test_accuracy=max(tests + [accuracy]),
            test_loss=float(result["loss"]),
            median_step_ms=median_ms,
            examples_per_second=(self.config.training.batch_size / median_ms * 1e3
                                 if math.isfinite(median_ms) else float("nan")),
            params=int(self.model.count_params()),
            epochs=self.config.training.epochs,
            wall_seconds=self.wall_before + time.perf_counter() - self.started,
            xla=self.xla,
            xla_reason=self.xla_reason,
            history=self.history,
        )
        if self.chief:
            self._write_final(twin)
        if self.board is not None:
            self.board.final(twin.epochs, twin.test_accuracy, twin.test_loss)
        return twin

    def _final_test(self, data: data_lib.Datasets) -> dict[str, float]:
        """Test loss and accuracy of the trained model: those of the last epoch when it was
        evaluated (the model has not changed since), else a new evaluation."""
        last = self.history[-1] if len(self.history) == self.config.training.epochs else {}
        if "test_accuracy" in last and "test_loss" in last:
            return {"accuracy": last["test_accuracy"], "loss": last["test_loss"]}
        return self.fit_model.evaluate(data.test, verbose=0, return_dict=True)

    def _write_final(self, twin: TwinResult) -> None:
        path = self.dir / "model.keras"
        tmp = self.dir / ".model.keras.tmp.keras"
        self.model.save(tmp)
        tmp.replace(path)


def train_twin(config: Config, precision: str, run_dir: Path, data_dir=None,
               resume: bool = False, verbose: int | str = "auto",
               label: str | None = None) -> TwinResult:
    """Trains (or resumes) the ``precision`` twin of ``config`` in ``run_dir/label`` (default
    ``run_dir/precision``). The Keras dtype policy that ``training.mixed_precision`` selects
    holds while the twin trains; the one before it is restored afterwards."""
    if resume and config.training.distribute == "multi_worker":
        raise TrainingError("--resume is not supported with training.distribute=multi_worker "
                            "(only the chief holds checkpoints); start over with --overwrite")
    policy = keras.mixed_precision.global_policy()
    try:
        configure_runtime(config)
        return _Twin(config, precision, Path(run_dir), data_dir, resume, verbose, label).run()
    finally:
        keras.mixed_precision.set_global_policy(policy)
