"""Dry runs of the CIFAR-10 recipes: each trains a few steps on a small subset on the CPU, with
its own model, pipeline, precision, distillation and test-time flips, so a recipe is known to run
before the hour (or the GPU) is spent on it."""

import json

import keras
import pytest

from bnn.train.config import load_config
from support import DATA_DIR, ROOT, run_cli

RECIPES = ROOT / "experiments"
needs_cifar = pytest.mark.skipif(not (DATA_DIR / "cifar-10-python.tar.gz").exists()
                                 and not (DATA_DIR / "cifar-10-batches-py").is_dir(),
                                 reason=f"needs CIFAR-10 in {DATA_DIR} (set BNN_DATA_DIR)")

# a few steps of a small subset; everything else as the recipe says
SMALL = ["training.epochs=1", "dataset.limit_train=32", "dataset.limit_test=32",
         "training.batch_size=16", "training.test_every=1"]


def overrides(*extra):
    return [arg for assignment in (*SMALL, *extra) for arg in ("--set", assignment)]


def test_recipes_distill_from_the_float_twin_in_bfloat16_with_test_time_augmentation():
    for name in ("cifar10_cpu_hour", "cifar10_speedrun"):
        config = load_config(RECIPES / f"{name}.yaml")
        assert config.name == name and config.model.name == "vgg_small"
        assert config.training.distill.teacher == "float_twin"
        assert config.training.mixed_precision == "bfloat16" and config.training.test_time_flip
        assert config.training.test_time_translate == 1
        assert config.model.options["real_first_layer"] is True
    speedrun = load_config(RECIPES / "cifar10_speedrun.yaml")
    assert speedrun.dataset.on_device and speedrun.training.xla


@pytest.fixture(scope="module")
def cpu_hour(tmp_path_factory):
    """`bnn compare` of the CPU-hour recipe: the float teacher, then the distilled student."""
    run = tmp_path_factory.mktemp("cpu_hour") / "run"
    assert run_cli("compare", RECIPES / "cifar10_cpu_hour.yaml", *overrides(),
                   "--output-dir", run) == 0
    return run


@needs_cifar
def test_cpu_hour_recipe_dry_run_trains_teacher_then_student(cpu_hour):
    report = json.loads((cpu_hour / "report.json").read_text())
    for twin in ("binary", "float"):
        assert report[twin]["epochs"] == 1 and 0.0 <= report[twin]["test_accuracy"] <= 1.0
        assert (cpu_hour / twin / "model.keras").is_file()
    assert report["binary"]["params"] == report["float"]["params"]
    # the recipe's bfloat16 policy held for its run only
    assert keras.mixed_precision.global_policy().name == "float32"


@needs_cifar
def test_speedrun_recipe_dry_run_trains_its_student_on_device_batches(cpu_hour, tmp_path):
    # the CPU-hour float twin (half width) stands in as the teacher: same images in, same
    # classes out;
    # XLA off: compiling the step for the CPU takes longer than the dry run itself
    run = tmp_path / "speedrun"
    assert run_cli("train", RECIPES / "cifar10_speedrun.yaml", "--precision", "binary",
                   *overrides(f"training.distill.teacher={cpu_hour}", "training.xla=false"),
                   "--output-dir", run) == 0
    report = json.loads((run / "report.json").read_text())
    assert report["binary"]["epochs"] == 1
    student = keras.models.load_model(run / "binary" / "model.keras")
    assert student.get_layer("conv5").filters == 512  # full width
