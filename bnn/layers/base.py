"""What every binary layer shares: the precision switch, quantized inputs and kernels, latent
weights kept in range, their config, and the choice of how a product runs.

A binary layer is a Keras layer (``Dense``, ``Conv2D``, ...) with :class:`QuantizedLayer` in
front of it in the class list: Keras' class makes the weights and does the math, the mixin
quantizes. It keeps real-valued *latent* kernels that the optimizer updates; the forward pass
uses ``kernel_quantizer(kernel)`` (±1 by default) on ``input_quantizer(inputs)``. With
``precision="float"`` the same layer is an ordinary float layer of the same shape, which is how
bnn builds a binary model's float twin. ``layer.binary_kernels()`` lists the latent kernels a
layer binarizes; optimizers, metrics and the model summary find binary weights through it.
"""

from __future__ import annotations

import contextlib
from typing import Any

import keras
import tensorflow as tf
from keras import ops

from bnn import quantizers as quantizers_lib
from bnn.catalog import PRECISIONS
from bnn.layers.constraints import WeightClip
from bnn.native import dispatch
from bnn.ops.xla import in_xla_context
from bnn.quantizers.sign import ste_sign

__all__ = ["QuantizedLayer", "BinaryKernelLayer", "DEFAULT_CONSTRAINT", "check_precision",
           "quantize"]

#: The constraint argument's default: ``WeightClip(1.0)`` for a binary layer, none for a float
#: one.
DEFAULT_CONSTRAINT = "default"

# Keras' scope that sets the dtype variables are read in inside a layer's call (not public API:
# where a Keras lacks it, kernels are read autocast, as Keras reads them).
_AUTOCAST_SCOPE = getattr(getattr(getattr(keras, "src", None), "backend", None), "AutocastScope",
                          None)


def quantize(quantizer: Any, x) -> tf.Tensor:
    """``quantizer(x)``, through the quantizer's bnn equivalent where it has one
    (:func:`bnn.quantizers.equivalent`: the same values, bnn's code), else called on the value
    of ``x``, a tensor even where ``x`` is a kernel variable, as Larq calls quantizers: so a
    user's function with a custom gradient (TensorFlow's decorator refuses variables in eager
    mode) runs eagerly too, and the gradient it defines reaches the variable through the
    read."""
    core = quantizers_lib.equivalent(quantizer)
    if core is not None:
        return core(x)
    return quantizer(tf.convert_to_tensor(x))


def _plus_minus_one(quantizer: Any) -> bool:
    """Whether every output of ``quantizer`` is exactly +1 or -1."""
    return bool(getattr(quantizers_lib.equivalent(quantizer) or quantizer, "plus_minus_one",
                        False))


def check_precision(precision: str, what: str) -> None:
    """Raises ``ValueError`` naming ``what`` unless ``precision`` is one of
    :data:`bnn.catalog.PRECISIONS`."""
    if precision not in PRECISIONS:
        raise ValueError(f"{what} precision must be one of {PRECISIONS}, got {precision!r}")


class QuantizedLayer:
    """The quantization of a binary layer, in front of a Keras layer class.

    Subclasses list their quantized kernels in :attr:`quantized_kernels` and call
    :meth:`_init_quantization` before the Keras constructor, passing each constraint through
    :meth:`_constraint`.
    """

    #: Per quantized kernel: the attribute of its quantizer, of its variable and of its
    #: constraint.
    quantized_kernels: tuple[tuple[str, str, str], ...] = (
        ("kernel_quantizer", "kernel", "kernel_constraint"),)

    def _init_quantization(self, precision: str, input_quantizer: Any, **quantizers: Any) -> None:
        check_precision(precision, type(self).__name__)
        self.precision = precision
        self.input_quantizer = quantizers_lib.get(input_quantizer)
        for name, quantizer in quantizers.items():
            setattr(self, name, quantizers_lib.get(quantizer))

    @staticmethod
    def _constraint(precision: str, constraint: Any) -> Any:
        """``WeightClip(1.0)`` for :data:`DEFAULT_CONSTRAINT` in a binary layer, none in a float
        one; any other constraint as given."""
        if constraint == DEFAULT_CONSTRAINT:
            return WeightClip(1.0) if precision == "binary" else None
        return constraint

    @property
    def quantized(self) -> bool:
        """True when this layer quantizes (``precision="binary"``)."""
        return self.precision == "binary"

    #: Whether ``build`` clips the initial kernels by their :class:`WeightClip` (Larq's layers
    #: leave them to the first optimizer step).
    _clip_on_build = True

    def build(self, input_shape):
        super().build(input_shape)
        if self.quantized and self._clip_on_build:  # WeightClip holds from the first step on
            for _, kernel, constraint in self.quantized_kernels:
                clip = getattr(self, constraint)
                if isinstance(clip, WeightClip):
                    variable = getattr(self, kernel)
                    variable.assign(clip(variable))

    def binary_kernels(self) -> list:
        """The latent kernels this layer quantizes in its forward pass: those with a quantizer
        when ``quantized``, else none."""
        if not self.quantized:
            return []
        return [getattr(self, kernel) for quantizer, kernel, _ in self.quantized_kernels
                if getattr(self, quantizer) is not None]

    def _quantize_inputs(self, inputs):
        if self.quantized and self.input_quantizer is not None:
            return quantize(self.input_quantizer, inputs)
        return inputs

    def _quantize(self, quantizer: str, kernel) -> tf.Tensor:
        """``kernel`` through the quantizer named ``quantizer`` when quantized and set."""
        q = getattr(self, quantizer)
        return kernel if not self.quantized or q is None else quantize(q, kernel)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "precision": self.precision,
                "input_quantizer": quantizers_lib.serialize(self.input_quantizer),
                **{quantizer: quantizers_lib.serialize(getattr(self, quantizer))
                   for quantizer, _, _ in self.quantized_kernels}}


class BinaryKernelLayer(QuantizedLayer):
    """A binary layer with one kernel (``Dense``, ``Conv2D``): an optional per-channel kernel
    scale, the ±1 kernel, and how its product runs.

    A call multiplies in one of three ways, chosen in :meth:`_product` alone:

    - ``"packed"``: both operands exactly ±1 (``plus_minus_one`` quantizers, no kernel scale),
      where :func:`bnn.native.dispatch.packed_forward` says so: by xor-popcount
      (:mod:`bnn.ops.xnor`), the float product exactly;
    - ``"sign_kernel"``: a training step of real-valued float32 inputs (a first layer's) with a
      ±1 kernel, on the native kernels where :func:`bnn.native.dispatch.training_ops` has them;
    - ``"float"``: Keras' product of the quantized operands.
    """

    def _init_quantization(self, precision: str, input_quantizer: Any, kernel_quantizer: Any,
                           scale_kernel: bool) -> None:
        super()._init_quantization(precision, input_quantizer, kernel_quantizer=kernel_quantizer)
        self.scale_kernel = bool(scale_kernel)

    def binary_kernel(self) -> tf.Tensor:
        """The quantized kernel the forward pass uses: ``kernel_quantizer(kernel)`` (±1 for
        ``ste_sign``), without the optional per-channel scale."""
        if not self.quantized or self.kernel_quantizer is None:
            raise ValueError(
                f"layer {self.name!r} has precision={self.precision!r} and kernel_quantizer="
                f"{self.kernel_quantizer!r}, so it has no binary kernel; read layer.kernel instead"
            )
        return quantize(self.kernel_quantizer, self.kernel)

    def kernel_scale(self) -> tf.Tensor | None:
        """Per-output-channel scale ``mean(|W|)`` (XNOR-Net), or None when ``scale_kernel`` is off."""
        if not (self.quantized and self.scale_kernel):
            return None
        axes = list(range(len(self.kernel.shape) - 1))
        return ops.mean(ops.abs(self.kernel), axis=axes)

    def _kernel_in_range(self) -> bool:
        """True for an ``ste_sign`` kernel whose ``WeightClip`` keeps every latent weight inside
        the quantizer's ``clip_value``: its straight-through mask is then all ones."""
        q, c = quantizers_lib.equivalent(self.kernel_quantizer), self.kernel_constraint
        return (isinstance(q, quantizers_lib.SteSign) and isinstance(c, WeightClip)
                and c.clip_value <= q.get_config()["clip_value"])

    def _product_kernel(self) -> tf.Tensor:
        """The kernel a product takes: the latent one when not quantized, else quantized (the
        mask skipped where :meth:`_kernel_in_range`: no extra pass over the weights) and
        scaled."""
        if not self.quantized:
            return self.kernel
        if self.kernel_quantizer is None:
            kernel = self.kernel
        elif self._kernel_in_range():
            kernel = ste_sign(self.kernel, clip_value=float("inf"))
        else:
            kernel = quantize(self.kernel_quantizer, self.kernel)
        scale = self.kernel_scale()
        return kernel if scale is None else kernel * ops.cast(scale, kernel.dtype)

    def _sign_source(self) -> tf.Tensor:
        """What a product of the kernel's signs reads: the latent kernel itself where it is kept
        in range (its sign happens inside the packing, and its straight-through mask is all
        ones), in its own dtype (float32, not autocast to a mixed-precision policy's compute
        dtype: its sign needs no cast); else :meth:`_product_kernel`."""
        if not self._kernel_in_range():
            return self._product_kernel()
        with contextlib.nullcontext() if _AUTOCAST_SCOPE is None else _AUTOCAST_SCOPE(None):
            return tf.convert_to_tensor(self.kernel)

    def _product(self, x, training) -> str:
        """``"packed"``, ``"sign_kernel"`` or ``"float"`` for this call (see the class)."""
        sign_kernel = (self.quantized and not self.scale_kernel
                       and _plus_minus_one(self.kernel_quantizer)
                       and dispatch.packed_forward(self.compute_dtype))
        if sign_kernel and _plus_minus_one(self.input_quantizer) and self._packs(x):
            return "packed"
        if (sign_kernel and training is True and self.input_quantizer is None
                and len(x.shape) == 2 and x.dtype == tf.float32
                and dispatch.training_ops(x.dtype, in_xla_context()) is not None):
            return "sign_kernel"
        return "float"

    def _packs(self, x) -> bool:
        """Whether this layer's ±1 product of ``x`` can run by xor-popcount (its shapes and
        options allow it)."""
        raise NotImplementedError

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "scale_kernel": self.scale_kernel}
