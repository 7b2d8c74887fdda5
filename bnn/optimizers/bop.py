"""``Bop``, the binary optimizer: binary weights flip instead of taking gradient steps."""

from __future__ import annotations

from typing import Any, Sequence

import keras
from keras import ops

__all__ = ["Bop"]


@keras.saving.register_keras_serializable(package="bnn")
class Bop(keras.optimizers.Optimizer):
    r"""Binary optimizer (Bop): flips a binary weight when a consistent gradient pushes against it.

    For each weight :math:`w` (stored ±1, or a latent weight whose sign is used) with gradient
    :math:`g`, per step:

    .. math::
        m &\leftarrow (1 - \gamma)\,m + \gamma\,g \\
        w &\leftarrow -w \quad\text{where } |m| > \tau \text{ and } \mathrm{sign}(m) =
        \mathrm{sign}(w)

    with :math:`\mathrm{sign}(0) = +1`. Only signs change: :math:`|w|` stays what it was, so a
    ``WeightClip`` constraint on a Bop-managed kernel never alters it (clipping keeps the sign and
    ``|-w| = |w|``), and a kernel scale ``mean(|W|)`` stays at its initial value.

    Args:
        threshold: :math:`\tau`, the momentum magnitude a flip needs (paper: 1e-8 to 1e-6).
        gamma: :math:`\gamma`, the adaptivity rate of the gradient moving average (paper: 1e-4
            to 1e-3). A float or a ``keras.optimizers.schedules.LearningRateSchedule``; Keras
            stores it as this optimizer's ``learning_rate``, so schedules and learning-rate
            callbacks decay :math:`\gamma` as in the paper.
        name: optimizer name.

    Use it only on binary kernels (see :class:`CaseOptimizer` and :func:`make_optimizer`);
    on real-valued weights it flips signs, which is meaningless.
    """

    def __init__(self, threshold: float = 1e-8, gamma: Any = 1e-4, name: str = "bop", **kwargs):
        if not float(threshold) >= 0:
            raise ValueError(f"Bop threshold must be >= 0, got {threshold!r}")
        if isinstance(gamma, (int, float)) and not 0 < float(gamma) <= 1:
            raise ValueError(f"Bop gamma must be in (0, 1], got {gamma!r}")
        kwargs.pop("learning_rate", None)
        super().__init__(learning_rate=float(gamma) if isinstance(gamma, (int, float)) else gamma,
                         name=name, **kwargs)
        self.threshold = float(threshold)

    def build(self, variables: Sequence) -> None:
        if self.built:
            return
        super().build(variables)
        self._momentums = self.add_optimizer_variables(variables, "momentum")

    def update_step(self, gradient, variable, learning_rate) -> None:
        gamma = ops.cast(learning_rate, variable.dtype)
        gradient = ops.cast(gradient, variable.dtype)
        m = self._momentums[self._get_variable_index(variable)]
        self.assign(m, (1.0 - gamma) * m + gamma * gradient)
        flip = ops.logical_and(ops.abs(m) > ops.cast(self.threshold, variable.dtype),
                               ops.equal(m >= 0, variable >= 0))
        self.assign(variable, ops.where(flip, -variable, variable))

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config["gamma"] = config.pop("learning_rate")
        return {**config, "threshold": self.threshold}
