"""Larq's ``larq.optimizers``: ``Bop`` and ``CaseOptimizer`` with Larq's semantics.

* :class:`Bop` updates exactly as Larq's: the weights it trains become ±1 at its first step and
  stay ±1 (bnn's :class:`bnn.optimizers.Bop` only flips signs and keeps ``|w|``).
* :class:`CaseOptimizer` takes Larq's ``(predicate, optimizer)`` pairs and
  ``default_optimizer``: a variable claimed by two predicates, or an optimizer that claims no
  variable, is an error; without a default optimizer, unclaimed variables are not trained. It
  saves, as Larq's does, before and after its first step (``keras.optimizers.serialize``,
  ``model.save``), and its ``variables`` hold each optimizer's state (Larq's ``weights``).

Both are Keras 3 optimizers; ``default_optimizer`` is any Keras 3 optimizer
(``tf.keras.optimizers.Adam(...)`` on TensorFlow 2.16+ is one).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import keras
from keras import ops

from bnn import optimizers as bo
from bnn.optimizers.case import saveable

__all__ = ["Bop", "CaseOptimizer"]

_Schedule = keras.optimizers.schedules.LearningRateSchedule


def _hyper(value: Any) -> Any:
    return value if isinstance(value, _Schedule) else float(value)


def _deserialize_hyper(value: Any, custom_objects=None) -> Any:
    """A float, or a schedule from its Keras 3 or tf-keras (Larq's) config. tf-keras saves an
    unnamed schedule with ``name: None``, which Keras 3's schedules cannot run with: they then
    take their default name."""
    if not isinstance(value, dict):
        return value
    value = dict(value)
    if isinstance(value.get("config"), dict) and value["config"].get("name", "") is None:
        value["config"] = {k: v for k, v in value["config"].items() if k != "name"}
    return keras.optimizers.schedules.deserialize(value, custom_objects=custom_objects)


@keras.saving.register_keras_serializable(package="bnn.larq")
class Bop(bo.Bop):
    r"""Larq's binary optimizer. Per weight :math:`w` with gradient :math:`g`, per step:

    .. math::
        m &\leftarrow m + \gamma\,(g - m) \\
        w &\leftarrow \mathrm{sign}(-\mathrm{sign}(w\,m - \tau)\,w)

    with the outer sign +1 at 0 and the inner one 0 at 0: ``w`` flips where :math:`w m > \tau`
    and every trained weight becomes ±1. ``threshold`` (:math:`\tau`) and ``gamma``
    (:math:`\gamma`) may be ``LearningRateSchedule``\ s, evaluated at the step count. Given as
    numbers, they are settable attributes read at every step (``bop.gamma = 1e-3``, or
    :class:`bnn.larq.callbacks.HyperparameterScheduler`), as in Larq.

    Train only binary kernels with it (see :class:`CaseOptimizer` and
    :meth:`is_binary_variable`).
    """

    def __init__(self, threshold: Any = 1e-8, gamma: Any = 1e-4, name: str = "Bop", **kwargs):
        super().__init__(threshold=threshold, gamma=gamma, name=name, **kwargs)

    # Larq takes any number or schedule for both
    _checked_gamma = staticmethod(_hyper)
    _checked_threshold = staticmethod(_hyper)

    def update_step(self, gradient, variable, learning_rate) -> None:
        gamma = ops.cast(learning_rate, variable.dtype)
        m = self._momentums[self._get_variable_index(variable)]
        self.assign(m, m + gamma * (ops.cast(gradient, variable.dtype) - m))
        pushed = -ops.sign(variable * m - self._current_threshold(variable.dtype)) * variable
        self.assign(variable, ops.where(pushed >= 0, ops.ones_like(variable),
                                        -ops.ones_like(variable)))

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects=None) -> Bop:
        config = dict(config)
        for key in ("gamma", "threshold"):
            if key in config:
                config[key] = _deserialize_hyper(config[key], custom_objects)
        return cls(**config)

    @staticmethod
    def is_binary_variable(var) -> bool:
        """True for variables tagged ``precision == 1``: the kernels of
        :mod:`bnn.larq.layers` layers whose quantizer has 1-bit outputs (``"ste_sign"``,
        ``NoOp(precision=1)``, ...). A :class:`CaseOptimizer` saves it as a predicate."""
        return getattr(var, "precision", 32) == 1


keras.saving.register_keras_serializable("bnn.larq", "is_binary_variable")(Bop.is_binary_variable)


def _not_saved(variable) -> bool:
    """Stands for a predicate that a saved :class:`CaseOptimizer` could not keep (Larq keeps
    none): it claims no variable."""
    return False


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

    Saved after its first step, it records which variables each optimizer trains, as Larq does.
    Saved before, it records each predicate that Keras can save (:meth:`Bop.is_binary_variable`,
    a registered function, :class:`bnn.optimizers.VariablePaths`); another predicate (a lambda)
    is not saved, as in Larq, and the loaded optimizer says so if that case is used.

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
        unclaimed = [v.path for v, r in zip(variables, routes) if r == len(self.optimizers) - 1]
        if unclaimed and not self._has_default:
            warnings.warn(f"no default_optimizer: {len(unclaimed)} variables claimed by no "
                          f"predicate are not trained ({', '.join(unclaimed[:3])}...)",
                          stacklevel=2)
        super().build(variables)

    def apply(self, grads, trainable_variables=None) -> None:
        """As :class:`bnn.optimizers.CaseOptimizer`; first, as Larq, a ValueError if one of the
        optimizers claims no variable (checked here, not when Keras builds this optimizer on
        loading a model, so that a model loads whatever its variables)."""
        if not self.built and trainable_variables is not None:
            self.build(list(trainable_variables))
        for i, (predicate, indices) in enumerate(zip(self.predicates, self._routes)):
            if not indices:
                name = self.optimizers[i].name
                if predicate is _not_saved:
                    raise ValueError(
                        f"optimizer {name!r} (case {i}) has no predicate: it was not saved with "
                        "this CaseOptimizer (Keras saves Bop.is_binary_variable and registered "
                        "functions, not lambdas); compile with a new CaseOptimizer")
                if predicate is Bop.is_binary_variable:
                    raise ValueError(
                        f"optimizer {name!r} (case {i}) did not claim any variables: "
                        "Bop.is_binary_variable claims the kernels that bnn.larq's layers tag "
                        "as 1-bit, and a loaded model's layers (bnn's) carry no tags; use "
                        "bnn.optimizers.is_binary_variable_of(model) as the predicate")
                raise ValueError(f"optimizer {name!r} (case {i}) did not claim any variables; "
                                 "check its predicate")
        return super().apply(grads, trainable_variables)

    def get_config(self) -> dict[str, Any]:
        if self.built:
            variables = self._trainable_variables
            predicates = [bo.VariablePaths.of([variables[i] for i in indices])
                          for indices in self._routes[:-1]]
        else:
            predicates = self.predicates
        cases = [{"predicate": keras.saving.serialize_keras_object(p) if saveable(p) else None,
                  "optimizer": keras.saving.serialize_keras_object(o)}
                 for p, o in zip(predicates, self.optimizers[:-1])]
        default = (keras.saving.serialize_keras_object(self.optimizers[-1])
                   if self._has_default else None)
        return {"name": self.name, "cases": cases, "default_optimizer": default}

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects=None) -> CaseOptimizer:
        config = dict(config)
        if "cases" not in config:
            raise ValueError("a CaseOptimizer needs its (predicate, optimizer) pairs and cannot "
                             "be made from its name alone; pass CaseOptimizer((predicate, "
                             "optimizer), ..., default_optimizer=...) itself")

        def load(item):
            if item is None:
                return _not_saved
            return keras.saving.deserialize_keras_object(item, custom_objects=custom_objects)

        cases = [(load(c["predicate"]), load(c["optimizer"])) for c in config.pop("cases")]
        default = config.pop("default_optimizer")
        return cls(*cases, default_optimizer=None if default is None else load(default),
                   **config)
