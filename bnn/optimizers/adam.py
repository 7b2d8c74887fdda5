"""``Adam``: Keras' Adam with each dense update in one fused kernel."""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import ops

from bnn.layers.constraints import WeightClip
from bnn.native import dispatch
from bnn.ops.xla import in_xla_context

__all__ = ["Adam"]

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
    over memory when the train step is not XLA-compiled. The kernel evaluates the same
    expressions in another order, so results equal Keras' Adam's to float rounding. Under XLA it
    compiles to the same fused loop as Keras' update. Anything else (sparse gradients,
    ``amsgrad``, other backends) takes Keras' update.

    A float32 variable whose constraint is a :class:`bnn.layers.WeightClip` (the latent
    kernels of binary layers) is updated and clipped in one pass, by the native kernels' Adam
    update (:meth:`bnn.native.ops.Ops.adam_update`, the same float32 results as
    ``ResourceApplyAdam`` followed by the clip), where they run
    (:func:`bnn.native.dispatch.preferred`) and XLA does not compile the step; Keras would clip
    it in a second pass over the weights after the update (docs/speed.md, "Adam in one
    kernel"). A float32 gradient that is the cast
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
                and gradient.dtype in (tf.float32, tf.bfloat16) and dispatch.preferred())

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
            dispatch.ops().adam_update(
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
