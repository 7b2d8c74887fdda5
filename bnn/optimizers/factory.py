"""``make_optimizer``: the optimizer of an experiment, by name -- the one place bnn builds one."""

from __future__ import annotations

from typing import Any

import keras

from bnn.catalog import OPTIMIZERS
from bnn.optimizers.adam import Adam
from bnn.optimizers.bop import Bop
from bnn.optimizers.case import CaseOptimizer, is_binary_variable_of

__all__ = ["make_optimizer"]


def make_optimizer(name: str, model: keras.Model, learning_rate: Any,
                   **kwargs: Any) -> keras.optimizers.Optimizer:
    """Builds the optimizer called ``name`` for ``model``.

    * ``"adam"``: :class:`Adam` ``(learning_rate, **kwargs)`` (any Keras Adam argument).
    * ``"sgd"``: ``keras.optimizers.SGD(learning_rate, momentum=0.9, nesterov=False)``; kwargs
      ``momentum``, ``nesterov`` and ``weight_decay``.
    * ``"bop"``: :class:`Bop` (kwargs ``threshold`` = 1e-8, ``gamma`` = 1e-4) on the model's
      binary kernels, ``Adam(learning_rate)`` on every other variable (a :class:`CaseOptimizer`).
      A model without binary kernels (a float twin) is trained entirely by the Adam part.

    ``learning_rate`` is a float or a ``keras.optimizers.schedules.LearningRateSchedule``.

    Raises:
        ValueError: for an unknown name or keyword, or a bad learning rate.
    """
    if isinstance(learning_rate, (int, float)) and not isinstance(learning_rate, bool):
        if not learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {learning_rate!r}")
        learning_rate = float(learning_rate)
    elif not isinstance(learning_rate, keras.optimizers.schedules.LearningRateSchedule):
        raise ValueError(
            f"learning_rate must be a float or a keras LearningRateSchedule, got {learning_rate!r}"
        )
    allowed = {"sgd": {"momentum", "nesterov", "weight_decay"}, "bop": {"threshold", "gamma"}}
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; known optimizers: {', '.join(OPTIMIZERS)}")
    unknown = sorted(set(kwargs) - allowed[name]) if name in allowed else []
    if unknown:
        raise ValueError(f"unknown option(s) {', '.join(unknown)} for optimizer {name!r}; "
                         f"allowed: {', '.join(sorted(allowed[name]))}")
    if name == "adam":
        try:
            return Adam(learning_rate, **kwargs)
        except (TypeError, ValueError) as error:
            raise ValueError(f"bad option for optimizer 'adam': {error}") from None
    if name == "sgd":
        return keras.optimizers.SGD(learning_rate, momentum=float(kwargs.get("momentum", 0.9)),
                                    nesterov=bool(kwargs.get("nesterov", False)),
                                    weight_decay=kwargs.get("weight_decay"))
    bop = Bop(threshold=kwargs.get("threshold", 1e-8), gamma=kwargs.get("gamma", 1e-4))
    return CaseOptimizer((is_binary_variable_of(model), bop),
                         default=Adam(learning_rate))
