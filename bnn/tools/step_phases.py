"""Where a train step's time goes: the forward pass alone, and forward plus backward.

``bnn bench --phases`` times, beside each twin's whole train step, two compiled functions of the
same model on the same batch (see :func:`phase_timers`):

* ``forward``: ``model(x, training=True)``, the training-mode forward pass (batch statistics
  included);
* ``gradient``: the forward pass, the loss and the gradients of every trainable variable, but
  no update.

Their blocks take turns with the step blocks, so the differences are taken between figures
from the same minutes: ``backward = gradient - forward`` and ``rest = step - gradient``, the
optimizer update, the weight constraints and Keras' per-step work. :func:`summarize` adds these
to a benchmark row as ``<twin>_forward_ms``, ``<twin>_backward_ms`` and ``<twin>_rest_ms``.

A packed forward pass can at best make the forward free; ``binary_ms - binary_forward_ms`` is the
step that would be left, the floor of what the forward pass alone can buy.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf

__all__ = ["PHASES", "block_timer", "phase_timers", "summarize", "to_markdown"]

PHASES = ("forward", "gradient")


def block_timer(function: Callable[[], Any], what: str) -> Callable[[int], tuple[float, float]]:
    """A timer of blocks of calls: ``timer(steps)`` calls ``function`` ``steps`` times and returns
    the mean (wall, process CPU) seconds per call. ``function`` returns a value, or a tuple whose
    first item is the value, that depends on all of the call's work; fetching it waits for the
    call. A non-finite last value voids the timing with a RuntimeError naming ``what``."""
    def time_block(steps: int) -> tuple[float, float]:
        start, start_cpu = time.perf_counter(), time.process_time()
        for _ in range(steps):
            result = function()
            out = np.asarray(result[0] if isinstance(result, tuple) else result)
        elapsed, elapsed_cpu = time.perf_counter() - start, time.process_time() - start_cpu
        if not np.all(np.isfinite(out)):
            raise RuntimeError(f"{what} became non-finite ({out}); the timing is void")
        return elapsed / steps, elapsed_cpu / steps

    return time_block


def phase_timers(model: keras.Model, x: np.ndarray, y: np.ndarray, xla: bool,
                 warmup_steps: int) -> dict[str, Callable[[int], tuple[float, float]]]:
    """``{"forward": timer, "gradient": timer}`` for ``model`` on the batch ``(x, y)``, compiled
    with ``jit_compile=xla`` and warmed up; each timer returns (wall, CPU) seconds per call.

    The loss is the model's compiled loss (sparse cross-entropy on logits in the benchmark).
    The forward function returns the sum of the outputs and the gradient function returns the
    gradients themselves, so the compiler can drop none of their work; each call's scalar is
    fetched before the next call, in float32, which numpy reads under any mixed precision.
    """
    inputs, labels = tf.constant(x), tf.constant(y)
    variables = model.trainable_variables
    loss_fn = keras.losses.get(model.loss)

    @tf.function(jit_compile=xla)
    def forward():
        return tf.reduce_sum(tf.cast(model(inputs, training=True), tf.float32))

    @tf.function(jit_compile=xla)
    def gradient():
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(inputs, training=True))
        return tf.cast(loss, tf.float32), tape.gradient(loss, variables)

    timers = {"forward": block_timer(forward, f"{model.name}: the forward pass's output sum"),
              "gradient": block_timer(gradient, f"{model.name}: the loss")}
    for timer in timers.values():
        timer(warmup_steps)
    return timers


def summarize(row: dict[str, Any], twins: tuple[str, ...]) -> None:
    """Adds ``<twin>_forward_ms``, ``<twin>_gradient_ms``, ``<twin>_backward_ms`` and
    ``<twin>_rest_ms`` (medians over blocks, milliseconds) to a row holding the phase blocks."""
    for twin in twins:
        forward = statistics.median(row[f"{twin}_forward_block_ms"])
        gradient = statistics.median(row[f"{twin}_gradient_block_ms"])
        row[f"{twin}_forward_ms"] = forward
        row[f"{twin}_gradient_ms"] = gradient
        row[f"{twin}_backward_ms"] = gradient - forward
        row[f"{twin}_rest_ms"] = row[f"{twin}_ms"] - gradient


def to_markdown(rows: list[dict[str, Any]], twins: tuple[str, ...]) -> str:
    """A table of the phases of each row that has them ("" when none has)."""
    rows = [row for row in rows if f"{twins[0]}_forward_ms" in row]
    if not rows:
        return ""
    head = ["model", "XLA", "twin", "forward ms", "backward ms", "rest ms", "step ms",
            "step less forward ms"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        for twin in twins:
            step, forward = row[f"{twin}_ms"], row[f"{twin}_forward_ms"]
            cells = [row["model"], "on" if row["xla"] else "off", twin, f"{forward:.1f}",
                     f"{row[f'{twin}_backward_ms']:.1f}", f"{row[f'{twin}_rest_ms']:.1f}",
                     f"{step:.1f}", f"{step - forward:.1f}"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
