"""Max-pooling that XLA compiles into fast CPU code.

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

from bnn.xla import in_xla_context

__all__ = ["MaxPooling2D", "max_pool_slices"]


def max_pool_slices(x: tf.Tensor, k: int) -> tf.Tensor:
    """``k x k`` max-pooling with stride ``k``, ``"valid"`` padding, of ``x`` ``(batch, h, w,
    c)``, as the maximum of ``k * k`` strided slices. The gradient of each window goes to its
    first maximum in row-major order, the choice of TensorFlow's and XLA's max-pool gradients,
    so values and gradients equal ``tf.nn.max_pool2d(x, k, k, "VALID")``'s. Which slice won is
    found in the forward pass (see the module docstring)."""
    h, w = int(x.shape[1]), int(x.shape[2])
    ho, wo = h // k, w // k

    @tf.custom_gradient
    def pool(x):
        crop = x[:, :ho * k, :wo * k]
        parts = [crop[:, i::k, j::k] for i in range(k) for j in range(k)]
        top = parts[0]
        for part in parts[1:]:
            top = tf.maximum(top, part)
        # First maximal slice of each window; ties go to the lowest index, as MaxPoolGrad's.
        winner = tf.argmax(tf.stack(parts, axis=-1), axis=-1, output_type=tf.int32)

        def grad(dy):
            zero = tf.zeros_like(dy)
            routed = [tf.where(tf.equal(winner, index), dy, zero) for index in range(k * k)]
            rows = [tf.stack(routed[i * k:(i + 1) * k], axis=3) for i in range(k)]
            windows = tf.stack(rows, axis=2)  # (batch, ho, k, wo, k, c)
            full = tf.reshape(windows, [-1, ho * k, wo * k, int(dy.shape[-1])])
            return tf.pad(full, [[0, 0], [0, h - ho * k], [0, w - wo * k], [0, 0]])

        return top, grad

    return pool(x)


@keras.saving.register_keras_serializable(package="bnn")
class MaxPooling2D(keras.layers.MaxPooling2D):
    """``keras.layers.MaxPooling2D`` (same arguments, outputs and gradients) that, under XLA,
    pools non-overlapping square windows by :func:`max_pool_slices`.

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
