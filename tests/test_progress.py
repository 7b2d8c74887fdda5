"""Progress lines for long phases: one line when a phase ends, none when it fails or is off."""

import io
import time

import pytest

from bnn import progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_phase_prints_one_line_with_its_seconds_off_a_terminal():
    out = io.StringIO()
    with progress.phase("loading mnist", out):
        pass
    assert out.getvalue().startswith("bnn: loading mnist: ")
    assert out.getvalue().endswith(" s\n") and out.getvalue().count("\n") == 1


def test_a_failing_phase_prints_nothing_so_the_error_is_the_only_line():
    out = io.StringIO()
    with pytest.raises(ValueError):
        with progress.phase("loading mnist", out):
            raise ValueError("bad file")
    assert out.getvalue() == ""


def test_on_a_terminal_a_spinner_runs_and_is_cleared_before_the_line():
    out = Terminal()
    line = progress.Phase("compiling", out, interval=0.01).start()
    time.sleep(0.1)
    seconds = line.stop()
    text = out.getvalue()
    assert "\r| compiling: 0 s" in text or "\r/ compiling: 0 s" in text
    assert text.endswith("\r\033[K" + f"bnn: compiling: {seconds:.1f} s\n")


def test_disabled_progress_prints_nothing():
    out = Terminal()
    with progress.enabled(False):
        with progress.phase("loading", out):
            pass
    assert out.getvalue() == ""


def test_enabled_restores_the_setting_before_it_even_after_an_error():
    with pytest.raises(RuntimeError):
        with progress.enabled(False):
            raise RuntimeError("stop")
    out = io.StringIO()
    with progress.phase("loading", out):
        pass
    assert out.getvalue().startswith("bnn: loading: ")
