"""Larq's ``larq.models.summary`` on :mod:`bnn.models.summary`."""

from __future__ import annotations

from typing import Any, Callable

import keras

from bnn.models import summary as bnn_summary

__all__ = ["summary"]


def summary(model: keras.Model, print_fn: Callable[[str], Any] | None = None,
            include_macs: bool = True) -> None:
    """Prints, per layer, binary and float parameters, packed memory and (``include_macs``)
    binary and float multiply-accumulates, then totals and the compression ratio
    (:func:`bnn.models.summary.format_table`; Larq's table has the same content in another layout).

    Raises:
        ValueError: if the model is not built.
    """
    rows = bnn_summary.summarize(model)
    (print_fn or print)(bnn_summary.format_table(rows, include_macs=include_macs))
