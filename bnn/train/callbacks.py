"""Keras callbacks the trainer uses: step timing, learning-rate and test-set logging, stopping
on a non-finite loss or a signal, a progress line for the first step."""

from __future__ import annotations

import math
import signal
import time

import keras
import numpy as np

from bnn import progress

__all__ = ["StepTimer", "LearningRateLogger", "TestEvaluation", "NonFiniteStop", "SignalStop",
           "FirstStepProgress"]


class FirstStepProgress(keras.callbacks.Callback):
    """A :mod:`bnn.progress` line for a ``fit``'s first train step, where TensorFlow traces the
    step and, with ``jit_compile``, XLA compiles it: seconds in which nothing else moves."""

    def __init__(self, what: str):
        super().__init__()
        self.phase = progress.Phase(what)
        self.done = False

    def on_train_batch_begin(self, batch, logs=None):
        if not self.done:
            self.phase.start()

    def on_train_batch_end(self, batch, logs=None):
        if not self.done:
            self.done = True
            self.phase.stop()

    def on_train_end(self, logs=None):
        self.phase.stop(report=False)  # a fit stopped inside its first step


class StepTimer(keras.callbacks.Callback):
    """Wall time of each train step (ms), from batch begin to batch end. Keras converts the
    batch logs to numbers before ``on_train_batch_end``, which waits for the step to finish.

    The first ``skip`` steps of the process (tracing and compilation) are not counted. Adds
    ``step_time_ms`` (median of the epoch) to the epoch logs.
    """

    def __init__(self, skip: int = 3):
        super().__init__()
        self.skip = skip
        self.seen = 0
        self.epoch_times: list[float] = []
        self.epoch_medians: list[float] = []
        self._start = 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch_times = []

    def on_train_batch_begin(self, batch, logs=None):
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        elapsed = (time.perf_counter() - self._start) * 1e3
        self.seen += 1
        if self.seen > self.skip:
            self.epoch_times.append(elapsed)

    def on_epoch_end(self, epoch, logs=None):
        if self.epoch_times and logs is not None:
            median = float(np.median(self.epoch_times))
            self.epoch_medians.append(median)
            logs["step_time_ms"] = median


class LearningRateLogger(keras.callbacks.Callback):
    """Adds ``learning_rate`` to the epoch logs: the rate the epoch's last step used."""

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            return
        optimizer = self.model.optimizer
        schedule = getattr(optimizer, "_learning_rate", None)
        if isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
            value = schedule(max(int(optimizer.iterations.numpy()) - 1, 0))
        else:
            value = optimizer.learning_rate
        logs["learning_rate"] = float(keras.ops.convert_to_numpy(value))


class TestEvaluation(keras.callbacks.Callback):
    """Evaluates the test set after every ``every``-th epoch (never when ``every`` is 0); adds
    ``test_loss`` and ``test_accuracy`` to those epochs' logs."""

    def __init__(self, dataset, every: int = 1):
        super().__init__()
        self.dataset = dataset
        self.every = int(every)

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or self.model.stop_training or not self.every or (epoch + 1) % self.every:
            return
        result = self.model.evaluate(self.dataset, verbose=0, return_dict=True)
        logs["test_loss"] = float(result["loss"])
        logs["test_accuracy"] = float(result["accuracy"])


class NonFiniteStop(keras.callbacks.Callback):
    """Stops training at the first batch whose loss is NaN or infinite, remembering where."""

    def __init__(self):
        super().__init__()
        self.where: tuple[int, int, float] | None = None
        self._epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)) and self.where is None:
            self.where = (self._epoch + 1, batch + 1, float(loss))
            self.model.stop_training = True


class SignalStop(keras.callbacks.Callback):
    """Turns SIGINT and SIGTERM into a stop at the end of the current batch, so the trainer can
    save before exiting. Remembers the epoch and the number of batches done in it."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        super().__init__()
        self.received: int | None = None
        self.epoch = 0
        self.batches_done = 0
        self._previous = {}

    def _handle(self, signum, frame):
        self.received = signum
        if self.model is not None:
            self.model.stop_training = True

    def on_train_begin(self, logs=None):
        for sig in self.SIGNALS:
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: leave signals alone
                pass

    def on_train_end(self, logs=None):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch, self.batches_done = epoch, 0

    def on_train_batch_end(self, batch, logs=None):
        self.batches_done = batch + 1
