"""Larq's ``larq.models.summary``: the two tables Larq prints, from the counts of
:mod:`bnn.models.summary`."""

from __future__ import annotations

from typing import Any, Callable

import keras

from bnn.models import summary as counts

__all__ = ["summary"]

_KIB_BITS = 8 * 1024
_SUFFIXES = ("", " k", " M", " B", " T")


def summary(model: keras.Model, print_fn: Callable[[str], Any] | None = None,
            include_macs: bool = True) -> None:
    """Prints Larq's two tables for a built ``model``, each in one ``print_fn`` call.

    ``<model name> stats``: one row per layer of ``model.layers`` (a nested model as one row):
    the precision of its input quantizer (``-`` for none), its output shape (``-1`` for the
    batch; ``multiple`` where it has none or several), its parameters per bit width, their
    memory in kB (``8 * 1024`` one-bit weights make 1 kB) and its MACs per precision (``?``
    where not counted), then the totals. The counting rules are those of
    :mod:`bnn.models.summary`.

    ``<model name> summary``: total, trainable and non-trainable parameters; the model size,
    with 32- and 16-bit weights at 8 bits, and with every weight at 32 bits; the ratio of size
    to that float-32 size; with ``include_macs``, the number of MACs and the fractions that are
    1-bit ("binarized") and 2-bit ("ternarized"), where not zero. As in Larq, ``include_macs``
    leaves the MAC columns of the first table in place.

    Raises:
        ValueError: if the model is not built.
    """
    rows = counts.summarize(model, flatten=False)
    total = counts.totals(rows)
    print_fn = print_fn or print
    print_fn(text_table(stats_cells(rows, total), f"{model.name} stats", ruled=True))
    print_fn(text_table(summary_cells(total, include_macs), f"{model.name} summary",
                        ruled=False))


def readable_count(value: float) -> str:
    """A count to 3 significant figures as Larq prints it: ``"468"``, ``"7.7 k"``,
    ``"2.79 M"``, ``"1.25 B"``, up to ``" T"``, then ``"1.00E+15"``."""
    value = float(f"{value:.3g}")  # rounded first: 999_500 is "1 M", not "1e+03 k"
    if value < 1000:
        return f"{value:g}"
    if value >= 1e15:
        return f"{value:.2E}"
    power = 0
    while value >= 1000 and power < len(_SUFFIXES) - 1:
        value, power = value / 1000, power + 1
    return f"{value:.3g}{_SUFFIXES[power]}"


def readable_memory(bits: float) -> str:
    """``bits`` in bytes, KiB, MiB or GiB (the first below 1024, GiB at most), 2 decimals:
    ``"236.00 B"``, ``"13.19 KiB"``, ``"1,024.00 MiB"``."""
    size = bits / 8
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:,.2f} {unit}"
        size /= 1024
    return f"{size:,.2f} GiB"


def _shape_text(shape) -> str:
    def larq_shape(s: tuple) -> tuple:
        return tuple(d if d else -1 for d in s)

    if isinstance(shape, list):
        return str([larq_shape(s) for s in shape])
    return str(larq_shape(shape)) if shape else "multiple"


def stats_cells(rows: list[counts.LayerRow], total: counts.LayerRow) -> list[list[str]]:
    """The first table's cells: header, one row per entry of ``rows``, ``total``."""
    param_bits, mac_bits = total.param_bits, total.mac_bits

    def numbers(row: counts.LayerRow) -> list[str]:
        memory = row.memory_bits
        return [*(str(row.params(b)) for b in param_bits),
                f"{memory / _KIB_BITS:.2f}" if memory else "0",
                *("?" if row.mac_count(b) is None else str(row.mac_count(b)) for b in mac_bits)]

    header = ["Layer", "Input prec.\n(bit)", "Outputs", *(f"# {b}-bit\nx 1" for b in param_bits),
              "Memory\n(kB)", *(f"{b}-bit MACs" for b in mac_bits)]
    body = [[r.name, str(r.input_bits or "-"), _shape_text(r.output_shape), *numbers(r)]
            for r in rows]
    return [header, *body, ["Total", "", "", *numbers(total)]]


def summary_cells(total: counts.LayerRow, include_macs: bool = True) -> list[list[str]]:
    """The second table's cells: ``[label, value]`` pairs."""
    cells = [
        ["Total params", readable_count(total.params())],
        ["Trainable params", readable_count(total.params(trainable=True))],
        ["Non-trainable params", readable_count(total.params(trainable=False))],
        ["Model size", readable_memory(total.memory_bits)],
        ["Model size (8-bit FP weights)", readable_memory(total.int8_bits)],
        ["Float-32 Equivalent", readable_memory(total.float32_bits)],
        ["Compression Ratio of Memory", f"{total.memory_bits / max(1e-8, total.float32_bits):.2f}"],
    ]
    if include_macs:
        macs = total.mac_count()
        cells.append(["Number of MACs", readable_count(macs)])
        for bits, kind in ((1, "binarized"), (2, "ternarized")):
            share = total.mac_count(bits) / max(1, macs)
            if share > 0:
                cells.append([f"Ratio of MACs that are {kind}", f"{share:.4f}"])
    return cells


def text_table(cells: list[list[str]], title: str, ruled: bool) -> str:
    """``cells`` (a cell may hold several lines) as Larq's ASCII tables: ``|`` outer borders,
    columns two spaces apart, ``title`` in the top border where it fits. ``ruled``: a rule
    under the first row and above the last, the first column left-aligned and the others
    right-aligned (else all left-aligned)."""
    split = [[cell.split("\n") for cell in row] for row in cells]
    widths = [max(len(line) for row in split for line in row[i]) for i in range(len(cells[0]))]
    inner = sum(widths) + 2 * len(widths)

    def border(label: str = "") -> str:
        label = label if len(label) <= inner else ""
        return "+" + label + "-" * (inner - len(label)) + "+"

    def lines(row: list[list[str]]) -> list[str]:
        out = []
        for k in range(max(len(cell) for cell in row)):
            texts = [cell[k] if k < len(cell) else "" for cell in row]
            out.append("| " + "  ".join(
                t.rjust(w) if ruled and i else t.ljust(w)
                for i, (t, w) in enumerate(zip(texts, widths))) + " |")
        return out

    body = [lines(row) for row in split]
    if ruled:
        body = [*body[:1], [border()], *body[1:-1], [border()], *body[-1:]]
    return "\n".join([border(title), *(line for block in body for line in block), border()])
