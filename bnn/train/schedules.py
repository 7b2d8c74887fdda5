"""Learning-rate schedules defined per epoch and evaluated per step (Keras-serializable)."""

from __future__ import annotations

import math

import keras
from keras import ops

from bnn.catalog import SCHEDULES

__all__ = ["EpochSchedule", "SCHEDULES"]


@keras.saving.register_keras_serializable(package="bnn")
class EpochSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Learning rate as a function of the (fractional) epoch ``e = step / steps_per_epoch``.

    * ``constant``: ``lr``
    * ``cosine``: ``lr * (alpha + (1 - alpha) * (1 + cos(pi * e / epochs)) / 2)``
    * ``exponential``: ``lr * decay_rate ** floor(e)`` (BinaryNet decays once per epoch)

    with a linear warm-up ``lr * (step + 1) / (warmup_epochs * steps_per_epoch)`` over the first
    ``warmup_epochs`` epochs, when set.
    """

    def __init__(self, name: str, learning_rate: float, steps_per_epoch: int, epochs: int,
                 decay_rate: float = 0.96, alpha: float = 0.0, warmup_epochs: int = 0):
        if name not in SCHEDULES:
            raise ValueError(f"unknown schedule {name!r}; known schedules: {', '.join(SCHEDULES)}")
        self.name = name
        self.learning_rate = float(learning_rate)
        self.steps_per_epoch = int(steps_per_epoch)
        self.epochs = int(epochs)
        self.decay_rate = float(decay_rate)
        self.alpha = float(alpha)
        self.warmup_epochs = int(warmup_epochs)

    def __call__(self, step):
        step = ops.cast(step, "float32")
        epoch = step / self.steps_per_epoch
        lr = ops.convert_to_tensor(self.learning_rate, "float32")
        if self.name == "cosine":
            progress = ops.minimum(epoch / self.epochs, 1.0)
            lr = lr * (self.alpha + (1 - self.alpha) * 0.5 * (1 + ops.cos(math.pi * progress)))
        elif self.name == "exponential":
            lr = lr * ops.power(self.decay_rate, ops.floor(epoch))
        if self.warmup_epochs > 0:
            warmup_steps = float(self.warmup_epochs * self.steps_per_epoch)
            lr = lr * ops.minimum(1.0, (step + 1.0) / warmup_steps)
        return lr

    def get_config(self) -> dict:
        return {"name": self.name, "learning_rate": self.learning_rate,
                "steps_per_epoch": self.steps_per_epoch, "epochs": self.epochs,
                "decay_rate": self.decay_rate, "alpha": self.alpha,
                "warmup_epochs": self.warmup_epochs}


def decay_rate_for(learning_rate: float, final_learning_rate: float, epochs: int) -> float:
    """The per-epoch factor that takes ``learning_rate`` to ``final_learning_rate`` at the last
    epoch: ``(final / initial) ** (1 / (epochs - 1))`` (BinaryNet's LR_start -> LR_fin)."""
    if epochs <= 1:
        return 1.0
    return (final_learning_rate / learning_rate) ** (1.0 / (epochs - 1))
