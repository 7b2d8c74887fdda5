"""``Bop``, the binary optimizer: binary weights flip instead of taking gradient steps."""

from __future__ import annotations

from typing import Any, Sequence

import keras
import tensorflow as tf
from keras import ops

__all__ = ["Bop"]

_Schedule = keras.optimizers.schedules.LearningRateSchedule


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

    ``gamma`` and ``threshold`` are settable attributes (``bop.threshold = 1e-7``): each is a
    float32 variable that every train step reads, so a value set between steps (by a callback)
    is the one the next step uses, under ``tf.function`` and XLA too. Reading them gives the
    variable (or the schedule the optimizer was made with). The threshold is saved in the
    config, not among ``variables`` (which hold the step count, ``learning_rate`` (gamma) and
    the momentums).

    Use it only on binary kernels (see :class:`CaseOptimizer` and :func:`make_optimizer`);
    on real-valued weights it flips signs, which is meaningless.
    """

    def __init__(self, threshold: Any = 1e-8, gamma: Any = 1e-4, name: str = "bop", **kwargs):
        kwargs.pop("learning_rate", None)
        super().__init__(learning_rate=self._checked_gamma(gamma), name=name, **kwargs)
        threshold = self._checked_threshold(threshold)
        if not isinstance(threshold, _Schedule):
            # a TensorFlow variable, not a Keras one: Keras would add it to ``variables``, and
            # optimizer state saved before it existed would no longer load
            threshold = tf.Variable(threshold, name="threshold", trainable=False,
                                    dtype=keras.backend.floatx())
        self._threshold = threshold

    # -- hyperparameters ----------------------------------------------------------------------

    @staticmethod
    def _checked_gamma(gamma: Any) -> Any:
        """``gamma`` as this optimizer takes it (a float in (0, 1], or a schedule or callable,
        as Keras takes a learning rate)."""
        if callable(gamma):
            return gamma
        if not 0 < float(gamma) <= 1:
            raise ValueError(f"Bop gamma must be in (0, 1], got {gamma!r}")
        return float(gamma)

    @staticmethod
    def _checked_threshold(threshold: Any) -> Any:
        """``threshold`` as this optimizer takes it (a float >= 0)."""
        if not float(threshold) >= 0:
            raise ValueError(f"Bop threshold must be >= 0, got {threshold!r}")
        return float(threshold)

    def _settable(self, name: str, held: Any, value: Any) -> Any:
        """``value``, if ``held`` (what holds hyperparameter ``name`` now) is a variable and
        ``value`` is not a schedule: a compiled step keeps reading the variable it was traced
        with, so a schedule must be given at construction."""
        if not isinstance(held, (tf.Variable, keras.Variable)):
            raise TypeError(f"{type(self).__name__} {name} is a schedule ({type(held).__name__}),"
                            f" which cannot be set; create the optimizer with a float {name} to "
                            "set it")
        if callable(value):
            raise TypeError(f"cannot set {type(self).__name__} {name} to a schedule after "
                            f"construction; pass the schedule as {name}= when creating it")
        return value

    @property
    def gamma(self) -> Any:
        r""":math:`\gamma`: the ``learning_rate`` variable (or schedule)."""
        return self._learning_rate

    @gamma.setter
    def gamma(self, value: Any) -> None:
        self.learning_rate = self._checked_gamma(self._settable("gamma", self._learning_rate,
                                                                value))

    @property
    def threshold(self) -> Any:
        r""":math:`\tau`: a float32 variable (or the schedule the optimizer was made with)."""
        return self._threshold

    @threshold.setter
    def threshold(self, value: Any) -> None:
        value = self._checked_threshold(self._settable("threshold", self._threshold, value))
        self._threshold.assign(value)

    def _current_threshold(self, dtype) -> Any:
        """The threshold this step uses, in ``dtype``: read from its variable at every step."""
        threshold = self._threshold
        if isinstance(threshold, _Schedule):
            threshold = threshold(self.iterations)
        return ops.cast(threshold, dtype)

    # -- the update ---------------------------------------------------------------------------

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
        flip = ops.logical_and(ops.abs(m) > self._current_threshold(variable.dtype),
                               ops.equal(m >= 0, variable >= 0))
        self.assign(variable, ops.where(flip, -variable, variable))

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config["gamma"] = config.pop("learning_rate")
        threshold = self._threshold
        threshold = (keras.saving.serialize_keras_object(threshold)
                     if isinstance(threshold, _Schedule) else float(threshold.numpy()))
        return {**config, "threshold": threshold}
