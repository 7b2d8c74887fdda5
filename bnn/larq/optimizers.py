"""Larq's ``larq.optimizers``: ``Bop`` and ``CaseOptimizer`` with Larq's semantics.

* :class:`Bop` updates exactly as Larq's: the weights it trains become ±1 at its first step and
  stay ±1 (bnn's :class:`bnn.optimizers.Bop` only flips signs and keeps ``|w|``).
* :class:`CaseOptimizer` takes Larq's ``(predicate, optimizer)`` pairs and
  ``default_optimizer``: a variable claimed by two predicates, or an optimizer that claims no
  variable, is an error; without a default optimizer, unclaimed variables are not trained.

Both are Keras 3 optimizers; ``default_optimizer`` is any Keras 3 optimizer
(``tf.keras.optimizers.Adam(...)`` on TensorFlow 2.16+ is one).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import keras
from keras import ops

from bnn import optimizers as bo

__all__ = ["Bop", "CaseOptimizer"]

_Schedule = keras.optimizers.schedules.LearningRateSchedule


def _hyper(value: Any) -> Any:
    return value if isinstance(value, _Schedule) else float(value)


def _serialize_hyper(value: Any) -> Any:
    return keras.saving.serialize_keras_object(value) if isinstance(value, _Schedule) else value


def _deserialize_hyper(value: Any) -> Any:
    return keras.saving.deserialize_keras_object(value) if isinstance(value, dict) else value


@keras.saving.register_keras_serializable(package="bnn.larq")
class Bop(bo.Bop):
    r"""Larq's binary optimizer. Per weight :math:`w` with gradient :math:`g`, per step:

    .. math::
        m &\leftarrow m + \gamma\,(g - m) \\
        w &\leftarrow \mathrm{sign}(-\mathrm{sign}(w\,m - \tau)\,w)

    with the outer sign +1 at 0 and the inner one 0 at 0: ``w`` flips where :math:`w m > \tau`
    and every trained weight becomes ±1. ``threshold`` (:math:`\tau`) and ``gamma``
    (:math:`\gamma`) may be ``LearningRateSchedule``\ s, evaluated at the step count.

    Train only binary kernels with it (see :class:`CaseOptimizer` and
    :meth:`is_binary_variable`).
    """

    def __init__(self, threshold: Any = 1e-8, gamma: Any = 1e-4, name: str = "Bop", **kwargs):
        kwargs.pop("learning_rate", None)
        keras.optimizers.Optimizer.__init__(self, learning_rate=_hyper(gamma), name=name,
                                            **kwargs)
        self.threshold = _hyper(threshold)

    def _threshold(self, dtype):
        if isinstance(self.threshold, _Schedule):
            return ops.cast(self.threshold(self.iterations), dtype)
        return ops.cast(self.threshold, dtype)

    def update_step(self, gradient, variable, learning_rate) -> None:
        gamma = ops.cast(learning_rate, variable.dtype)
        m = self._momentums[self._get_variable_index(variable)]
        self.assign(m, m + gamma * (ops.cast(gradient, variable.dtype) - m))
        pushed = -ops.sign(variable * m - self._threshold(variable.dtype)) * variable
        self.assign(variable, ops.where(pushed >= 0, ops.ones_like(variable),
                                        -ops.ones_like(variable)))

    def get_config(self) -> dict[str, Any]:
        config = keras.optimizers.Optimizer.get_config(self)
        config["gamma"] = config.pop("learning_rate")
        return {**config, "threshold": _serialize_hyper(self.threshold)}

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects=None) -> Bop:
        config = dict(config)
        for key in ("gamma", "threshold"):
            if key in config:
                config[key] = _deserialize_hyper(config[key])
        return cls(**config)

    @staticmethod
    def is_binary_variable(var) -> bool:
        """True for variables tagged ``precision == 1``: the kernels of
        :mod:`bnn.larq.layers` layers whose quantizer has 1-bit outputs (``"ste_sign"``,
        ``NoOp(precision=1)``, ...)."""
        return getattr(var, "precision", 32) == 1


@keras.saving.register_keras_serializable(package="bnn.larq")
class _Untrained(keras.optimizers.Optimizer):
    """Leaves its variables as they are: where a :class:`CaseOptimizer` without
    ``default_optimizer`` sends the variables no predicate claims."""

    def __init__(self, name: str = "untrained", **kwargs):
        kwargs.pop("learning_rate", None)
        super().__init__(learning_rate=0.0, name=name, **kwargs)

    def update_step(self, gradient, variable, learning_rate) -> None:
        return None

    def apply(self, grads, trainable_variables=None) -> None:
        return None


@keras.saving.register_keras_serializable(package="bnn.larq")
class CaseOptimizer(bo.CaseOptimizer):
    """Larq's ``CaseOptimizer(*predicate_optimizer_pairs, default_optimizer=None)``.

    Each variable is trained by the optimizer whose predicate claims it, or by
    ``default_optimizer`` when none does. At the first step (when Keras builds the optimizer):

    * a variable claimed by two predicates raises ValueError;
    * an optimizer whose predicate claims no variable raises ValueError;
    * without ``default_optimizer``, unclaimed variables stay as they are, with a warning.

    Saved models record which variables each optimizer trains (the predicates themselves are not
    saved), as Larq does.

    Raises:
        TypeError: for a predicate that is not callable or an optimizer that is not a Keras
            optimizer.
    """

    def __init__(self, *predicate_optimizer_pairs: tuple[Callable, keras.optimizers.Optimizer],
                 default_optimizer: keras.optimizers.Optimizer | None = None,
                 name: str = "optimizer_case", **kwargs):
        for i, pair in enumerate(predicate_optimizer_pairs):
            predicate, optimizer = pair
            if not callable(predicate):
                raise TypeError(f"expected a callable predicate at predicate_optimizer_pairs[{i}]"
                                f"[0], got {type(predicate).__name__}")
            if not isinstance(optimizer, keras.optimizers.Optimizer):
                raise TypeError(f"expected a Keras optimizer at predicate_optimizer_pairs[{i}][1],"
                                f" got {type(optimizer).__name__}")
        if default_optimizer is not None and not isinstance(default_optimizer,
                                                            keras.optimizers.Optimizer):
            raise TypeError(f"expected a Keras optimizer for default_optimizer, got "
                            f"{type(default_optimizer).__name__}")
        super().__init__(*predicate_optimizer_pairs,
                         default=_Untrained() if default_optimizer is None else default_optimizer,
                         name=name, **kwargs)
        self._has_default = default_optimizer is not None

    def _route(self, variable) -> int:
        claims = [i for i, predicate in enumerate(self.predicates) if predicate(variable)]
        if len(claims) > 1:
            raise ValueError(f"variable {variable.path!r} is claimed by optimizers {claims}; "
                             "each variable may be claimed by one predicate only")
        return claims[0] if claims else len(self.optimizers) - 1

    def build(self, variables) -> None:
        if self.built:
            return
        routes = [self._route(variable) for variable in variables]
        for i, optimizer in enumerate(self.optimizers[:-1]):
            if i not in routes:
                raise ValueError(f"optimizer {optimizer.name!r} (case {i}) did not claim any "
                                 "variables; check its predicate")
        unclaimed = [v.path for v, r in zip(variables, routes) if r == len(self.optimizers) - 1]
        if unclaimed and not self._has_default:
            warnings.warn(f"no default_optimizer: {len(unclaimed)} variables claimed by no "
                          f"predicate are not trained ({', '.join(unclaimed[:3])}...)",
                          stacklevel=2)
        super().build(variables)

    def get_config(self) -> dict[str, Any]:
        if self.built:
            variables = self._trainable_variables
            predicates = [bo.VariablePaths.of([variables[i] for i in indices])
                          for indices in self._routes[:-1]]
        else:
            predicates = self.predicates
        for i, predicate in enumerate(predicates):
            if not hasattr(predicate, "get_config"):
                raise ValueError(
                    f"CaseOptimizer case {i} has predicate {predicate!r}, which cannot be saved "
                    "before the optimizer is built; save after the first training step (the "
                    "variables each optimizer trains are then saved instead of the predicates)")
        cases = [{"predicate": keras.saving.serialize_keras_object(p),
                  "optimizer": keras.saving.serialize_keras_object(o)}
                 for p, o in zip(predicates, self.optimizers[:-1])]
        default = (keras.saving.serialize_keras_object(self.optimizers[-1])
                   if self._has_default else None)
        return {"name": self.name, "cases": cases, "default_optimizer": default}

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects=None) -> CaseOptimizer:
        config = dict(config)

        def load(item):
            return keras.saving.deserialize_keras_object(item, custom_objects=custom_objects)

        cases = [(load(c["predicate"]), load(c["optimizer"])) for c in config.pop("cases")]
        default = config.pop("default_optimizer")
        return cls(*cases, default_optimizer=None if default is None else load(default),
                   **config)
