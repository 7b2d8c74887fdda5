"""``MaxPooling2D`` that XLA compiles into fast CPU code (:func:`bnn.ops.fused.max_pool_slices`).

XLA lowers ``tf.nn.max_pool`` with its gradient into a windowed reduction that also tracks the
position of each maximum, which on a CPU costs several times the pooling itself: for VGG-small's
first pool (50 x 32 x 32 x 128, 2x2) the forward and backward pass together took 51 ms under
XLA, against 8 ms for the same pooling written as the maximum of ``k * k`` strided slices, whose
gradient goes to the first maximal slice of each window in row-major order, as
``MaxPoolGrad`` routes it (ties, which integer-valued binary pre-activations make common,
included). Outside XLA, TensorFlow's own max-pool kernel is the faster one, so the layer uses the
slices only while it is being compiled by XLA (``jit_compile=True``).

The forward pass also records which slice won each window, as an argmax over the stacked slices.
XLA keeps the result of a reduction in memory, so the backward pass reads one index per window
instead of recomputing its input. Comparing the slices with the maximum there instead let XLA
fuse the pool's whole input into the gradient: after an xor-popcount convolution that means
re-reading every partial popcount sum, and it cost VGG-small's binary train step about 5%.
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
