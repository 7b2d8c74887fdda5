"""Batch normalization that trains on TensorFlow's fused kernel outside XLA and on a flat view
of its input under XLA.

Keras 3's ``BatchNormalization`` computes its batch statistics, normalization and gradients as a
dozen separate TensorFlow ops, each a pass over the activations; outside XLA the layer runs
TensorFlow's fused batch-norm kernel instead, one pass forward and one backward. Under XLA the
same ops are fused, but on a CPU XLA compiles a reduction of a 4-D tensor over its first three
axes with an elementwise operand into a slow windowed loop, so the layer normalizes the input
viewed as a matrix (one row per position), with the same results to float32 rounding.
Measurements: docs/speed.md, "Batch normalization: the fused kernel, and a matrix view under
XLA".
"""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import ops

from bnn.ops.xla import in_xla_context

__all__ = ["BatchNormalization"]


@keras.saving.register_keras_serializable(package="bnn")
class BatchNormalization(keras.layers.BatchNormalization):
    """``keras.layers.BatchNormalization`` (same arguments, variables, statistics and moving
    averages) whose training step, outside XLA, is one ``FusedBatchNormV3`` kernel forward and
    one backward, and under XLA runs on the input viewed as a matrix (one row per position).

    The fused path applies in training to float32 or bfloat16 (a ``mixed_bfloat16`` policy)
    channels-last 4-D inputs, and to 2-D ones (a dense layer's outputs, seen by the kernel as
    ``(batch, 1, 1, channels)``), without a mask, ``renorm`` or ``synchronized``; its statistics
    and scale are float32 either way, as in Keras' layer. Inference on bfloat16 4-D inputs
    (outside XLA) is one ``FusedBatchNormV3`` kernel too. The XLA path applies in training to
    inputs of rank 3 or more normalized over their last axis, without a mask, ``renorm`` or ``synchronized``. Inference
    and everything else is Keras' layer unchanged (so a float32 model predicts, and exports,
    exactly as with Keras' layer). The moving variance is updated with the biased batch
    variance, as Keras does (the kernel reports the unbiased one; it is scaled back by
    ``(n - 1) / n``). Outputs and gradients equal Keras' to float32 rounding.
    """

    def _plain_training(self, inputs, training, mask) -> bool:
        """A training step without a mask, ``renorm`` or ``synchronized``, on a tensor."""
        return (bool(training) and self.trainable and mask is None and not self.renorm
                and not self.synchronized and isinstance(inputs, tf.Tensor))

    def _fused_applies(self, inputs, training, mask) -> bool:
        rank = inputs.shape.rank if isinstance(inputs, tf.Tensor) else None
        return (self._plain_training(inputs, training, mask)
                and rank in (2, 4) and self.axis in (-1, rank - 1)
                and inputs.dtype in (tf.float32, tf.bfloat16)
                and self.moving_mean.dtype == "float32"
                and self.compute_dtype == inputs.dtype.name and not in_xla_context())

    def _fused_inference_applies(self, inputs, training, mask) -> bool:
        """Inference on bfloat16 channels-last 4-D inputs outside XLA: TensorFlow's bfloat16
        elementwise kernels are slow on CPUs, and Keras' layer runs five of them."""
        return (not training and mask is None and isinstance(inputs, tf.Tensor)
                and inputs.shape.rank == 4 and self.axis in (-1, 3)
                and inputs.dtype == tf.bfloat16 and self.compute_dtype == "bfloat16"
                and self.moving_mean.dtype == "float32" and not in_xla_context())

    def _call_fused_inference(self, inputs):
        """``(x - moving_mean) / sqrt(moving_variance + epsilon) * gamma + beta`` in one
        ``FusedBatchNormV3`` kernel (statistics and scale in float32)."""
        channels = int(inputs.shape[-1])
        gamma = self.gamma if self.scale else tf.ones([channels])
        beta = self.beta if self.center else tf.zeros([channels])
        outputs, *_ = tf.raw_ops.FusedBatchNormV3(
            x=inputs, scale=tf.convert_to_tensor(gamma), offset=tf.convert_to_tensor(beta),
            mean=tf.convert_to_tensor(self.moving_mean),
            variance=tf.convert_to_tensor(self.moving_variance), epsilon=self.epsilon,
            data_format="NHWC", is_training=False)
        return outputs

    def _flat_applies(self, inputs, training, mask) -> bool:
        return (self._plain_training(inputs, training, mask)
                and inputs.shape.rank is not None and inputs.shape.rank >= 3
                and self.axis in (-1, inputs.shape.rank - 1)
                and inputs.shape[-1] is not None and in_xla_context())

    def _call_flat(self, inputs):
        """Keras' training step on ``inputs`` viewed as ``(positions, channels)``."""
        channels = int(inputs.shape[-1])
        compute_dtype = keras.backend.result_type(inputs.dtype, "float32")
        x = tf.reshape(ops.cast(inputs, compute_dtype), [-1, channels])
        mean, variance = ops.moments(x, axes=[0])
        momentum = self.momentum
        self.moving_mean.assign(
            ops.cast(self.moving_mean, compute_dtype) * momentum + mean * (1.0 - momentum))
        self.moving_variance.assign(
            ops.cast(self.moving_variance, compute_dtype) * momentum
            + variance * (1.0 - momentum))
        gamma = ops.cast(self.gamma, compute_dtype) if self.scale else None
        beta = ops.cast(self.beta, compute_dtype) if self.center else None
        outputs = ops.batch_normalization(x, mean=mean, variance=variance, axis=-1, offset=beta,
                                          scale=gamma, epsilon=self.epsilon)
        return ops.cast(tf.reshape(outputs, tf.shape(inputs)), self.compute_dtype)

    def call(self, inputs, training=None, mask=None):
        if self._flat_applies(inputs, training, mask):
            return self._call_flat(inputs)
        if self._fused_inference_applies(inputs, training, mask):
            return self._call_fused_inference(inputs)
        if not self._fused_applies(inputs, training, mask):
            return super().call(inputs, training=training, mask=mask)
        channels = int(inputs.shape[-1])
        gamma = self.gamma if self.scale else tf.ones([channels])
        beta = self.beta if self.center else tf.zeros([channels])
        empty = tf.zeros([0])
        # a dense layer's (batch, channels) as the kernel's (batch, 1, 1, channels)
        images = inputs if inputs.shape.rank == 4 else tf.reshape(inputs, [-1, 1, 1, channels])
        outputs, mean, unbiased, _, _, _ = tf.raw_ops.FusedBatchNormV3(
            x=images, scale=tf.convert_to_tensor(gamma), offset=tf.convert_to_tensor(beta),
            mean=empty, variance=empty, epsilon=self.epsilon, data_format="NHWC",
            is_training=True)
        if inputs.shape.rank != 4:
            outputs = tf.reshape(outputs, tf.shape(inputs))
        count = tf.cast(tf.size(inputs) // channels, tf.float32)  # values per channel
        # the biased variance; one value per channel has variance 0 (the kernel's is not finite)
        variance = tf.where(count > 1.0, unbiased * ((count - 1.0) / count),
                            tf.zeros_like(unbiased))
        momentum = self.momentum
        self.moving_mean.assign(self.moving_mean * momentum + mean * (1.0 - momentum))
        self.moving_variance.assign(
            self.moving_variance * momentum + variance * (1.0 - momentum))
        return outputs
