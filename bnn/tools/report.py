"""The comparison report of a run: ``report.json`` for machines, ``report.md`` for people, with
the figure of both twins' curves (``report.png`` and ``report.svg``, see :mod:`bnn.tools.figures`) and,
on request, a self-contained ``report.html``."""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any, Sequence

from bnn.files import atomic_write, write_json
from bnn.tools import figures

__all__ = ["build_report", "write_report", "to_markdown", "to_html"]

_ROWS = [("test accuracy (final)", "test_accuracy", "pct"),
         ("test accuracy (best epoch)", "best_test_accuracy", "pct"),
         ("median train step (ms)", "median_step_ms", "ms"),
         ("train step compiled by XLA", "xla", "yes"),
         ("examples / s", "examples_per_second", "rate"),
         ("parameters", "params", "int"),
         ("epochs", "epochs", "int"),
         ("wall time (s)", "wall_seconds", "s")]
FIGURE_NAMES = ("report.png", "report.svg")


def build_report(twins: dict[str, dict[str, Any]], meta: dict[str, Any] | None = None,
                 histories: dict[str, Sequence[dict[str, float]]] | None = None) -> dict:
    """``{"binary": {...}, "float": {...}, "step_time_ratio": binary/float median step,
    "meta": {...}, "history": {twin: [per-epoch logs]}}``; the ratio is present when both twins
    are, ``meta`` and ``history`` when given."""
    report: dict[str, Any] = dict(twins)
    if "binary" in twins and "float" in twins:
        b, f = twins["binary"]["median_step_ms"], twins["float"]["median_step_ms"]
        report["step_time_ratio"] = b / f if f and math.isfinite(b) and math.isfinite(f) else None
    if meta:
        report["meta"] = meta
    if histories:
        report["history"] = {twin: list(h) for twin, h in histories.items()}
    return report


#: Report columns, in order: ``binary_no_distill`` is the binary twin trained without
#: distillation (``bnn compare --ablate distill``).
_TWINS = figures.TWINS


def _fmt(value: Any, kind: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    if kind == "yes":
        return "yes" if value else "no"
    return {"pct": f"{100 * value:.2f}%", "ms": f"{value:.1f}", "int": f"{int(value):,}",
            "s": f"{value:.0f}", "rate": f"{value:,.0f}"}[kind]


def _xla_reasons(report: dict) -> list[str]:
    """Why each twin's train step was (not) compiled by XLA, one line each."""
    return [f"{p}: {'XLA' if report[p].get('xla') else 'no XLA'} "
            f"({report[p]['xla_reason']})" for p in _twins(report) if report[p].get("xla_reason")]


def _twins(report: dict) -> list[str]:
    return [p for p in _TWINS if p in report]


def _has_curves(report: dict) -> bool:
    return any(report.get("history", {}).values())


def to_markdown(report: dict, figure: str | None = None) -> str:
    """The report as markdown; ``figure`` is the image file to embed beside it (None: a line
    that says how to get one, when the report has curves to draw)."""
    twins = _twins(report)
    meta = report.get("meta", {})
    lines = [f"# {meta.get('name', 'bnn run')}", ""]
    if meta:
        lines += [f"- {k}: {v}" for k, v in meta.items() if k != "name"] + [""]
    if figure:
        lines += [f"![test accuracy, training loss and step time of each twin]({figure})", ""]
    elif _has_curves(report) and not figures.available():
        lines += [f"(For a figure of the curves: `{figures.INSTALL_HINT}`, then run again.)", ""]
    lines += ["| figure | " + " | ".join(twins) + " |", "|---|" + "---|" * len(twins)]
    for label, key, kind in _ROWS:
        lines.append(f"| {label} | " + " | ".join(_fmt(report[p].get(key), kind) for p in twins)
                     + " |")
    if report.get("step_time_ratio") is not None:
        lines += ["", f"Binary / float median train step: **{report['step_time_ratio']:.2f}**"]
    if _xla_reasons(report):
        lines += ["", "XLA: " + "; ".join(_xla_reasons(report))]
    if len(twins) > 1:
        total = sum(report[p].get("wall_seconds", 0.0) for p in twins)
        lines += ["", f"Wall time of all twins together: {_fmt(total, 's')} s"]
    lines += ["", "Curves over time: `tensorboard --logdir <this run directory>`", ""]
    return "\n".join(lines)


def to_html(report: dict, svg: str | None) -> str:
    """The report as one self-contained HTML page: the figure inlined as SVG, the table."""
    twins = _twins(report)
    meta = report.get("meta", {})
    title = html.escape(str(meta.get("name", "bnn run")))
    items = "".join(f"<li>{html.escape(str(k))}: {html.escape(str(v))}</li>"
                    for k, v in meta.items() if k != "name")
    head = "".join(f"<th>{t}</th>" for t in twins)
    rows = "".join(f"<tr><td>{label}</td>" + "".join(
        f"<td>{_fmt(report[p].get(key), kind)}</td>" for p in twins) + "</tr>"
        for label, key, kind in _ROWS)
    ratio = report.get("step_time_ratio")
    ratio_line = (f"<p>Binary / float median train step: <b>{ratio:.2f}</b></p>"
                  if ratio is not None else "")
    if _xla_reasons(report):
        ratio_line += f"<p>XLA: {html.escape('; '.join(_xla_reasons(report)))}</p>"
    figure = svg[svg.index("<svg"):] if svg else (
        f"<p>(For a figure of the curves: <code>{figures.INSTALL_HINT}</code>.)</p>"
        if _has_curves(report) else "")
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{title}</title><style>body{{font-family:sans-serif;max-width:1200px;"
            "margin:2em auto}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;"
            "padding:4px 10px;text-align:right}}td:first-child{{text-align:left}}"
            f"svg{{max-width:100%;height:auto}}</style></head><body><h1>{title}</h1>"
            f"<ul>{items}</ul>{figure}<table><tr><th>figure</th>{head}</tr>{rows}</table>"
            f"{ratio_line}</body></html>\n")


def write_report(run_dir: Path, report: dict, html_page: bool = False) -> list[Path]:
    """Writes ``report.json``, the figure (``report.png``, ``report.svg``: when matplotlib is
    installed and the report has curves), ``report.md`` and, with ``html_page``, ``report.html``;
    returns the paths written."""
    run_dir = Path(run_dir)
    written = [run_dir / "report.json"]
    write_json(written[0], report)
    svg = None
    if _has_curves(report) and figures.available():
        for name in FIGURE_NAMES:
            data = figures.render(report, name.rsplit(".", 1)[1])
            atomic_write(run_dir / name, data)
            written.append(run_dir / name)
        svg = (run_dir / "report.svg").read_text(encoding="utf-8")
    atomic_write(run_dir / "report.md", to_markdown(report, FIGURE_NAMES[0] if svg else None))
    written.append(run_dir / "report.md")
    if html_page:
        atomic_write(run_dir / "report.html", to_html(report, svg))
        written.append(run_dir / "report.html")
    return written
