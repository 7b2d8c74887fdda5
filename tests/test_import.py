"""``import bnn`` does the same in every process, however it was started: it imports no
TensorFlow, and bnn's Keras objects are registered once Keras loads, whichever is imported
first, so saved models load without custom objects."""

import os
import subprocess
import sys

import pytest

from support import ROOT

SAVED = ROOT / "tests" / "fixtures" / "v0.1.0" / "every_layer.keras"


def _run(code: str, argv0: str | None = None, cwd=None) -> str:
    """Runs ``code`` as a script (named ``argv0`` where given) in a fresh process; its output."""
    script = ["-c", code] if argv0 is None else ["-c", f"import sys; sys.argv[0] = {argv0!r}\n"
                                                       + code]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run([sys.executable, *script], capture_output=True, text=True,
                            timeout=300, env=env, cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.split()


@pytest.mark.parametrize("argv0, cwd", [
    (None, None), ("bnn", None), (str(ROOT / "benchmarks" / "step_time.py"), ROOT / "benchmarks"),
    ("/usr/local/bin/train_my_model.py", None)],
    ids=["python -c", "the bnn command", "a benchmark script", "a user's script"])
def test_importing_bnn_imports_no_tensorflow_however_started(argv0, cwd):
    out = _run("import sys, bnn\n"
               "print('tensorflow' in sys.modules, 'keras' in sys.modules, "
               "callable(bnn.import_all))", argv0, cwd)
    assert out == ["False", "False", "True"]


@pytest.mark.parametrize("first", [
    "import bnn\nimport keras",
    "import keras\nimport bnn",
    "import tensorflow\nimport bnn\nimport keras",
    "from bnn.layers import BinaryDense\nimport keras",
    "import bnn.optimizers\nimport keras",
    "import bnn.larq as lq\nimport keras",
], ids=["bnn then keras", "keras then bnn", "tensorflow first", "a layer first", "optimizers first",
        "bnn.larq first"])
def test_saved_models_load_without_custom_objects_whatever_is_imported_first(first):
    out = _run(f"{first}\nmodel = keras.saving.load_model({str(SAVED)!r})\n"
               "print(model.name, type(model.layers[1]).__module__)")
    assert out == ["every_layer", "bnn.layers.conv"]


def test_public_names_and_the_modules_earlier_versions_documented_resolve():
    out = _run("import bnn\n"
               "names = [bnn.BinaryDense, bnn.BinaryConv2D, bnn.ste_sign, bnn.WeightClip,\n"
               "         bnn.GradientReversal, bnn.custom_gradient, bnn.straight_through,\n"
               "         bnn.reverse_gradient, bnn.models.build, bnn.data.make_datasets,\n"
               "         bnn.metrics.FlipRatio, bnn.export.export_model,\n"
               "         bnn.allocator.select_pooling_allocator, bnn.summary.summarize,\n"
               "         bnn.optimizers.make_optimizer, bnn.quantizers.get]\n"
               "from bnn import data, export, metrics\n"
               "print(all(callable(n) for n in names), data.__name__, export.__name__,\n"
               "      metrics.__name__, {'BinaryDense', 'larq'} <= set(dir(bnn)))")
    assert out == ["True", "bnn.train.data", "bnn.packed.export", "bnn.train.metrics", "True"]


def test_module_names_earlier_versions_documented_still_import():
    out = _run("import bnn.data, bnn.train.data\n"
               "from bnn.metrics import FlipRatio\n"
               "from bnn.config import load_config\n"
               "from bnn.export import export_model\n"
               "from bnn.train.metrics import FlipRatio as Same\n"
               "print(bnn.data is bnn.train.data, FlipRatio is Same, load_config.__module__,\n"
               "      export_model.__module__)")
    assert out == ["True", "True", "bnn.train.config", "bnn.packed.export"]
