"""Larq's ``larq.metrics.FlipRatio`` as a Keras 3 metric."""

from __future__ import annotations

from typing import Sequence

import keras
import numpy as np
import tensorflow as tf

__all__ = ["FlipRatio"]


@keras.saving.register_keras_serializable(package="bnn.larq")
class FlipRatio(keras.metrics.Metric):
    """Mean fraction of entries of a tensor that changed since the previous update.

    Each update compares ``values`` (cast to ``values_dtype``) with the previous update's and
    adds ``changed entries / size`` to a running mean. The first update after construction or
    :meth:`reset_state` only records the values, as Larq's does, so the result is
    ``sum of ratios / (updates - 1)`` (0 before the second update). ``reset_state`` keeps the
    recorded values; layers built by :mod:`bnn.larq.layers` update it with their quantized
    kernel at every training step, and Keras resets it at each epoch start, so the epoch logs
    hold the mean per-step flip ratio of that epoch.

    Example (eager)::

        m = FlipRatio()
        m.update_state((1, 1))  # result 0
        m.update_state((2, 2))  # result 1
        m.update_state((1, 2))  # result 0.75

    Args (Larq's, in Larq's order):
        values_dtype: dtype the values are compared in (Larq: int8).
        name: name of the metric.
        dtype: dtype of the running mean.
        values_shape: (keyword only) shape of the tracked tensor; ``None`` to take it from the
            first update (eager only), or from :meth:`build`.
    """

    def __init__(self, values_dtype: str = "int8", name: str = "flip_ratio", dtype=None, *,
                 values_shape: Sequence[int] | None = None):
        super().__init__(name=name, dtype=dtype)
        self.values_dtype = tf.as_dtype(values_dtype)
        self.total = self.add_variable(shape=(), initializer="zeros", name="total",
                                       aggregation="only_first_replica")
        self.count = self.add_variable(shape=(), initializer="zeros", name="count",
                                       aggregation="only_first_replica")
        self._previous_values = None
        if values_shape is not None:
            self.build(values_shape)

    def build(self, values_shape: Sequence[int]) -> None:
        """Creates the variable that records the previous values."""
        self._size = float(np.prod(values_shape))
        self._previous_values = self.add_variable(shape=tuple(values_shape), initializer="zeros",
                                           dtype=self.values_dtype.name, name="previous_values",
                                           aggregation="only_first_replica")

    def update_state(self, values, sample_weight=None):
        values = tf.cast(values, self.values_dtype)
        if self._previous_values is None:
            self.build(tuple(values.shape))
        unchanged = tf.math.count_nonzero(tf.equal(self._previous_values.value, values))
        ratio = 1.0 - tf.cast(unchanged, self.dtype) / tf.cast(self._size, self.dtype)
        self.total.assign_add(ratio * tf.sign(self.count.value))
        self.count.assign_add(tf.ones((), self.dtype))
        self._previous_values.assign(values)

    def result(self):
        return tf.math.divide_no_nan(self.total.value, self.count.value - 1.0)

    def reset_state(self):
        self.total.assign(tf.zeros((), self.dtype))
        self.count.assign(tf.zeros((), self.dtype))

    def get_config(self) -> dict:
        return {**super().get_config(), "values_dtype": self.values_dtype.name}
