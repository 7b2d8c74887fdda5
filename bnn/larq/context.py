"""Larq's ``larq.context``: the training metrics that kernel quantizers add."""

from __future__ import annotations

import contextlib
from typing import Iterable, Iterator

__all__ = ["metrics_scope", "get_training_metrics", "AVAILABLE_METRICS"]

AVAILABLE_METRICS = ("flip_ratio",)
_training_metrics: set[str] = set()


def check_metrics(metrics: Iterable[str] | None) -> list[str]:
    """``metrics`` as a list, each one of :data:`AVAILABLE_METRICS`.

    Raises:
        ValueError: for an unknown metric name.
    """
    metrics = list(metrics or [])
    for metric in metrics:
        if metric not in AVAILABLE_METRICS:
            raise ValueError(f"unknown training metric {metric!r}; available metrics: "
                             f"{', '.join(AVAILABLE_METRICS)}")
    return metrics


@contextlib.contextmanager
def metrics_scope(metrics: Iterable[str] = ()) -> Iterator[set[str]]:
    """Inside the ``with`` block, kernel quantizers created without ``metrics`` track
    ``metrics`` (only ``"flip_ratio"`` exists), as in Larq::

        with lq.context.metrics_scope(["flip_ratio"]):
            model = keras.Sequential([lq.layers.QuantDense(3, kernel_quantizer="ste_sign")])
    """
    metrics = check_metrics(metrics)
    saved = set(_training_metrics)
    _training_metrics.update(metrics)
    try:
        yield _training_metrics
    finally:
        _training_metrics.clear()
        _training_metrics.update(saved)


def get_training_metrics() -> set[str]:
    """The live set of training metrics of the current :func:`metrics_scope`."""
    return _training_metrics
