"""report.json / report.md / the figure / report.html of a run, from the twins' figures and
per-epoch histories."""

import json
import struct

import pytest

from bnn.tools import figures, report


def history(accuracies, losses):
    return [{"test_accuracy": a, "loss": l, "step_time_ms": 2.0}
            for a, l in zip(accuracies, losses)]


def twin(accuracy, step_ms):
    return {"test_accuracy": accuracy, "best_test_accuracy": accuracy, "median_step_ms": step_ms,
            "examples_per_second": 100 / step_ms * 1e3, "params": 1000, "epochs": 3,
            "wall_seconds": 12.0}


REPORT = report.build_report(
    {"binary": twin(0.9, 20.0), "float": twin(0.95, 25.0)}, {"name": "demo", "dataset": "mnist"},
    {"binary": history([0.8, 0.85, 0.9], [1.0, 0.6, 0.4]),
     "float": history([0.9, 0.93, 0.95], [0.5, 0.3, 0.2])})


def test_report_json_holds_both_twins_the_ratio_and_the_curves(tmp_path):
    report.write_report(tmp_path, REPORT)
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["step_time_ratio"] == pytest.approx(0.8)
    assert [h["test_accuracy"] for h in data["history"]["float"]] == [0.9, 0.93, 0.95]


@pytest.mark.skipif(not figures.available(), reason="needs matplotlib (pip install 'bnn[report]')")
def test_the_figure_is_written_as_png_and_svg_and_embedded_in_report_md(tmp_path):
    written = report.write_report(tmp_path, REPORT, html_page=True)
    assert [p.name for p in written] == ["report.json", "report.png", "report.svg", "report.md",
                                         "report.html"]
    png = (tmp_path / "report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert (width, height) == (1200, 360)
    svg = (tmp_path / "report.svg").read_text()
    for text in ("test accuracy", "training loss", "median train step", "binary", "float"):
        assert text in svg or text.replace(" ", "") in svg.replace(" ", ""), text
    assert "![" in (tmp_path / "report.md").read_text()
    assert "(report.png)" in (tmp_path / "report.md").read_text()


@pytest.mark.skipif(not figures.available(), reason="needs matplotlib (pip install 'bnn[report]')")
def test_report_html_is_self_contained(tmp_path):
    report.write_report(tmp_path, REPORT, html_page=True)
    page = (tmp_path / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page and "</html>" in page
    assert "src=" not in page and "href=\"http" not in page
    assert "<td>90.00%</td><td>95.00%</td>" in page


def test_without_matplotlib_report_md_says_how_to_get_the_figure(tmp_path, monkeypatch):
    monkeypatch.setattr(figures, "available", lambda: False)
    written = report.write_report(tmp_path, REPORT)
    assert [p.name for p in written] == ["report.json", "report.md"]
    assert figures.INSTALL_HINT in (tmp_path / "report.md").read_text()
    assert not (tmp_path / "report.png").exists()


def test_a_report_without_curves_has_no_figure(tmp_path):
    plain = report.build_report({"binary": twin(0.9, 20.0)})
    assert [p.name for p in report.write_report(tmp_path, plain)] == ["report.json", "report.md"]
    assert "![" not in (tmp_path / "report.md").read_text()
