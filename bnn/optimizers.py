"""Optimizers for binary networks: a fused Adam, Bop, and routing of each variable to the right
optimizer.

* :class:`Adam` is ``keras.optimizers.Adam`` whose dense updates run as one fused TensorFlow
  kernel: the same update, several times fewer passes over the weights without XLA.
* :class:`Bop` (Helwegen et al. 2019, "Latent weights do not exist") flips binary weights
  instead of taking gradient steps on latent weights.
* :class:`CaseOptimizer` sends each variable to the first optimizer whose predicate accepts it
  and every other variable to a default optimizer, so Bop trains the binary kernels while Adam
  trains batch normalization, biases and float layers, all under one ``model.compile``.
* :func:`make_optimizer` builds ``"adam"``, ``"sgd"`` or ``"bop"`` (routed Bop + Adam) by name.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import keras
import tensorflow as tf
from keras import ops

from bnn import kernels
from bnn.constraints import WeightClip
from bnn.xla import in_xla_context

__all__ = [
    "Adam", "Bop", "CaseOptimizer", "VariablePaths", "binary_kernel_layers",
    "is_binary_variable_of", "make_optimizer", "OPTIMIZERS",
]

OPTIMIZERS = ("adam", "sgd", "bop")
_FUSED_DTYPES = ("float16", "bfloat16", "float32", "float64")


def _widened_from(gradient):
    """The bfloat16 tensor of which a traced float32 ``gradient`` is the cast (exact), through
    any identities on the way, else ``gradient``. The native update reads bfloat16 gradients
    itself, and the cast left without a reader is dropped from the graph: a pass over the
    gradient less."""
    if tf.executing_eagerly() or gradient.dtype != tf.float32:
        return gradient
    source = gradient
    while source.op.type in ("Identity", "IdentityN"):
        source = source.op.inputs[source.value_index]
    if source.op.type == "Cast" and source.op.inputs[0].dtype == tf.bfloat16:
        return source.op.inputs[0]
    return gradient


def _handle(variable):
    """The TensorFlow resource handle of a Keras or TensorFlow variable."""
    return variable.value.handle if isinstance(variable, keras.Variable) else variable.handle


@keras.saving.register_keras_serializable(package="bnn")
class Adam(keras.optimizers.Adam):
    """``keras.optimizers.Adam`` with each dense update in one fused TensorFlow kernel.

    Same arguments, state and update as Keras' Adam. On the TensorFlow backend, for a dense
    gradient and without ``amsgrad``, a variable's update runs as TensorFlow's
    ``ResourceApplyAdam`` kernel, one multi-threaded pass over the variable, its two moments
    and its gradient, where Keras' generic update is a dozen elementwise ops, each its own pass
    over memory when the train step is not XLA-compiled. For the 10.0 M weights of the BinaryNet
    MLP that is about a quarter of a train step on a CPU. The kernel evaluates the same
    expressions in another order, so results equal Keras' Adam's to float rounding. Under XLA it
    compiles to the same fused loop as Keras' update. Anything else (sparse gradients,
    ``amsgrad``, other backends) takes Keras' update.

    A float32 variable whose constraint is a :class:`bnn.constraints.WeightClip` (the latent
    kernels of binary layers) is updated and clipped in one pass, by the native kernels' Adam
    update (:meth:`bnn.kernels.Ops.adam_update`, the same float32 results as
    ``ResourceApplyAdam`` followed by the clip), where they run (:func:`bnn.kernels.preferred`)
    and XLA does not compile the step; Keras would clip it in a second pass over the weights
    after the update (docs/speed.md, "Adam in one kernel"). A float32 gradient that is the cast
    of a bfloat16 one (a binary layer's kernel gradient under a bfloat16 policy) reaches that
    update as the bfloat16 tensor, which it widens as it reads, and the cast is left out.

    Example::

        model.compile(optimizer=bnn.optimizers.Adam(1e-3), loss="mse")
    """

    def _fused(self, gradient, variable) -> bool:
        return (keras.backend.backend() == "tensorflow" and not self.amsgrad
                and not isinstance(gradient, tf.IndexedSlices)
                and keras.backend.standardize_dtype(variable.dtype) in _FUSED_DTYPES)

    def _clip_in_update(self, gradient, variable) -> bool:
        """Whether ``variable``'s ``WeightClip`` can run inside its update, on the native one-pass
        update: a dense float32 (or bfloat16) gradient of a float32 variable, in a step that XLA
        does not compile (XLA fuses the clip itself), where the native kernels run."""
        return (type(variable.constraint) is WeightClip and gradient is not None
                and self._fused(gradient, variable) and not in_xla_context()
                and keras.backend.standardize_dtype(variable.dtype) == "float32"
                and gradient.dtype in (tf.float32, tf.bfloat16) and kernels.preferred())

    def apply(self, grads, trainable_variables=None):
        """Keras' ``apply``, where each variable whose ``WeightClip`` can run inside its update
        (:meth:`_clip_in_update`) is updated and clipped in one pass: its constraint is set
        aside while Keras' update runs (Keras would clip it in a second pass), then restored."""
        variables = (getattr(self, "_trainable_variables", []) if trainable_variables is None
                     else list(trainable_variables))
        grads = list(grads)
        set_aside = [variable for gradient, variable in zip(grads, variables)
                     if self._clip_in_update(gradient, variable)]
        constraints = [variable.constraint for variable in set_aside]
        self._clips = {self._var_key(variable): constraint.clip_value
                       for variable, constraint in zip(set_aside, constraints)}
        try:
            for variable in set_aside:
                variable.constraint = None
            return super().apply(grads, trainable_variables)
        finally:
            for variable, constraint in zip(set_aside, constraints):
                variable.constraint = constraint
            self._clips = {}

    def update_step(self, gradient, variable, learning_rate):
        if not self._fused(gradient, variable):
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        step = ops.cast(self.iterations + 1, dtype)
        index = self._get_variable_index(variable)
        scalar = lambda value: ops.cast(value, dtype)  # noqa: E731
        clip = getattr(self, "_clips", {}).get(self._var_key(variable))
        if clip is not None:
            alpha = (scalar(learning_rate) * ops.sqrt(1 - ops.power(scalar(self.beta_2), step))
                     / (1 - ops.power(scalar(self.beta_1), step)))
            kernels.ops().adam_update(
                _handle(variable), _handle(self._momentums[index]),
                _handle(self._velocities[index]), _widened_from(gradient), alpha, self.beta_1,
                self.beta_2, self.epsilon, clip)
            return
        tf.raw_ops.ResourceApplyAdam(
            var=_handle(variable), m=_handle(self._momentums[index]),
            v=_handle(self._velocities[index]),
            beta1_power=ops.power(scalar(self.beta_1), step),
            beta2_power=ops.power(scalar(self.beta_2), step), lr=scalar(learning_rate),
            beta1=scalar(self.beta_1), beta2=scalar(self.beta_2), epsilon=scalar(self.epsilon),
            grad=ops.cast(gradient, dtype))


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


def _all_layers(model: keras.Model) -> list:
    """Every layer of ``model``, nested models flattened, in order."""
    found = []
    for layer in getattr(model, "layers", []):
        found.append(layer)
        found.extend(_all_layers(layer))
    return found


def binary_kernel_layers(model: keras.Model) -> list:
    """The layers of ``model`` that binarize kernels in the forward pass: those whose
    ``binary_kernels()`` (see :mod:`bnn.layers`) is not empty. Nested models are searched too."""
    return [layer for layer in _all_layers(model)
            if callable(getattr(layer, "binary_kernels", None)) and layer.built
            and layer.binary_kernels()]


def is_binary_variable_of(model: keras.Model) -> VariablePaths:
    """Predicate that accepts exactly the latent binary kernels of ``model`` (the
    ``binary_kernels()`` of each of its layers).

    Raises:
        ValueError: when the model is not built yet (its kernels do not exist).
    """
    unbuilt = [layer.name for layer in _all_layers(model)
               if callable(getattr(layer, "binary_kernels", None)) and not layer.built
               and getattr(layer, "quantized", True)]
    if unbuilt:
        raise ValueError(
            f"layers {unbuilt} of model {model.name!r} are not built, so their kernels do not "
            "exist yet; give the model a keras.Input or call it on a batch first"
        )
    return VariablePaths([_short_path(kernel) for layer in binary_kernel_layers(model)
                          for kernel in layer.binary_kernels()])


def _serialize_predicate(predicate: Callable, index: int) -> Any:
    if not hasattr(predicate, "get_config"):
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
    callbacks apply to the default optimizer. Works under ``tf.function``, XLA
    (``jit_compile=True``), ``model.save`` / ``keras.saving.load_model`` (predicates must then be
    :class:`VariablePaths`) and ``tf.train.Checkpoint``.
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


def make_optimizer(name: str, model: keras.Model, learning_rate: Any,
                   **kwargs: Any) -> keras.optimizers.Optimizer:
    """Builds the optimizer called ``name`` for ``model``.

    * ``"adam"``: :class:`Adam` ``(learning_rate, **kwargs)`` (any Keras Adam argument).
    * ``"sgd"``: ``keras.optimizers.SGD(learning_rate, momentum=0.9, nesterov=False)``; kwargs
      ``momentum`` and ``nesterov``.
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
    allowed = {"sgd": {"momentum", "nesterov"}, "bop": {"threshold", "gamma"}}
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
                                    nesterov=bool(kwargs.get("nesterov", False)))
    bop = Bop(threshold=kwargs.get("threshold", 1e-8), gamma=kwargs.get("gamma", 1e-4))
    return CaseOptimizer((is_binary_variable_of(model), bop),
                         default=Adam(learning_rate))
