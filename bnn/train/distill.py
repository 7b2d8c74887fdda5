"""Distillation from a real-valued teacher: the loss, and finding the teacher.

A binary network learns faster from a trained real-valued network's output distribution than
from labels alone (ReActNet's distributional loss, Liu et al. 2020). With
``training.distill: {teacher, temperature, weight}`` the binary twin minimizes

    (1 - weight) * hard_loss(y, s)  +  weight * T**2 * KL(softmax(t / T) || softmax(s / T))

per example, for student logits ``s``, teacher logits ``t`` and temperature ``T`` (the ``T**2``
keeps the gradient's scale independent of ``T``, Hinton et al. 2015). ``weight=1`` and ``T=1`` is
ReActNet's loss: the cross-entropy to the teacher's distribution, less its constant entropy.

The teacher is ``float_twin`` (the run's own float twin, ``RUN_DIR/float/model.keras``, which
``bnn compare`` trains first), another run directory (its ``float/model.keras``) or a ``.keras``
file. It runs in inference mode and is never trained.
"""

from __future__ import annotations

from pathlib import Path

import keras
import tensorflow as tf

from bnn.errors import TrainingError
from bnn.train.twins import teacher_path

__all__ = ["distillation_loss", "teacher_path", "load_teacher"]


def distillation_loss(student_logits: tf.Tensor, teacher_logits: tf.Tensor,
                      temperature: float = 1.0) -> tf.Tensor:
    r"""Per-example :math:`T^2\,\mathrm{KL}(p_t \| p_s) = T^2 \sum_k p_{t,k}
    (\log p_{t,k} - \log p_{s,k})` with :math:`p = \mathrm{softmax}(\mathrm{logits} / T)`, in
    float32; no gradient flows into the teacher's logits."""
    t = tf.cast(temperature, tf.float32)
    log_s = tf.nn.log_softmax(tf.cast(student_logits, tf.float32) / t, axis=-1)
    log_t = tf.nn.log_softmax(tf.stop_gradient(tf.cast(teacher_logits, tf.float32)) / t, axis=-1)
    return t * t * tf.reduce_sum(tf.exp(log_t) * (log_t - log_s), axis=-1)


def load_teacher(teacher: str, run_dir: Path, input_shape: tuple[int, ...],
                 num_classes: int) -> keras.Model:
    """The frozen teacher model, checked to map ``input_shape`` images to ``num_classes`` logits.

    Raises:
        TrainingError: for a missing or unreadable file, or a model of the wrong shape.
    """
    path = teacher_path(teacher, run_dir)
    try:
        model = keras.models.load_model(path, compile=False)
    except Exception as error:  # noqa: BLE001 - any failure to read is a damaged file
        raise TrainingError(f"training.distill.teacher: {path} cannot be read as a Keras model "
                            f"({type(error).__name__}: {str(error).splitlines()[0][:160]}); "
                            "point it at a model.keras that bnn wrote") from None
    inputs, outputs = tuple(model.input_shape[1:]), tuple(model.output_shape[1:])
    if inputs != tuple(input_shape) or outputs != (num_classes,):
        raise TrainingError(f"training.distill.teacher: {path} maps {inputs} inputs to {outputs} "
                            f"outputs, but the student maps {tuple(input_shape)} to "
                            f"({num_classes},); use a teacher trained on the same dataset")
    model.trainable = False
    return model
