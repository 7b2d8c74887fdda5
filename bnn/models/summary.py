"""Per-layer size and cost of a binary model: parameters, packed memory, multiply-accumulates.

For each layer:

* **binary params**: entries of the kernels a layer binarizes (``layer.binary_kernels()``),
  stored at 1 bit each once packed.
* **float params**: every other weight of the layer (biases, batch-normalization scale, offset
  and moving statistics, kernels of float layers), stored at 32 bits.
* **memory**: ``(binary params * 1 + float params * 32) / 8 / 1024`` KiB.
* **MACs** per example: Dense ``in * out`` (times any extra leading output dimensions),
  Conv2D ``out_h * out_w * k_h * k_w * c_in / groups * c_out``, DepthwiseConv2D
  ``out_h * out_w * k_h * k_w * c_in * depth_multiplier``, SeparableConv2D that plus
  ``out_h * out_w * c_in * depth_multiplier * filters`` for its pointwise half; other layers 0.
  They count as *binary* MACs (xor-popcount) when both the kernel and the inputs are binarized,
  as *float* MACs otherwise (a first layer that sees real-valued pixels does float MACs, and so
  does the pointwise half of a separable convolution, whose inputs are real).

The compression ratio compares the float32 model of the same shape (every parameter at 32 bits)
with the packed size: ``32 * (binary + float) / (binary + 32 * float)``.
"""

from __future__ import annotations

import dataclasses
import math

import keras

from bnn.layers.walk import leaf_layers

__all__ = ["LayerRow", "summarize", "totals", "compression_ratio", "format_table"]


@dataclasses.dataclass(frozen=True)
class LayerRow:
    """One line of the summary; counts per example, memory in KiB."""

    name: str
    type: str
    output_shape: str
    binary_params: int
    float_params: int
    memory_kib: float
    binary_macs: int
    float_macs: int


def _memory_kib(binary_params: int, float_params: int) -> float:
    return (binary_params + 32 * float_params) / 8 / 1024


def _output_shape(layer) -> str:
    try:
        return str(tuple(layer.output.shape))
    except (AttributeError, ValueError):  # a layer never called on a symbolic input
        return "?"


def _spatial(layer, out_shape) -> int:
    return math.prod(out_shape[1:3] if layer.data_format == "channels_last" else out_shape[2:4])


def _macs(layer) -> tuple[int, int]:
    """``(binary MACs, float MACs)`` per example. A product counts as binary when its kernel is
    binarized and its inputs are too (the layer's quantized inputs; the pointwise half of a
    separable convolution sees real-valued depthwise outputs)."""
    try:
        out_shape = tuple(layer.output.shape)
    except (AttributeError, ValueError):
        return 0, 0
    binary_kernels = {id(k) for k in getattr(layer, "binary_kernels", list)()}
    binary_inputs = getattr(layer, "input_quantizer", None) is not None

    def split(kernel, macs: int, inputs_binary: bool) -> tuple[int, int]:
        return (macs, 0) if inputs_binary and id(kernel) in binary_kernels else (0, macs)

    if isinstance(layer, keras.layers.SeparableConv2D):
        depthwise, pointwise = layer.depthwise_kernel, layer.pointwise_kernel
        spatial = _spatial(layer, out_shape)
        d = split(depthwise, spatial * math.prod(depthwise.shape), binary_inputs)
        p = split(pointwise, spatial * math.prod(pointwise.shape), False)
        return d[0] + p[0], d[1] + p[1]
    kernel = getattr(layer, "kernel", None)
    if kernel is None:
        return 0, 0
    if isinstance(layer, keras.layers.Dense):
        return split(kernel, math.prod(kernel.shape) * math.prod(out_shape[1:-1]), binary_inputs)
    if isinstance(layer, (keras.layers.Conv2D, keras.layers.DepthwiseConv2D)):
        return split(kernel, _spatial(layer, out_shape) * math.prod(kernel.shape), binary_inputs)
    return 0, 0


def summarize(model: keras.Model) -> list[LayerRow]:
    """One :class:`LayerRow` per layer of a built ``model`` (nested models flattened).

    Raises:
        ValueError: when the model is not built (its weights do not exist yet).
    """
    if not model.built:
        raise ValueError(f"model {model.name!r} is not built; give it a keras.Input or call it on "
                         "a batch before summarizing")
    rows = []
    for layer in leaf_layers(model):
        binary = sum(math.prod(k.shape) for k in getattr(layer, "binary_kernels", list)())
        floats = sum(math.prod(w.shape) for w in layer.weights) - binary
        binary_macs, float_macs = _macs(layer)
        rows.append(LayerRow(
            name=layer.name, type=type(layer).__name__, output_shape=_output_shape(layer),
            binary_params=binary, float_params=floats, memory_kib=_memory_kib(binary, floats),
            binary_macs=binary_macs, float_macs=float_macs,
        ))
    return rows


def totals(rows: list[LayerRow]) -> LayerRow:
    """The sum of ``rows``, as a row named ``"total"``."""
    binary = sum(r.binary_params for r in rows)
    floats = sum(r.float_params for r in rows)
    return LayerRow(name="total", type="", output_shape="", binary_params=binary,
                    float_params=floats, memory_kib=_memory_kib(binary, floats),
                    binary_macs=sum(r.binary_macs for r in rows),
                    float_macs=sum(r.float_macs for r in rows))


def compression_ratio(rows: list[LayerRow]) -> float:
    """float32 size of the same-shape float model / packed size:
    ``32 * (binary + float) / (binary + 32 * float)`` over all rows (1.0 for a float model)."""
    total = totals(rows)
    packed_bits = total.binary_params + 32 * total.float_params
    if packed_bits == 0:
        raise ValueError("compression_ratio of a model without parameters is undefined")
    return 32 * (total.binary_params + total.float_params) / packed_bits


_COLUMNS = [("Layer", "name"), ("Type", "type"), ("Output shape", "output_shape"),
            ("Binary params", "binary_params"), ("Float params", "float_params"),
            ("Memory (KiB)", "memory_kib"), ("Binary MACs", "binary_macs"),
            ("Float MACs", "float_macs")]


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def format_table(rows: list[LayerRow], include_macs: bool = True) -> str:
    """A fixed-width text table of ``rows``, a totals line and the compression ratio; without
    the two MAC columns when ``include_macs`` is False."""
    columns = _COLUMNS if include_macs else _COLUMNS[:-2]
    body = [[_cell(getattr(r, field)) for _, field in columns] for r in rows]
    total = [_cell(getattr(totals(rows), field)) for _, field in columns]
    header = [title for title, _ in columns]
    widths = [max(len(line[i]) for line in [header, total, *body]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        # Text columns left-aligned, numbers right-aligned.
        return "  ".join(c.ljust(w) if i < 3 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    rule = "-" * sum(widths + [2 * (len(widths) - 1)])
    has_params = total[3] != "0" or total[4] != "0"
    ratio = f"Compression ratio vs float32: {compression_ratio(rows):.2f}x" if has_params else ""
    return "\n".join([line(header), rule, *map(line, body), rule, line(total), ratio]).rstrip()
