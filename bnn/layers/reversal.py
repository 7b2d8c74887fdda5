"""``GradientReversal``: the layer of :func:`bnn.ops.gradients.reverse_gradient`."""

from __future__ import annotations

import keras

from bnn.ops.gradients import reverse_gradient

__all__ = ["GradientReversal"]


@keras.saving.register_keras_serializable(package="bnn")
class GradientReversal(keras.layers.Layer):
    """Keras layer: identity forward, gradient multiplied by ``-scale`` backward.

    Put it between a feature extractor and a domain classifier for domain-adversarial training.
    """

    def __init__(self, scale: float = 1.0, **kwargs):
        super().__init__(**kwargs)
        self.scale = float(scale)

    def call(self, inputs):
        return reverse_gradient(inputs, self.scale)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "scale": self.scale}
