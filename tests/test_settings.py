"""Importing bnn leaves the process's settings alone; select_pooling_allocator chooses
TensorFlow's pooling CPU allocator, keeps a setting the user made, and with it an XLA step's large
scratch block stops page-faulting on every call."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bnn import settings


def test_select_sets_the_variable_when_absent(monkeypatch):
    monkeypatch.delenv(settings.ALLOCATOR_VARIABLE, raising=False)
    assert settings.allocator_name() == "default"
    settings.select_pooling_allocator()
    assert os.environ[settings.ALLOCATOR_VARIABLE] == "true"
    assert settings.allocator_name() == "bfc"


@pytest.mark.parametrize("value, name", [("false", "default"), ("0", "default"),
                                         ("True", "bfc"), ("1", "bfc")])
def test_select_keeps_a_setting_the_user_made(monkeypatch, value, name):
    monkeypatch.setenv(settings.ALLOCATOR_VARIABLE, value)
    settings.select_pooling_allocator()
    assert os.environ[settings.ALLOCATOR_VARIABLE] == value
    assert settings.allocator_name() == name


_PROBE = textwrap.dedent("""
    import os, resource
    import tensorflow as tf
    import bnn
    bnn.settings.select_pooling_allocator()
    print(os.environ.get("TF_CPU_ALLOCATOR_USE_BFC"))
    step = tf.function(lambda: tf.reduce_sum(tf.random.uniform([16 << 20]) * 2.0),
                       jit_compile=True)  # 64 MiB of scratch per call
    step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        step()
    print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="page-fault counts are Linux's")
def test_the_pooling_allocator_lets_a_large_scratch_block_be_reused_across_calls():
    env = {k: v for k, v in os.environ.items() if k != settings.ALLOCATOR_VARIABLE}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True,
                         timeout=300, check=True).stdout.split()
    assert out[0] == "true"
    # A fresh 64 MiB block is 16 384 pages; a reused one faults on none of them.
    assert float(out[1]) < 1000, out


def test_importing_bnn_changes_no_environment_variable():
    probe = ("import os, json; before = dict(os.environ); import bnn, keras; "
             "print(json.dumps({k: v for k, v in os.environ.items() if before.get(k) != v}))")
    env = {k: v for k, v in os.environ.items()
           if k not in (settings.ALLOCATOR_VARIABLE, "TF_CPP_MIN_LOG_LEVEL")}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                         timeout=300, check=True).stdout.strip().splitlines()[-1]
    assert out == "{}"


def test_each_place_bnn_looks_for_comes_from_its_variable(monkeypatch, tmp_path):
    for name in ("BNN_CACHE_DIR", "XDG_CACHE_HOME", "CXX", "BNN_DATA_DIR", "BNN_DATA_URL",
                 "KERAS_HOME", "TF_CONFIG", "BNN_TF_LOG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert settings.cache_dir() == tmp_path / ".cache" / "bnn"
    assert settings.compilers() == ["g++", "c++", "clang++"]
    assert (settings.data_dir(), settings.data_url(), settings.tf_config()) == (None, None, "")
    assert settings.keras_home() == tmp_path / ".keras" and not settings.tensorflow_log()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert settings.cache_dir() == tmp_path / "xdg" / "bnn"
    for name, value in (("BNN_CACHE_DIR", "/c"), ("CXX", "clang++-17"), ("BNN_DATA_DIR", "/d"),
                        ("BNN_DATA_URL", "http://mirror/"), ("KERAS_HOME", "/k"),
                        ("TF_CONFIG", "{}"), ("BNN_TF_LOG", " Yes ")):
        monkeypatch.setenv(name, value)
    assert settings.cache_dir() == Path("/c")
    assert settings.compilers()[0] == "clang++-17"
    assert (settings.data_dir(), settings.data_url(), settings.tf_config()) == (
        "/d", "http://mirror/", "{}")
    assert settings.keras_home() == Path("/k") and settings.tensorflow_log()
