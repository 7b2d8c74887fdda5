"""The `bnn` command as a new user meets it, in real subprocesses: mistakes are one line on
stderr before TensorFlow is imported, and TensorFlow's start-up lines are silenced."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import ROOT

BNN = Path(sys.executable).with_name("bnn")
# The console script where pip installed one beside this Python, else `python -m bnn`.
COMMAND = [str(BNN)] if BNN.is_file() else [sys.executable, "-m", "bnn"]


def user_environment() -> dict:
    """This process's environment with TensorFlow's log level unset, as in a user's shell."""
    return {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "BNN_TF_LOG")}


def bnn(*args, cwd=None, **env):
    """Runs the bnn command in the user's environment (:func:`user_environment`)."""
    return subprocess.run(COMMAND + [str(a) for a in args], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env={**user_environment(), **env})


# What the command imported when it stopped, from inside the same process.
PROBE = """
import sys
sys.argv = ["bnn"] + sys.argv[1:]
from bnn.cli import main
try:
    code = main()
except SystemExit as exit:
    code = exit.code
print("tensorflow" in sys.modules, code)
"""


def imports_tensorflow(*args) -> tuple[bool, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, *map(str, args)], capture_output=True,
                         text=True, timeout=300).stdout.split()
    return out[-2] == "True", int(out[-1])


def test_an_empty_experiment_file_is_exactly_one_line_on_stderr(tmp_path):
    config = tmp_path / "empty.yaml"
    config.write_text("")
    result = bnn("train", config, "--output-dir", tmp_path / "run")
    assert result.returncode == 2
    assert result.stderr == (f"bnn: error: {config}: empty file (no settings); write at least "
                             "one section, e.g. 'training: {epochs: 10}'\n")
    assert result.stdout == ""
    assert not (tmp_path / "run").exists()


def test_a_misspelt_key_is_exactly_one_line_on_stderr(tmp_path):
    config = tmp_path / "typo.yaml"
    config.write_text("training: {epochs: 2, bach_size: 10}\n")
    result = bnn("compare", config, "--output-dir", tmp_path / "run")
    assert result.returncode == 2
    assert result.stderr.startswith(f"bnn: error: {config}: training.bach_size: unknown key; "
                                    "did you mean 'batch_size'? known keys: ")
    assert result.stderr.count("\n") == 1 and not (tmp_path / "run").exists()


@pytest.mark.parametrize("args", [["trian", "x.yaml"], [], ["train"], ["bench", "--xla", "no"],
                                  ["evaluate", "model.bnn"]],
                         ids=["unknown command", "no command", "no config", "bad flag value",
                              "missing required flag"])
def test_command_line_mistakes_are_one_line(args):
    result = bnn(*args)
    assert result.returncode == 2
    assert result.stderr.startswith("bnn: error: ") and result.stderr.count("\n") == 1, \
        result.stderr


@pytest.mark.parametrize("args", [["--help"], ["train", "--help"]], ids=["bnn", "bnn train"])
def test_help_does_not_import_tensorflow(args):
    result = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True,
                            timeout=300)
    assert "usage: bnn" in result.stdout
    assert result.stdout.split()[-2:] == ["False", "0"]


def test_config_mistakes_are_reported_before_tensorflow_is_imported(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("model: {name: vgg_smal}\n")
    assert imports_tensorflow("compare", config) == (False, 2)
    assert imports_tensorflow("train", ROOT / "experiments" / "mnist_mlp_quick.yaml",
                              "--data-dir", tmp_path / "nowhere") == (False, 2)
    assert imports_tensorflow("evaluate", tmp_path / "missing.bnn", "--dataset", "mnist") == (
        False, 2)


@pytest.mark.parametrize("args", [
    ["train", "--precision", "binary", "--set", "training.distill.teacher=nowhere"],
    ["train", "--precision", "binary", "--set", "training.distill.teacher=float_twin"],
    ["compare", "--ablate", "distill", "--set", "training.distill=null"]],
    ids=["missing teacher", "float twin not trained", "ablation without distillation"])
def test_distillation_mistakes_are_one_line_before_tensorflow_and_write_nothing(args, tmp_path):
    run = tmp_path / "run"
    config = ROOT / "experiments" / "cifar10_cpu_hour.yaml"
    result = bnn(args[0], config, *args[1:], "--output-dir", run, cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("bnn: error: ") and result.stderr.count("\n") == 1, \
        result.stderr
    assert "distill" in result.stderr and not run.exists()
    assert imports_tensorflow(args[0], config, *args[1:], "--output-dir", run) == (False, 2)


def test_tensorflow_start_up_lines_are_silenced_unless_verbose():
    config = ROOT / "experiments" / "mnist_mlp_quick.yaml"
    quiet = bnn("summary", config)
    assert quiet.returncode == 0 and "dense0" in quiet.stdout
    assert quiet.stderr == ""
    verbose = bnn("summary", config, BNN_TF_LOG="1")
    assert verbose.returncode == 0 and verbose.stderr != ""  # TensorFlow's own lines
    assert bnn("summary", config, "--verbose").stderr != ""


def test_python_dash_m_bnn_runs_the_command(tmp_path):
    result = subprocess.run([sys.executable, "-m", "bnn", "train", tmp_path / "none.yaml"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert result.stderr.startswith("bnn: error: ") and result.stderr.count("\n") == 1


@pytest.mark.parametrize("script", ["step_time", "inference", "conv_gradients", "user_script"])
def test_benchmark_scripts_start_without_tensorflow_log_lines(script):
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / f"{script}.py"), "--help"],
                            capture_output=True, text=True, timeout=300, env=user_environment())
    assert result.returncode == 0 and result.stdout.startswith("usage:")
    assert result.stderr == ""
