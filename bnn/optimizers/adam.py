"""Adam for binary networks: the latent kernels of bnn's layers updated and clipped in one pass
under Keras' own Adam, and :class:`Adam`, Keras' Adam with every dense update in one fused
kernel.

A binary layer's latent kernel carries a :class:`bnn.layers.WeightClip` constraint. Keras' Adam
updates a variable with a dozen elementwise ops, each its own pass over memory when the train
step is not compiled by XLA (the default on CPUs), then clips it in one more pass. For those
kernels bnn's native Adam update (:meth:`bnn.native.ops.Ops.adam_update`) does both in one pass,
with the same float32 results as TensorFlow's ``ResourceApplyAdam`` followed by the clip, equal
to Keras' update up to float rounding. Importing bnn's layers makes ``keras.optimizers.Adam``
(``"adam"`` in ``model.compile``, and its subclasses) take that update for the variables a
``WeightClip`` constrains, where the native kernels run (:func:`bnn.native.dispatch.preferred`;
``BNN_NATIVE_KERNELS=0`` turns it off) and XLA does not compile the step; every other variable
keeps Keras' update. docs/speed.md, "Adam in one kernel", has the measurements.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

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


def _fusable(optimizer: keras.optimizers.Adam, gradient, variable) -> bool:
    """A dense update on the TensorFlow backend without ``amsgrad``, of a float variable."""
    return (keras.backend.backend() == "tensorflow" and not optimizer.amsgrad
            and not isinstance(gradient, tf.IndexedSlices)
            and keras.backend.standardize_dtype(variable.dtype) in _FUSED_DTYPES)


def _clip_in_update(optimizer: keras.optimizers.Adam, gradient, variable) -> bool:
    """Whether ``variable``'s ``WeightClip`` can run inside its update, on the native one-pass
    update: a dense float32 (or bfloat16) gradient of a float32 variable, in a step that XLA
    does not compile (XLA fuses the clip itself), where the native kernels run."""
    return (type(variable.constraint) is WeightClip and gradient is not None
            and _fusable(optimizer, gradient, variable) and not in_xla_context()
            and keras.backend.standardize_dtype(variable.dtype) == "float32"
            and gradient.dtype in (tf.float32, tf.bfloat16) and dispatch.preferred())


@contextlib.contextmanager
def _clips_set_aside(optimizer: keras.optimizers.Adam, grads, trainable_variables
                     ) -> Iterator[None]:
    """While Keras' ``apply`` runs: the ``WeightClip`` of each variable that can be clipped in
    its update (:func:`_clip_in_update`) set aside (Keras would clip it in a second pass) and
    recorded for :func:`_native_update`, then restored."""
    variables = (getattr(optimizer, "_trainable_variables", []) if trainable_variables is None
                 else list(trainable_variables))
    set_aside = [variable for gradient, variable in zip(grads, variables)
                 if _clip_in_update(optimizer, gradient, variable)]
    constraints = [variable.constraint for variable in set_aside]
    optimizer._bnn_clips = {optimizer._var_key(variable): constraint.clip_value
                            for variable, constraint in zip(set_aside, constraints)}
    try:
        for variable in set_aside:
            variable.constraint = None
        yield
    finally:
        for variable, constraint in zip(set_aside, constraints):
            variable.constraint = constraint
        optimizer._bnn_clips = {}


def _native_update(optimizer: keras.optimizers.Adam, gradient, variable, learning_rate) -> bool:
    """The update of a variable recorded by :func:`_clips_set_aside`, with its clip, in one
    native pass; False (nothing done) for any other variable."""
    clip = getattr(optimizer, "_bnn_clips", {}).get(optimizer._var_key(variable))
    if clip is None:
        return False
    dtype = variable.dtype
    step = ops.cast(optimizer.iterations + 1, dtype)
    index = optimizer._get_variable_index(variable)
    beta1, beta2 = ops.cast(optimizer.beta_1, dtype), ops.cast(optimizer.beta_2, dtype)
    alpha = (ops.cast(learning_rate, dtype) * ops.sqrt(1 - ops.power(beta2, step))
             / (1 - ops.power(beta1, step)))
    dispatch.ops().adam_update(
        _handle(variable), _handle(optimizer._momentums[index]),
        _handle(optimizer._velocities[index]), _widened_from(gradient), alpha,
        optimizer.beta_1, optimizer.beta_2, optimizer.epsilon, clip)
    return True


def _updates_latent_kernels_in_one_pass(adam: type) -> None:
    """Makes ``adam`` (Keras' Adam class) update the variables its ``WeightClip`` constrains in
    one native pass (the module docstring); every other update stays Keras'."""
    if getattr(adam, "_bnn_one_pass", False):
        return
    keras_apply, keras_update_step = adam.apply, adam.update_step

    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        with _clips_set_aside(self, grads, trainable_variables):
            return keras_apply(self, grads, trainable_variables)

    def update_step(self, gradient, variable, learning_rate):
        if not _native_update(self, gradient, variable, learning_rate):
            keras_update_step(self, gradient, variable, learning_rate)

    apply.__doc__, update_step.__doc__ = keras_apply.__doc__, keras_update_step.__doc__
    adam.apply, adam.update_step, adam._bnn_one_pass = apply, update_step, True


_updates_latent_kernels_in_one_pass(keras.optimizers.Adam)


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
    ``amsgrad``, other backends) takes Keras' update. The latent kernels of bnn's layers are
    updated and clipped in one pass, as under Keras' Adam (the module docstring).

    Example::

        model.compile(optimizer=bnn.optimizers.Adam(1e-3), loss="mse")
    """

    def update_step(self, gradient, variable, learning_rate):
        clipped = self._var_key(variable) in getattr(self, "_bnn_clips", {})
        if clipped or not _fusable(self, gradient, variable):  # Keras' Adam, as bnn makes it
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        step = ops.cast(self.iterations + 1, dtype)
        index = self._get_variable_index(variable)
        scalar = lambda value: ops.cast(value, dtype)  # noqa: E731
        tf.raw_ops.ResourceApplyAdam(
            var=_handle(variable), m=_handle(self._momentums[index]),
            v=_handle(self._velocities[index]),
            beta1_power=ops.power(scalar(self.beta_1), step),
            beta2_power=ops.power(scalar(self.beta_2), step), lr=scalar(learning_rate),
            beta1=scalar(self.beta_1), beta2=scalar(self.beta_2), epsilon=scalar(self.epsilon),
            grad=ops.cast(gradient, dtype))
