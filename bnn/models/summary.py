"""Per-layer size and cost of a quantized model: parameters by bit width, memory, and
multiply-accumulates by precision, counted as Larq's ``larq.models.summary`` counts them.

For each layer:

* **parameters**, by bit width: a kernel the layer quantizes counts at its quantizer's
  ``precision`` (1 for the sign family, 2 for ``ste_tern``, ``k_bit`` for ``dorefa``, the given
  one for ``no_op``; 32 for a quantizer without one); every other weight at 32 bits. Batch
  normalization counts 2 numbers per channel: at inference its scale ``gamma`` and offset
  ``beta`` fold into the moving mean and variance, so only those two are counted (both
  non-trainable).
* **memory**: ``sum(bits * count)`` bits (KiB: ``/ 8 / 1024``).
* **MACs** per example of ``Dense``, ``Conv1D``, ``Conv2D``, ``DepthwiseConv2D``,
  ``SeparableConv1D``, ``SeparableConv2D`` and the 1-D/2-D transposed convolutions (Keras' and
  bnn's binary layers built on them): for each kernel, its size times the number of output
  positions (the output's dimensions but batch and channels), at the precision
  ``max(input bits, kernel bits)``, where the input bits are the precision of the layer's input
  quantizer (32 without one). So a separable convolution with a binary input quantizer and
  binary kernels counts both halves as 1-bit MACs. ``Flatten``, batch normalization and max or
  average pooling do none (0); other layers, and layers whose output shape is not one known
  shape, are not counted (``None``, printed ``?``).

A nested model is one row (:func:`model_row`) or its layers' rows (``summarize(flatten=True)``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable

import keras

from bnn.layers.walk import all_layers, leaf_layers

__all__ = ["LayerRow", "summarize", "model_row", "totals", "compression_ratio", "format_table"]

FLOAT_BITS = 32

_MAC_LAYERS = (keras.layers.Dense, keras.layers.Conv1D, keras.layers.Conv2D,
               keras.layers.DepthwiseConv2D, keras.layers.SeparableConv1D,
               keras.layers.SeparableConv2D, keras.layers.Conv1DTranspose,
               keras.layers.Conv2DTranspose)
_COUNTED_LAYERS = (keras.layers.Flatten, keras.layers.BatchNormalization,
                   keras.layers.MaxPooling1D, keras.layers.MaxPooling2D,
                   keras.layers.AveragePooling1D, keras.layers.AveragePooling2D, *_MAC_LAYERS)

Shape = tuple  # one output's shape, ``None`` for an unknown dimension


@dataclasses.dataclass(frozen=True)
class LayerRow:
    """One line of the summary (a layer, a nested model or the total); counts per example.

    ``weights`` holds ``(bits, count, trainable)`` per counted weight; ``macs`` holds
    ``(bits, count)`` per kernel product, or is None where the layer's work is not counted.
    ``output_shape`` is a shape, a list of shapes (several outputs), or None (never called, or
    called with different output shapes).
    """

    name: str
    type: str
    input_bits: int | None
    output_shape: Shape | list[Shape] | None
    weights: tuple[tuple[int, int, bool], ...]
    macs: tuple[tuple[int, int], ...] | None

    def params(self, bits: int | None = None, trainable: bool | None = None) -> int:
        """Parameters of width ``bits`` (any when None) that are ``trainable`` (either when
        None)."""
        return sum(n for b, n, t in self.weights
                   if (bits is None or b == bits) and (trainable is None or t == trainable))

    def mac_count(self, bits: int | None = None) -> int | None:
        """MACs at precision ``bits`` (all when None); None where not counted."""
        if self.macs is None:
            return None
        return sum(n for b, n in self.macs if bits is None or b == bits)

    @property
    def param_bits(self) -> list[int]:
        """The parameter widths present, ascending."""
        return sorted({b for b, _, _ in self.weights})

    @property
    def mac_bits(self) -> list[int]:
        """The MAC precisions present, ascending."""
        return sorted({b for b, _ in self.macs or ()})

    @property
    def memory_bits(self) -> int:
        return sum(b * n for b, n, _ in self.weights)

    @property
    def memory_kib(self) -> float:
        return self.memory_bits / 8 / 1024

    @property
    def float32_bits(self) -> int:
        """Memory with every parameter at 32 bits."""
        return FLOAT_BITS * self.params()

    @property
    def int8_bits(self) -> int:
        """Memory with parameters wider than 8 bits stored at 8."""
        return sum(min(b, 8) * n for b, n, _ in self.weights)


def _precision(quantizer: Any) -> int | None:
    """A quantizer's output width in bits: its ``precision`` attribute, when an int."""
    bits = getattr(quantizer, "precision", None)
    return bits if isinstance(bits, int) and not isinstance(bits, bool) else None


def _applies_quantizers(layer) -> bool:
    # bnn's layers at precision="float" keep their quantizers but do not apply them.
    return getattr(layer, "quantized", True)


def _input_bits(layer) -> int | None:
    if not _applies_quantizers(layer):
        return None
    return _precision(getattr(layer, "input_quantizer", None))


def _kernel_bits(layer) -> dict[int, int]:
    """``{id(kernel): bits}`` of the kernels ``layer`` quantizes (bnn's ``quantized_kernels``
    table: quantizer, kernel and constraint attributes)."""
    if not _applies_quantizers(layer):
        return {}
    found = {}
    for quantizer_attr, kernel_attr, _ in getattr(layer, "quantized_kernels", ()):
        quantizer, kernel = getattr(layer, quantizer_attr, None), getattr(layer, kernel_attr, None)
        if quantizer is not None and kernel is not None:
            found[id(kernel)] = _precision(quantizer) or FLOAT_BITS
    return found


def _counted_weights(layer) -> list:
    """``layer.weights`` less batch normalization's ``gamma`` and ``beta``, which fold into its
    moving variance and mean."""
    weights = list(layer.weights)
    if isinstance(layer, keras.layers.BatchNormalization):
        folded = {id(getattr(layer, kept)) for kept, into in (("gamma", "moving_variance"),
                                                               ("beta", "moving_mean"))
                  if getattr(layer, kept, None) is not None
                  and getattr(layer, into, None) is not None}
        weights = [w for w in weights if id(w) not in folded]
    return weights


def _shape(tensors: list) -> Shape | list[Shape]:
    shapes = [tuple(t.shape) for t in tensors]
    return shapes[0] if len(shapes) == 1 else shapes


def _output_shape(layer) -> Shape | list[Shape] | None:
    """The output shape shared by every call of ``layer`` in a graph; None if it was never
    called on a symbolic input or its calls gave different shapes."""
    nodes = getattr(layer, "_inbound_nodes", None) or []  # Keras' own summary reads them too
    shapes = [_shape(node.outputs) for node in nodes]
    if not shapes or any(s != shapes[0] for s in shapes):
        return None
    return shapes[0]


def _output_positions(layer, shape) -> int | None:
    """Output positions per example (1 for a vector): the product of the dimensions other than
    batch and channels; None when one is unknown."""
    if not isinstance(shape, tuple) or len(shape) < 2:
        return None
    channels_first = getattr(layer, "data_format", "channels_last") == "channels_first"
    dims = shape[2:] if channels_first else shape[1:-1]
    if any(d is None for d in dims):
        return None
    return math.prod(dims)


def _layer_row(layer) -> LayerRow:
    kernel_bits = _kernel_bits(layer)
    trainable = {id(w) for w in layer.trainable_weights}
    weights = [(w, kernel_bits.get(id(w), FLOAT_BITS)) for w in _counted_weights(layer)]
    input_bits = _input_bits(layer)
    output_shape = _output_shape(layer)
    positions = _output_positions(layer, output_shape)
    macs = None
    if isinstance(layer, _COUNTED_LAYERS) and positions:
        macs = ()
        if isinstance(layer, _MAC_LAYERS):
            bias = getattr(layer, "bias", None)
            macs = tuple((max(input_bits or FLOAT_BITS, bits), math.prod(w.shape) * positions)
                         for w, bits in weights if w is not bias)
    return LayerRow(
        name=layer.name, type=type(layer).__name__, input_bits=input_bits,
        output_shape=output_shape,
        weights=tuple((bits, math.prod(w.shape), id(w) in trainable) for w, bits in weights),
        macs=macs)


def _combine(name: str, type_: str, rows: list[LayerRow]) -> LayerRow:
    """``rows`` as one row: their parameters and MACs (uncounted ones as 0), the first row's
    input bits and the last row's output shape."""
    return LayerRow(
        name=name, type=type_, input_bits=rows[0].input_bits if rows else None,
        output_shape=rows[-1].output_shape if rows else None,
        weights=tuple(w for r in rows for w in r.weights),
        macs=tuple(m for r in rows for m in r.macs or ()))


def _check_built(model: keras.Model) -> None:
    """Raises unless ``model`` is built; builds the layers of a subclassed model that
    ``model.build(input_shape)`` marked built without building them (Keras 3 runs no call
    there), by running it on a symbolic input of that shape, as tf-keras' ``build`` did."""
    if not model.built:
        raise ValueError(
            f"model {model.name!r} is not built, so it has no weights to count: build it first "
            "(model.build(input_shape), a keras.Input, or input_shape= on its first layer)")
    shape = (model.get_build_config() or {}).get("input_shape")
    if shape is not None and not all(layer.built for layer in all_layers(model)):
        model.compute_output_spec(keras.KerasTensor(shape))


def summarize(model: keras.Model, flatten: bool = True) -> list[LayerRow]:
    """One :class:`LayerRow` per layer of a built ``model``; a nested model's layers in its
    place (``flatten``) or one row for it (as Larq prints it).

    Raises:
        ValueError: when the model is not built (its weights do not exist yet).
    """
    _check_built(model)
    if flatten:
        return [_layer_row(layer) for layer in leaf_layers(model)]
    return [model_row(layer) if isinstance(layer, keras.Model) else _layer_row(layer)
            for layer in model.layers]


def model_row(model: keras.Model) -> LayerRow:
    """A built ``model`` as one row named after it: its layers' parameters and MACs summed, the
    input bits of its first layer and the output shape of its last."""
    return _combine(model.name, type(model).__name__, summarize(model, flatten=False))


def totals(rows: Iterable[LayerRow]) -> LayerRow:
    """The sum of ``rows``, as a row named ``"total"``."""
    return _combine("total", "", list(rows))


def compression_ratio(rows: Iterable[LayerRow]) -> float:
    """float32 size of the same-shape float model / quantized size over all rows (1.0 for a
    float model)."""
    total = totals(rows)
    if total.memory_bits == 0:
        raise ValueError("compression_ratio of a model without parameters is undefined")
    return total.float32_bits / total.memory_bits


def _shape_cell(shape) -> str:
    return "?" if shape is None else str(shape)


def _count_cell(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


def format_table(rows: list[LayerRow], include_macs: bool = True) -> str:
    """A fixed-width text table of ``rows``: layer, type, output shape, parameters per bit
    width, memory (KiB) and (``include_macs``) MACs per precision, then the totals and the
    compression ratio."""
    total = totals(rows)
    param_bits, mac_bits = total.param_bits, total.mac_bits if include_macs else []
    header = ["Layer", "Type", "Output shape", *(f"{b}-bit params" for b in param_bits),
              "Memory (KiB)", *(f"{b}-bit MACs" for b in mac_bits)]

    def cells(row: LayerRow, shape: str) -> list[str]:
        return [row.name, row.type, shape, *(f"{row.params(b):,}" for b in param_bits),
                f"{row.memory_kib:,.2f}", *(_count_cell(row.mac_count(b)) for b in mac_bits)]

    body = [cells(r, _shape_cell(r.output_shape)) for r in rows]
    footer = cells(total, "")
    widths = [max(len(line[i]) for line in [header, footer, *body]) for i in range(len(header))]

    def line(values: list[str]) -> str:
        # Text columns left-aligned, numbers right-aligned.
        return "  ".join(c.ljust(w) if i < 3 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(values, widths))).rstrip()

    rule = "-" * (sum(widths) + 2 * (len(widths) - 1))
    ratio = (f"Compression ratio vs float32: {compression_ratio(rows):.2f}x"
             if total.memory_bits else "")
    return "\n".join([line(header), rule, *map(line, body), rule, line(footer), ratio]).rstrip()
