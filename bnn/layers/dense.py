"""``BinaryDense``: Keras' ``Dense`` with binary inputs and kernel."""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

from bnn.layers.base import DEFAULT_CONSTRAINT, BinaryKernelLayer
from bnn.native import dispatch
from bnn.ops import xnor

__all__ = ["BinaryDense"]


@keras.saving.register_keras_serializable(package="bnn")
class BinaryDense(BinaryKernelLayer, keras.layers.Dense):
    """Fully connected layer with binary inputs and kernel.

    ``outputs = activation(input_quantizer(x) @ kernel_quantizer(W) [* scale] [+ b])``

    Args:
        units: output size.
        input_quantizer: quantizer for the inputs (default ``"ste_sign"``); ``None`` for a first
            layer that sees real-valued data.
        kernel_quantizer: quantizer for the latent kernel (default ``"ste_sign"``).
        kernel_constraint: default ``WeightClip(1.0)`` when binary, none when float.
        precision: ``"binary"`` or ``"float"`` (quantizers off: the float twin).
        scale_kernel: multiply the binary kernel by ``mean(|W|)`` per output unit (XNOR-Net).
        use_bias: default False (batch normalization usually follows).
        **kwargs: any other argument of ``keras.layers.Dense``.
    """

    def __init__(self, units: int, input_quantizer: Any = "ste_sign",
                 kernel_quantizer: Any = "ste_sign", kernel_constraint: Any = DEFAULT_CONSTRAINT,
                 precision: str = "binary", scale_kernel: bool = False, use_bias: bool = False,
                 **kwargs):
        self._init_quantization(precision, input_quantizer, kernel_quantizer, scale_kernel)
        super().__init__(units, use_bias=use_bias,
                         kernel_constraint=self._constraint(precision, kernel_constraint),
                         **kwargs)

    def call(self, inputs, training=None):
        x = self._quantize_inputs(inputs)
        product = self._product(x, training)
        if product == "packed":
            x = xnor.binary_matmul(x, self._sign_source(), training=training is True)
        elif product == "sign_kernel":
            x = xnor.sign_kernel_matmul(x, self._sign_source(),
                                        dispatch.training_ops(x.dtype, False))
        else:
            x = ops.matmul(x, self._product_kernel())
        if self.bias is not None:
            x = ops.add(x, self.bias)
        if self.activation is not None:
            x = self.activation(x)
        return x

    def _packs(self, x) -> bool:
        return len(x.shape) == 2
