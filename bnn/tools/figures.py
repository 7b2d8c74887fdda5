"""The comparison figure of a run: both twins' curves side by side, drawn with matplotlib.

Three panels: test accuracy per epoch and training loss per epoch, the binary model and its float
twin overlaid, and each twin's median train step as a bar. matplotlib is an optional dependency
(``pip install 'bnn[report]'``); :func:`available` says whether it can be imported. The figure is
drawn on matplotlib's object interface with the Agg canvas, so no pyplot state or global backend
is touched. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import importlib.util
import io
import math
from typing import Any, Sequence

__all__ = ["available", "INSTALL_HINT", "TWINS", "comparison_figure", "render"]

INSTALL_HINT = "pip install 'bnn[report]'"

# One colour per twin, the same in every panel (matplotlib's tab10 blue, green and orange), in
# the report's column order; ``binary_no_distill`` is ``bnn compare --ablate distill``'s twin.
_COLOURS = {"binary": "#1f77b4", "binary_no_distill": "#2ca02c", "float": "#ff7f0e"}
#: The twins a report may hold, in column order.
TWINS = tuple(_COLOURS)


def available() -> bool:
    """Whether matplotlib can be imported."""
    return importlib.util.find_spec("matplotlib") is not None


def _series(history: Sequence[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """``(epochs, values)`` of ``key`` in a per-epoch history, finite values only (1-based)."""
    points = [(i + 1, float(h[key])) for i, h in enumerate(history)
              if key in h and h[key] is not None and math.isfinite(float(h[key]))]
    return [e for e, _ in points], [v for _, v in points]


def _accuracy_floor(curves: list[list[float]]) -> float:
    """A lower y-limit for accuracy curves (in percent) that keeps the late epochs of a long run
    readable: the lowest value after each curve's first tenth, less a margin. Runs of fewer than
    ten epochs show every value."""
    skip = [len(c) // 10 if len(c) >= 10 else 0 for c in curves]
    values = [v for c, k in zip(curves, skip) for v in c[k:]]
    low, high = min(values), max(values)
    return max(0.0, low - max(0.5, 0.1 * (high - low)))


def comparison_figure(report: dict[str, Any]):
    """A matplotlib ``Figure`` of the report's twins (see the module docstring)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    twins = [t for t in TWINS if t in report]
    histories = report.get("history", {})
    fig = Figure(figsize=(12.0, 3.6), layout="constrained")
    acc_ax, loss_ax, step_ax = fig.subplots(1, 3, gridspec_kw={"width_ratios": [1.0, 1.0, 0.55]})

    accuracy_curves = []
    for twin in twins:
        epochs, values = _series(histories.get(twin, []), "test_accuracy")
        values = [100 * v for v in values]
        accuracy_curves.append(values)
        if values:
            acc_ax.plot(epochs, values, color=_COLOURS[twin], marker="." if len(values) < 40
                        else None, label=f"{twin}  {values[-1]:.2f}%")
    acc_ax.set(title="test accuracy", xlabel="epoch", ylabel="%")
    if any(accuracy_curves):
        acc_ax.set_ylim(bottom=_accuracy_floor([c for c in accuracy_curves if c]))
        acc_ax.legend(loc="best", frameon=False)

    losses = []
    for twin in twins:
        epochs, values = _series(histories.get(twin, []), "loss")
        losses += values
        if values:
            loss_ax.plot(epochs, values, color=_COLOURS[twin], label=twin)
    loss_ax.set(title="training loss", xlabel="epoch")
    if losses:
        if min(losses) > 0 and max(losses) / min(losses) > 10:
            loss_ax.set_yscale("log")
        loss_ax.legend(loc="best", frameon=False)

    steps = [(t, report[t].get("median_step_ms")) for t in twins]
    steps = [(t, float(ms)) for t, ms in steps if ms is not None and math.isfinite(float(ms))]
    bars = step_ax.bar([t for t, _ in steps], [ms for _, ms in steps],
                       color=[_COLOURS[t] for t, _ in steps], width=0.6)
    step_ax.bar_label(bars, labels=[f"{ms:.1f}" for _, ms in steps], padding=2)
    ratio = report.get("step_time_ratio")
    step_ax.set(title="median train step" + (f"\nbinary / float {ratio:.2f}" if ratio else ""),
                ylabel="ms")
    step_ax.margins(y=0.15)
    for ax in (acc_ax, loss_ax):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in (acc_ax, loss_ax, step_ax):
        ax.grid(axis="y", alpha=0.3)
        ax.spines[["top", "right"]].set_visible(False)
    name = report.get("meta", {}).get("name")
    if name:
        fig.suptitle(name)
    return fig


def render(report: dict[str, Any], fmt: str) -> bytes:
    """The comparison figure as ``"png"`` (100 dpi) or ``"svg"`` bytes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = comparison_figure(report)
    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format=fmt, dpi=100, metadata={"Software": None} if fmt == "png"
                else {"Date": None, "Creator": None})
    return buffer.getvalue()
