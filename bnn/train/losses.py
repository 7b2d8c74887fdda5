"""Losses on integer class labels and logits (Keras-serializable)."""

from __future__ import annotations

import keras
from keras import ops

from bnn.catalog import LOSSES

__all__ = ["SparseSquaredHinge", "SparseCrossEntropy", "LOSSES", "get"]


@keras.saving.register_keras_serializable(package="bnn")
class SparseSquaredHinge(keras.losses.Loss):
    """BinaryNet's loss: ``mean_k(max(0, 1 - t_k * z_k)^2)`` with targets ``t = 2*onehot(y) - 1``
    (±1) and logits ``z``."""

    def __init__(self, num_classes: int, name: str = "squared_hinge", **kwargs):
        super().__init__(name=name, **kwargs)
        self.num_classes = int(num_classes)

    def call(self, y_true, y_pred):
        targets = 2.0 * ops.one_hot(ops.reshape(ops.cast(y_true, "int32"), (-1,)),
                                    self.num_classes, dtype=y_pred.dtype) - 1.0
        return ops.mean(ops.square(ops.relu(1.0 - targets * y_pred)), axis=-1)

    def get_config(self) -> dict:
        return {**super().get_config(), "num_classes": self.num_classes}


@keras.saving.register_keras_serializable(package="bnn")
class SparseCrossEntropy(keras.losses.Loss):
    """Softmax cross-entropy from logits on integer labels, with optional label smoothing
    ``t = (1 - s) * onehot(y) + s / num_classes``."""

    def __init__(self, num_classes: int, label_smoothing: float = 0.0,
                 name: str = "crossentropy", **kwargs):
        super().__init__(name=name, **kwargs)
        self.num_classes = int(num_classes)
        self.label_smoothing = float(label_smoothing)

    def call(self, y_true, y_pred):
        labels = ops.reshape(ops.cast(y_true, "int32"), (-1,))
        if self.label_smoothing == 0.0:
            return ops.sparse_categorical_crossentropy(labels, y_pred, from_logits=True)
        s = self.label_smoothing
        targets = (1.0 - s) * ops.one_hot(labels, self.num_classes, dtype=y_pred.dtype) + (
            s / self.num_classes)
        return ops.categorical_crossentropy(targets, y_pred, from_logits=True)

    def get_config(self) -> dict:
        return {**super().get_config(), "num_classes": self.num_classes,
                "label_smoothing": self.label_smoothing}


def get(name: str, num_classes: int, label_smoothing: float = 0.0) -> keras.losses.Loss:
    """The loss called ``name`` (one of :data:`LOSSES`)."""
    if name == "crossentropy":
        return SparseCrossEntropy(num_classes, label_smoothing)
    if name == "squared_hinge":
        return SparseSquaredHinge(num_classes)
    raise ValueError(f"unknown loss {name!r}; known losses: {', '.join(LOSSES)}")
