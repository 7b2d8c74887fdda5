"""The comparison report of a run: ``report.json`` for machines, ``report.md`` for people."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from bnn.rundir import atomic_write, write_json

__all__ = ["build_report", "write_report", "to_markdown"]


def build_report(twins: dict[str, dict[str, Any]], meta: dict[str, Any] | None = None) -> dict:
    """``{"binary": {...}, "float": {...}, "step_time_ratio": binary/float median step}``;
    the ratio is present when both twins are."""
    report: dict[str, Any] = dict(twins)
    if "binary" in twins and "float" in twins:
        b, f = twins["binary"]["median_step_ms"], twins["float"]["median_step_ms"]
        report["step_time_ratio"] = b / f if f and math.isfinite(b) and math.isfinite(f) else None
    if meta:
        report["meta"] = meta
    return report


#: Report columns, in order: ``binary_no_distill`` is the binary twin trained without
#: distillation (``bnn compare --ablate distill``).
_TWINS = ("binary", "binary_no_distill", "float")


def _fmt(value: Any, kind: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return {"pct": f"{100 * value:.2f}%", "ms": f"{value:.1f}", "int": f"{int(value):,}",
            "s": f"{value:.0f}", "rate": f"{value:,.0f}"}[kind]


def to_markdown(report: dict) -> str:
    twins = [p for p in _TWINS if p in report]
    rows = [("test accuracy (final)", "test_accuracy", "pct"),
            ("test accuracy (best epoch)", "best_test_accuracy", "pct"),
            ("median train step (ms)", "median_step_ms", "ms"),
            ("examples / s", "examples_per_second", "rate"),
            ("parameters", "params", "int"),
            ("epochs", "epochs", "int"),
            ("wall time (s)", "wall_seconds", "s")]
    meta = report.get("meta", {})
    lines = [f"# {meta.get('name', 'bnn run')}", ""]
    if meta:
        lines += [f"- {k}: {v}" for k, v in meta.items() if k != "name"] + [""]
    lines += ["| figure | " + " | ".join(twins) + " |", "|---|" + "---|" * len(twins)]
    for label, key, kind in rows:
        lines.append(f"| {label} | " + " | ".join(_fmt(report[p].get(key), kind) for p in twins)
                     + " |")
    if report.get("step_time_ratio") is not None:
        lines += ["", f"Binary / float median train step: **{report['step_time_ratio']:.2f}**"]
    if len(twins) > 1:
        total = sum(report[p].get("wall_seconds", 0.0) for p in twins)
        lines += ["", f"Wall time of all twins together: {_fmt(total, 's')} s"]
    lines += ["", "Curves: `tensorboard --logdir <this run directory>`", ""]
    return "\n".join(lines)


def write_report(run_dir: Path, report: dict) -> None:
    write_json(Path(run_dir) / "report.json", report)
    atomic_write(Path(run_dir) / "report.md", to_markdown(report))
