"""Weight constraints for latent (real-valued) weights."""

from __future__ import annotations

import keras
import tensorflow as tf

__all__ = ["WeightClip"]


@keras.saving.register_keras_serializable(package="bnn")
class WeightClip(keras.constraints.Constraint):
    """Clips latent weights to ``[-clip_value, clip_value]`` after every optimizer step.

    BinaryNet keeps latent weights in [-1, 1]: outside it the straight-through estimator's
    gradient is zero and the weight could never return.
    """

    def __init__(self, clip_value: float = 1.0):
        if not clip_value > 0:
            raise ValueError(f"WeightClip clip_value must be > 0, got {clip_value!r}")
        self.clip_value = float(clip_value)

    def __call__(self, w):
        # one fused ClipByValue kernel: a single pass over the latent weights
        c = tf.cast(self.clip_value, w.dtype)
        return tf.raw_ops.ClipByValue(t=w, clip_value_min=-c, clip_value_max=c)

    def get_config(self) -> dict:
        return {"clip_value": self.clip_value}

    def __repr__(self) -> str:
        return f"WeightClip(clip_value={self.clip_value})"
