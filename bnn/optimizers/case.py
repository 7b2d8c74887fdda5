"""``CaseOptimizer``: each variable to the first optimizer whose predicate accepts it, and the
saveable predicate that picks a model's binary kernels (:func:`is_binary_variable_of`)."""

from __future__ import annotations

import warnings
from typing import Any, Callable, Sequence

import keras

from bnn.layers.walk import all_layers, binary_kernel_layers
from bnn.optimizers.adam import Adam

__all__ = ["CaseOptimizer", "VariablePaths", "is_binary_variable_of", "saveable"]


@keras.saving.register_keras_serializable(package="bnn")
class VariablePaths:
    """A serializable predicate: true for variables whose ``"<layer name>/<variable name>"`` (the
    last two parts of ``variable.path``) is in ``paths``, e.g. ``"dense0/kernel"``.

    The leading parts of a Keras variable path depend on how the model was built (a freshly built
    Sequential model gives ``"model_name/dense0/kernel"``, a loaded one ``"dense0/kernel"``); layer
    names survive ``model.save`` / ``keras.saving.load_model``, so this predicate does too.
    """

    def __init__(self, paths: Sequence[str]):
        self.paths = sorted(set(paths))
        self._lookup = frozenset(self.paths)

    @classmethod
    def of(cls, variables: Sequence) -> VariablePaths:
        """The predicate that accepts exactly ``variables`` (by their short paths)."""
        return cls([_short_path(variable) for variable in variables])

    def __call__(self, variable) -> bool:
        return _short_path(variable) in self._lookup

    def get_config(self) -> dict[str, Any]:
        return {"paths": list(self.paths)}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> VariablePaths:
        return cls(**config)

    def __repr__(self) -> str:
        return f"VariablePaths({self.paths!r})"


def _short_path(variable) -> str:
    """``"<layer name>/<variable name>"``: the last two parts of a Keras variable path."""
    return "/".join(variable.path.split("/")[-2:])


def is_binary_variable_of(model: keras.Model) -> VariablePaths:
    """Predicate that accepts exactly the latent binary kernels of ``model`` (the
    ``binary_kernels()`` of each of its layers).

    Raises:
        ValueError: when the model is not built yet (its kernels do not exist).
    """
    unbuilt = [layer.name for layer in all_layers(model)
               if callable(getattr(layer, "binary_kernels", None)) and not layer.built
               and getattr(layer, "quantized", True)]
    if unbuilt:
        raise ValueError(
            f"layers {unbuilt} of model {model.name!r} are not built, so their kernels do not "
            "exist yet; give the model a keras.Input or call it on a batch first"
        )
    return VariablePaths([_short_path(kernel) for layer in binary_kernel_layers(model)
                          for kernel in layer.binary_kernels()])


def saveable(predicate: Callable) -> bool:
    """Whether Keras saves ``predicate`` so that it loads back: an object with ``get_config``
    (:class:`VariablePaths`), or a function registered with
    ``keras.saving.register_keras_serializable``. A lambda or another function is not."""
    if hasattr(predicate, "get_config"):
        return True
    if getattr(predicate, "__name__", None) is None:
        return False
    return keras.saving.get_registered_object(
        keras.saving.get_registered_name(predicate)) is predicate


def _serialize_predicate(predicate: Callable, index: int) -> Any:
    if not saveable(predicate):
        raise ValueError(
            f"CaseOptimizer case {index} has predicate {predicate!r}, which cannot be saved; "
            "use bnn.optimizers.VariablePaths (or is_binary_variable_of(model)) to save the model"
        )
    return keras.saving.serialize_keras_object(predicate)


@keras.saving.register_keras_serializable(package="bnn")
class CaseOptimizer(keras.optimizers.Optimizer):
    """Routes each trainable variable to one optimizer.

    A variable goes to the optimizer of the first ``(predicate, optimizer)`` case whose
    ``predicate(variable)`` is true, otherwise to ``default``. Each optimizer then updates only
    its own variables (its own step counter, state and constraints)::

        model.compile(optimizer=bnn.optimizers.CaseOptimizer(
            (bnn.optimizers.is_binary_variable_of(model), bnn.optimizers.Bop()),
            default=keras.optimizers.Adam(1e-3)), loss=...)

    ``learning_rate`` reads and sets the default optimizer's, so learning-rate schedules in
    callbacks apply to the default optimizer. ``variables`` lists this optimizer's own (its step
    count) and then each case's optimizer's, in case order, the default's last. Works under
    ``tf.function``, XLA (``jit_compile=True``), ``model.save`` / ``keras.saving.load_model``
    (predicates must then be :func:`saveable`: :class:`VariablePaths` or registered functions)
    and ``tf.train.Checkpoint``.
    """

    def __init__(self, *cases: tuple[Callable, keras.optimizers.Optimizer],
                 default: keras.optimizers.Optimizer | None = None, name: str = "case_optimizer",
                 **kwargs):
        for i, case in enumerate(cases):
            if not (isinstance(case, (tuple, list)) and len(case) == 2 and callable(case[0])
                    and isinstance(case[1], keras.optimizers.Optimizer)):
                raise ValueError(
                    f"CaseOptimizer case {i} is {case!r}; expected a (predicate, "
                    "keras.optimizers.Optimizer) pair, predicate(variable) -> bool"
                )
        default = Adam(1e-3) if default is None else default
        if not isinstance(default, keras.optimizers.Optimizer):
            raise ValueError(f"CaseOptimizer default must be a keras optimizer, got {default!r}")
        kwargs.pop("learning_rate", None)
        super().__init__(learning_rate=0.0, name=name, **kwargs)
        self.predicates = [predicate for predicate, _ in cases]
        self.optimizers = [optimizer for _, optimizer in cases] + [default]
        self._routes: list[list[int]] = []

    @property
    def learning_rate(self):
        return self.optimizers[-1].learning_rate

    @learning_rate.setter
    def learning_rate(self, value) -> None:
        self.optimizers[-1].learning_rate = value

    @property
    def variables(self) -> list:
        return self._variables[:] + [variable for optimizer in getattr(self, "optimizers", ())
                      for variable in optimizer.variables]

    def save_own_variables(self, store) -> None:
        """Saves this optimizer's own variables; each case's optimizer saves its own state in the
        file, as an attribute of this one."""
        for i, variable in enumerate(self._variables):
            store[str(i)] = variable.numpy()

    def load_own_variables(self, store) -> None:
        """Inverse of :meth:`save_own_variables`."""
        if len(store.keys()) != len(self._variables):
            warnings.warn(f"Skipping variable loading for optimizer {self.name!r}: it has "
                          f"{len(self._variables)} variables of its own, the saved one "
                          f"{len(store.keys())}", stacklevel=2)
            return
        for i, variable in enumerate(self._variables):
            variable.assign(store[str(i)])

    def _route(self, variable) -> int:
        for i, predicate in enumerate(self.predicates):
            if predicate(variable):
                return i
        return len(self.optimizers) - 1

    def build(self, variables: Sequence) -> None:
        if self.built:
            return
        super().build(variables)
        routes: list[list[int]] = [[] for _ in self.optimizers]
        for index, variable in enumerate(variables):
            routes[self._route(variable)].append(index)
        for optimizer, indices in zip(self.optimizers, routes):
            optimizer.build([variables[i] for i in indices])
        self._routes = routes

    def apply(self, grads, trainable_variables=None) -> None:
        if trainable_variables is None:
            trainable_variables = self._trainable_variables
        trainable_variables = list(trainable_variables)
        if not self.built:
            self.build(trainable_variables)
        grads = list(grads)
        route_of = {self._var_key(v): r for r, indices in enumerate(self._routes) for v in
                    (self._trainable_variables[i] for i in indices)}
        parts: list[tuple[list, list]] = [([], []) for _ in self.optimizers]
        for grad, variable in zip(grads, trainable_variables):
            key = self._var_key(variable)
            if key not in route_of:
                raise ValueError(
                    f"CaseOptimizer {self.name!r} got variable {variable.path!r}, which it was not "
                    "built with; build it on all the model's trainable variables"
                )
            parts[route_of[key]][0].append(grad)
            parts[route_of[key]][1].append(variable)
        for optimizer, (part_grads, part_vars) in zip(self.optimizers, parts):
            if part_vars:
                optimizer.apply(part_grads, part_vars)
        self._iterations.assign_add(1)

    def get_config(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "cases": [
                {"predicate": _serialize_predicate(p, i),
                 "optimizer": keras.saving.serialize_keras_object(o)}
                for i, (p, o) in enumerate(zip(self.predicates, self.optimizers[:-1]))
            ],
            "default": keras.saving.serialize_keras_object(self.optimizers[-1]),
        }

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects=None) -> CaseOptimizer:
        config = dict(config)
        cases = [
            (keras.saving.deserialize_keras_object(c["predicate"], custom_objects=custom_objects),
             keras.saving.deserialize_keras_object(c["optimizer"], custom_objects=custom_objects))
            for c in config.pop("cases")
        ]
        default = keras.saving.deserialize_keras_object(config.pop("default"),
                                                        custom_objects=custom_objects)
        return cls(*cases, default=default, **config)
