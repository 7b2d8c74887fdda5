"""Per-layer size and cost of a binary model: parameters, packed memory, multiply-accumulates.

For each layer:

* **binary params**: entries of a binarized kernel (a layer with ``quantized`` True and a
  ``kernel_quantizer``), stored at 1 bit each once packed.
* **float params**: every other weight of the layer (biases, batch-normalization scale, offset
  and moving statistics, kernels of float layers), stored at 32 bits.
* **memory**: ``(binary params * 1 + float params * 32) / 8 / 1024`` KiB.
* **MACs** per example: Dense ``in * out`` (times any extra leading output dimensions),
  Conv2D ``out_h * out_w * k_h * k_w * c_in / groups * c_out``; other layers 0. They count as
  *binary* MACs (xor-popcount) when both the kernel and the inputs are binarized, as *float* MACs
  otherwise (a first layer that sees real-valued pixels does float MACs).

The compression ratio compares the float32 model of the same shape (every parameter at 32 bits)
with the packed size: ``32 * (binary + float) / (binary + 32 * float)``.
"""

from __future__ import annotations

import dataclasses
import math

import keras

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


def _leaf_layers(model: keras.Model) -> list:
    found = []
    for layer in model.layers:
        found.extend(_leaf_layers(layer) if isinstance(layer, keras.Model) else [layer])
    return found


def _output_shape(layer) -> str:
    try:
        return str(tuple(layer.output.shape))
    except (AttributeError, ValueError):  # a layer never called on a symbolic input
        return "?"


def _macs(layer) -> int:
    kernel = getattr(layer, "kernel", None)
    if kernel is None:
        return 0
    try:
        out_shape = tuple(layer.output.shape)
    except (AttributeError, ValueError):
        return 0
    if isinstance(layer, keras.layers.Dense):
        return math.prod(kernel.shape) * math.prod(out_shape[1:-1])
    if isinstance(layer, keras.layers.Conv2D):
        spatial = out_shape[1:3] if layer.data_format == "channels_last" else out_shape[2:4]
        return math.prod(spatial) * math.prod(kernel.shape)
    return 0


def _has_binary_kernel(layer) -> bool:
    return getattr(layer, "quantized", False) and getattr(layer, "kernel_quantizer", None) is not None


def summarize(model: keras.Model) -> list[LayerRow]:
    """One :class:`LayerRow` per layer of a built ``model`` (nested models flattened).

    Raises:
        ValueError: when the model is not built (its weights do not exist yet).
    """
    if not model.built:
        raise ValueError(f"model {model.name!r} is not built; give it a keras.Input or call it on "
                         "a batch before summarizing")
    rows = []
    for layer in _leaf_layers(model):
        binary = math.prod(layer.kernel.shape) if _has_binary_kernel(layer) else 0
        floats = sum(math.prod(w.shape) for w in layer.weights) - binary
        macs = _macs(layer)
        binary_macs = macs if binary and getattr(layer, "input_quantizer", None) is not None else 0
        rows.append(LayerRow(
            name=layer.name, type=type(layer).__name__, output_shape=_output_shape(layer),
            binary_params=binary, float_params=floats, memory_kib=_memory_kib(binary, floats),
            binary_macs=binary_macs, float_macs=macs - binary_macs,
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


def format_table(rows: list[LayerRow]) -> str:
    """A fixed-width text table of ``rows``, a totals line and the compression ratio."""
    body = [[_cell(getattr(r, field)) for _, field in _COLUMNS] for r in rows]
    total = [_cell(getattr(totals(rows), field)) for _, field in _COLUMNS]
    header = [title for title, _ in _COLUMNS]
    widths = [max(len(line[i]) for line in [header, total, *body]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        # Text columns left-aligned, numbers right-aligned.
        return "  ".join(c.ljust(w) if i < 3 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    rule = "-" * sum(widths + [2 * (len(widths) - 1)])
    has_params = total[3] != "0" or total[4] != "0"
    ratio = f"Compression ratio vs float32: {compression_ratio(rows):.2f}x" if has_params else ""
    return "\n".join([line(header), rule, *map(line, body), rule, line(total), ratio]).rstrip()
