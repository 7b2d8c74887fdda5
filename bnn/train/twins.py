"""Which twins a run trains, in which order: the plan of ``bnn train`` and ``bnn compare``.

Nothing here imports TensorFlow, so the command line checks a plan before it starts training.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

from bnn.train.config import DISTILL_FLOAT_TWIN, Config
from bnn.errors import TrainingError

__all__ = ["NO_DISTILL", "plan_twins", "teacher_path"]

#: The run-directory name (and report key) of the binary twin trained without distillation
#: when ``bnn compare --ablate distill`` asks for it.
NO_DISTILL = "binary_no_distill"


def teacher_path(teacher: str, run_dir: Path) -> Path:
    """The ``.keras`` file of ``training.distill.teacher``: ``RUN_DIR/float/model.keras`` for
    ``float_twin``, ``DIR/float/model.keras`` for a run directory ``DIR``, else the file itself.

    Raises:
        TrainingError: when there is no such file, saying how to make one.
    """
    if teacher == DISTILL_FLOAT_TWIN:
        path = Path(run_dir) / "float" / "model.keras"
        if not path.is_file():
            raise TrainingError(
                f"training.distill.teacher is float_twin but {path} does not exist; use bnn "
                "compare (it trains the float twin first), or set training.distill.teacher to "
                "the run directory of a float twin (bnn train --precision float)")
        return path
    path = Path(teacher).expanduser()
    if path.is_dir():
        path = path / "float" / "model.keras"
    if not path.is_file():
        raise TrainingError(
            f"training.distill.teacher: {path} does not exist; give a run directory with a "
            "trained float twin (float/model.keras) or a .keras file")
    return path


def plan_twins(config: Config, precisions: Sequence[str], ablate: tuple[str, ...] = (),
               run_dir: Path | None = None) -> list[tuple[str, str, Config]]:
    """``(label, precision, config)`` of each twin to train, in order. With distillation from
    the ``float_twin``, the float twin comes first (its model is the binary twin's teacher).
    ``ablate=("distill",)`` adds the binary twin without distillation, labelled
    :data:`NO_DISTILL`. Given the ``run_dir``, a teacher that no twin of the plan trains must
    exist already (:func:`teacher_path`).

    Raises:
        TrainingError: for ``ablate=("distill",)`` when ``config`` does not distill, or a
            missing teacher.
    """
    distill = config.training.distill
    if "distill" in ablate and distill is None:
        raise TrainingError("--ablate distill compares the binary twin with and without "
                            "training.distill, which this config does not set; set it, e.g. "
                            "--set training.distill.teacher=float_twin")
    order = list(precisions)
    if distill is not None and distill.teacher == DISTILL_FLOAT_TWIN and "float" in order:
        order = ["float"] + [p for p in order if p != "float"]
    if (distill is not None and run_dir is not None and "binary" in order
            and not (distill.teacher == DISTILL_FLOAT_TWIN and "float" in order)):
        teacher_path(distill.teacher, run_dir)
    plan = [(p, p, config) for p in order]
    if "distill" in ablate and "binary" in order:
        plain = dataclasses.replace(config, training=dataclasses.replace(config.training,
                                                                         distill=None))
        plan.append((NO_DISTILL, "binary", plain))
    return plan
