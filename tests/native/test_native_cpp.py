"""The C++ unit tests of the native kernels (bnn/native/tests): every kernel family's variants that
this CPU runs against its plain reference kernel, built without TensorFlow by the system's C++
compiler and run; their output is shown on failure."""

from __future__ import annotations

import subprocess

import pytest

from bnn.native.build import compiler as find_compiler
from support import ROOT

NATIVE = ROOT / "bnn" / "native"


def test_native_kernels_equal_their_references(tmp_path):
    compiler = find_compiler()
    if compiler is None:
        pytest.skip("no C++ compiler found (set CXX or install g++)")
    binary = tmp_path / "bnn_native_tests"
    sources = sorted(str(path) for path in (NATIVE / "tests").glob("*.cc"))
    build = subprocess.run([compiler, "-std=c++17", "-O2", "-I", str(NATIVE / "src"), *sources,
                            "-o", str(binary)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, f"building the C++ tests failed:\n{build.stderr[-6000:]}"
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, (f"the C++ tests failed (exit code {run.returncode}):\n"
                                 f"{run.stdout[-8000:]}\n{run.stderr[-2000:]}")
    assert " tests passed" in run.stdout
