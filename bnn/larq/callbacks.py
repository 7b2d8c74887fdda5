"""Larq's ``larq.callbacks``: :class:`HyperparameterScheduler`, which sets an optimizer's
hyperparameter (Bop's ``gamma`` or ``threshold``, a learning rate) from a schedule."""

from __future__ import annotations

from typing import Callable

import keras
import numpy as np
import tensorflow as tf

__all__ = ["HyperparameterScheduler"]


class HyperparameterScheduler(keras.callbacks.Callback):
    """Sets ``optimizer.<hyperparameter>`` to ``schedule(t, current value)`` (or ``schedule(t)``)
    at the start of each epoch (``t`` the epoch index, from 0) or of each train step (``t`` the
    optimizer's step count), as Larq's::

        bop = lq.optimizers.Bop(threshold=1e-6, gamma=1e-3)
        optimizer = lq.optimizers.CaseOptimizer((lq.optimizers.Bop.is_binary_variable, bop),
                                                default_optimizer=keras.optimizers.Adam(0.01))
        callbacks = [HyperparameterScheduler(lambda t: 1e-3 * 0.1 ** (t // 30), "gamma", bop)]

    The hyperparameter must be held in a variable (Bop's ``gamma`` and ``threshold``, a Keras
    optimizer's ``learning_rate``; ``"lr"`` names ``learning_rate`` where the optimizer has no
    ``lr``, as tf-keras' optimizers had): the value set is the one the next train step reads,
    under ``tf.function`` and XLA too. At each epoch's end the value goes into the epoch's logs
    under ``log_name``.

    Args:
        schedule: ``schedule(t, value) -> new value`` or ``schedule(t) -> new value``.
        hyperparameter: the name of the optimizer's attribute to set.
        optimizer: the optimizer that has it; the model's optimizer when None.
        update_freq: ``"epoch"`` or ``"step"``.
        verbose: 0: quiet; 1: print each new value.
        log_name: the name to log the value under (default: ``hyperparameter``); give one per
            scheduler when several schedule the same hyperparameter of different optimizers.

    Raises:
        ValueError: for an ``update_freq`` other than ``"epoch"`` and ``"step"`` (at
            construction), and when training starts for an optimizer without the
            hyperparameter.
        TypeError: for a schedule that is not callable, and when training starts for a
            hyperparameter that a schedule object or a Python number holds, which cannot be set
            between steps.
    """

    def __init__(self, schedule: Callable, hyperparameter: str,
                 optimizer: keras.optimizers.Optimizer | None = None, update_freq: str = "epoch",
                 verbose: int = 0, log_name: str | None = None):
        super().__init__()
        if update_freq not in ("epoch", "step"):
            raise ValueError("HyperparameterScheduler.update_freq can only be 'step' or 'epoch'."
                             f" Received value '{update_freq}'")
        if not callable(schedule):
            raise TypeError(f"HyperparameterScheduler schedule must be callable, got "
                            f"{type(schedule).__name__}; pass a function of the epoch or step "
                            "index (and the current value)")
        self.schedule = schedule
        self.hyperparameter = hyperparameter
        self.optimizer = optimizer
        self.update_freq = update_freq
        self.verbose = verbose
        self.log_name = log_name or hyperparameter

    def set_model(self, model: keras.Model) -> None:
        super().set_model(model)
        if self.optimizer is None:
            self.optimizer = getattr(model, "optimizer", None)
        if self.optimizer is None:
            raise ValueError("HyperparameterScheduler has no optimizer: the model is not "
                             "compiled; compile it, or pass optimizer=")
        self._variable()  # checks the hyperparameter before the first step

    def _attribute(self) -> str:
        if not hasattr(self.optimizer, self.hyperparameter):
            if self.hyperparameter == "lr" and hasattr(self.optimizer, "learning_rate"):
                return "learning_rate"
            raise ValueError(f'Optimizer must have a "{self.hyperparameter}" attribute: '
                             f"{type(self.optimizer).__name__} has none; name one it has "
                             "(learning_rate, or Bop's gamma or threshold)")
        return self.hyperparameter

    def _variable(self):
        """The variable that holds the hyperparameter (read anew each time, as Larq does)."""
        name = self._attribute()
        held = getattr(self.optimizer, name)
        if isinstance(held, (tf.Variable, keras.Variable)):
            return held
        owner = type(self.optimizer).__name__
        if name == "learning_rate" or isinstance(
                held, keras.optimizers.schedules.LearningRateSchedule):
            raise TypeError(f"{owner}'s {name} is a schedule, which HyperparameterScheduler "
                            f"cannot set; create the optimizer with a float {name} to schedule "
                            "it with this callback")
        raise TypeError(f"{owner}'s {name} is {held!r}, not a variable: a compiled train step "
                        "keeps the value it was traced with, so HyperparameterScheduler cannot "
                        "change it; schedule a hyperparameter held in a variable "
                        "(learning_rate, or Bop's gamma or threshold)")

    def set_hyperparameter(self, t: int):
        """Sets the hyperparameter to the schedule's value at ``t``; returns its variable."""
        variable = self._variable()
        try:
            value = self.schedule(t, _value(variable))
        except TypeError:  # a schedule of t alone (Larq's and Keras' convention)
            value = self.schedule(t)
        number = np.asarray(value)
        if number.shape != () or number.dtype.kind not in "iuf":
            raise ValueError(f"HyperparameterScheduler's schedule gave {value!r} for "
                             f"{self.log_name} at {self.update_freq} {t}; it must return a "
                             "number")
        variable.assign(number.item())
        return variable

    def on_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        if self.update_freq != "step":
            return
        # the optimizer's step count: ``batch`` restarts at 0 every epoch
        step = int(keras.ops.convert_to_numpy(self.optimizer.iterations))
        variable = self.set_hyperparameter(step)
        if self.verbose > 0:
            print(f"Batch {step}: {self.log_name} is now {_value(variable)}.")

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        if self.update_freq != "epoch":
            return
        variable = self.set_hyperparameter(epoch)
        if self.verbose > 0:
            print(f"Epoch {epoch}: {self.log_name} is now {_value(variable)}.")

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if logs is not None:
            logs[self.log_name] = _value(self._variable())


def _value(variable) -> np.generic:
    """A scalar variable's value as a numpy scalar (``np.float32``), as Larq reads it."""
    return np.asarray(keras.ops.convert_to_numpy(variable))[()]
