"""``MaxPooling2D`` that XLA compiles into fast CPU code.

XLA lowers ``tf.nn.max_pool`` with its gradient into a windowed reduction that also tracks the
position of each maximum, which on a CPU costs several times the pooling itself. Under XLA the
layer pools as the maximum of strided slices instead (:func:`bnn.ops.fused.max_pool_slices`),
with the same values and gradients; outside XLA TensorFlow's own kernel is the faster one, so
the layer keeps it there. Measurements: docs/speed.md, "Max-pooling under XLA".
"""

from __future__ import annotations

import keras
import tensorflow as tf

from bnn.ops.fused import max_pool_slices
from bnn.ops.xla import in_xla_context

__all__ = ["MaxPooling2D"]


@keras.saving.register_keras_serializable(package="bnn")
class MaxPooling2D(keras.layers.MaxPooling2D):
    """``keras.layers.MaxPooling2D`` (same arguments, outputs and gradients) that, under XLA,
    pools non-overlapping square windows by :func:`bnn.ops.fused.max_pool_slices`.

    The fast path applies to ``pool_size == strides == (k, k)``, ``padding="valid"``,
    channels-last data with known height and width; anything else is Keras' layer unchanged.
    """

    def _sliceable(self, x) -> int | None:
        k = tuple(self.pool_size)
        if (k[0] != k[1] or tuple(self.strides) != k or self.padding != "valid"
                or self.data_format != "channels_last" or x.shape.rank != 4
                or x.shape[1] is None or x.shape[2] is None or x.shape[-1] is None):
            return None
        return int(k[0])

    def call(self, inputs):
        k = self._sliceable(inputs) if isinstance(inputs, tf.Tensor) else None
        if k is not None and in_xla_context():
            return max_pool_slices(inputs, k)
        return super().call(inputs)
