"""The model that ``fit`` and ``evaluate`` run around a student model, when training needs more
than the student itself: a teacher to distill from, training batches made on the device inside
the train step, or test-time flips.

:class:`FitModel` holds the student (whose weights it trains) and optionally a frozen teacher,
held outside Keras' tracking so that it is neither trained, nor saved, nor counted with the
student. Checkpoints and the final ``model.keras`` are the student alone, compiled with the
optimizer that ``FitModel`` updates, so a run directory reads the same with or without it.
"""

from __future__ import annotations

from typing import Any, Callable

import keras
import tensorflow as tf

from bnn.train.distill import distillation_loss

__all__ = ["FitModel"]


class _Untracked:
    """A box Keras does not look into: what it holds is not a sub-layer of its owner."""

    def __init__(self, value: Any):
        self.value = value


def _shifted(images: tf.Tensor, d: int) -> tf.Tensor:
    """``images`` (N, H, W, C) moved by ``d`` pixels down and right (up and left for ``d < 0``),
    the vacated rows and columns filled by reflecting the image at its border."""
    t = abs(d)
    padded = tf.pad(images, [[0, 0], [t, t], [t, t], [0, 0]], mode="REFLECT")
    start = t - d
    return padded[:, start:start + tf.shape(images)[1], start:start + tf.shape(images)[2]]


class FitModel(keras.Model):
    """``student`` trained with optional distillation, device-side batches and test-time flips.

    Args:
        student: the model being trained; ``FitModel(x)`` is ``student(x)`` in training.
        teacher: a frozen model whose logits the student learns from (see :mod:`bnn.train.distill`):
            the training loss becomes ``loss + weight * (T**2 KL(teacher || student) - hard)``,
            where ``loss`` is the compiled loss (plus any regularization) and ``hard`` the
            compiled loss alone. Validation and test losses stay the compiled loss.
        temperature, weight: ``T`` and ``weight`` above.
        prepare: a function that turns each element of the training dataset into an
            ``(images, labels)`` batch inside the train step (:func:`bnn.train.data.make_datasets`
            with ``on_device=True``).
        test_time_flip: outside training, the logits are the mean of the student's logits for
            each image and for its left-right mirror image.
        test_time_translate: outside training, with ``t > 0`` pixels, each of those views is also
            seen shifted by ``(-t, -t)`` and ``(+t, +t)`` (rows, columns; the vacated border
            filled by reflection), and the logits are the mean over all views (3 per image, 6 with
            flips), the test-time augmentation of airbench.
    """

    def __init__(self, student: keras.Model, teacher: keras.Model | None = None,
                 temperature: float = 1.0, weight: float = 1.0,
                 prepare: Callable[[Any], tuple[tf.Tensor, tf.Tensor]] | None = None,
                 test_time_flip: bool = False, test_time_translate: int = 0, **kwargs):
        super().__init__(name=kwargs.pop("name", f"fit_{student.name}"), **kwargs)
        self.student = student
        self._teacher = _Untracked(teacher)
        self.temperature = float(temperature)
        self.weight = float(weight)
        self._prepare = _Untracked(prepare)
        self.test_time_flip = bool(test_time_flip)
        self.test_time_translate = int(test_time_translate)
        self.built = True

    @property
    def teacher(self) -> keras.Model | None:
        return self._teacher.value

    def call(self, inputs, training=None):
        if training or not (self.test_time_flip or self.test_time_translate):
            return self.student(inputs, training=training)
        views = [inputs, tf.reverse(inputs, axis=[2])] if self.test_time_flip else [inputs]
        t = self.test_time_translate
        if t:
            views += [_shifted(view, d) for view in list(views) for d in (-t, t)]
        return tf.add_n([self.student(v, training=False) for v in views]) / len(views)

    def train_step(self, data):
        if self._prepare.value is not None:
            data = self._prepare.value(data)
        return super().train_step(data)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        loss = super().compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
                                    training=training)
        if not training or self.teacher is None or self.weight == 0.0:
            return loss
        soft = tf.reduce_mean(distillation_loss(y_pred, self.teacher(x, training=False),
                                                self.temperature))
        hard = tf.cast(self.loss(y, y_pred), soft.dtype)
        return loss + tf.cast(self.weight, soft.dtype) * (soft - hard)
