"""Which twins a run trains, in which order: the plan of ``bnn train`` and ``bnn compare``.

Nothing here imports TensorFlow, so the command line checks a plan before it starts training.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from bnn.config import DISTILL_FLOAT_TWIN, Config
from bnn.errors import TrainingError

__all__ = ["NO_DISTILL", "plan_twins"]

#: The run-directory name (and report key) of the binary twin trained without distillation
#: when ``bnn compare --ablate distill`` asks for it.
NO_DISTILL = "binary_no_distill"


def plan_twins(config: Config, precisions: Sequence[str],
               ablate: tuple[str, ...] = ()) -> list[tuple[str, str, Config]]:
    """``(label, precision, config)`` of each twin to train, in order. With distillation from
    the ``float_twin``, the float twin comes first (its model is the binary twin's teacher).
    ``ablate=("distill",)`` adds the binary twin without distillation, labelled
    :data:`NO_DISTILL`.

    Raises:
        TrainingError: for ``ablate=("distill",)`` when ``config`` does not distill.
    """
    distill = config.training.distill
    if "distill" in ablate and distill is None:
        raise TrainingError("--ablate distill compares the binary twin with and without "
                            "training.distill, which this config does not set; set it, e.g. "
                            "--set training.distill.teacher=float_twin")
    order = list(precisions)
    if distill is not None and distill.teacher == DISTILL_FLOAT_TWIN and "float" in order:
        order = ["float"] + [p for p in order if p != "float"]
    plan = [(p, p, config) for p in order]
    if "distill" in ablate and "binary" in order:
        plain = dataclasses.replace(config, training=dataclasses.replace(config.training,
                                                                         distill=None))
        plan.append((NO_DISTILL, "binary", plain))
    return plan
