"""Inference throughput over a dataset: the fastest batch size and number of concurrent batches
for a model, found by a short calibration, and interleaved timing of one or two models.

A *setting* is a batch size and a number of workers: batches of ``batch_size`` examples, with
``workers`` of them in flight at once (one Python thread each; TensorFlow runs the calls
concurrently), and for a Keras model whether its call is compiled by XLA. :func:`calibrate`
times every candidate setting on the first examples of the data and keeps the fastest per model;
:func:`measure` then times full passes over the data, the models' passes taking turns, and
reports the median pass.

A packed model (:class:`bnn.packed.model.PackedModel`) is called on its ``prepare`` d inputs (it
chooses its own kernels); a Keras model runs ``model(x, training=False)`` in one
``tf.function``, without XLA (as Keras' own ``predict`` runs on a CPU) or with it.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import tensorflow as tf

__all__ = ["BATCH_SIZES", "SAMPLE", "TIE", "Setting", "Runner", "runner", "cores", "candidates",
           "calibrate", "measure"]

#: Batch sizes :func:`calibrate` tries (capped at the number of examples).
BATCH_SIZES = (64, 256, 1024)
#: Examples each calibration run covers (at least one batch per worker): enough that a
#: moment's load on a shared machine does not decide the setting.
SAMPLE = 4096
#: Settings within this fraction of the fastest are taken as equally fast (the differences
#: between them are within a shared machine's noise); of those, calibration keeps the one with
#: the largest batches, then the most workers, then without XLA, so that it chooses the same
#: setting from run to run.
TIE = 0.05


@dataclass(frozen=True)
class Setting:
    """Batches of ``batch_size`` examples, ``workers`` of them in flight at once; ``xla``: a
    Keras model's call compiled by XLA."""

    batch_size: int
    workers: int
    xla: bool = False


@dataclass
class Runner:
    """A model as functions from a batch to its logits (numpy), by whether XLA compiles the
    call (a packed model has only ``False``), and its inputs."""

    predict: dict[bool, Callable[[np.ndarray], np.ndarray]]
    x: np.ndarray

    def run(self, setting: Setting, count: int | None = None) -> np.ndarray:
        """Logits of the first ``count`` examples (default: all), in order."""
        x = self.x if count is None else self.x[:count]
        predict, size = self.predict[setting.xla], setting.batch_size
        starts = range(0, len(x), size)
        if len(starts) == 0:
            return predict(x)
        if setting.workers == 1 or len(starts) == 1:
            parts = [predict(x[i:i + size]) for i in starts]
        else:
            with ThreadPoolExecutor(setting.workers) as pool:
                parts = list(pool.map(lambda i: predict(x[i:i + size]), starts))
        return np.concatenate(parts)


def runner(model: Any, x: np.ndarray) -> Runner:
    """A :class:`Runner` for a :class:`~bnn.packed.model.PackedModel` (``x`` checked and
    converted by its ``prepare``) or a ``keras.Model`` (``x`` as float32; with and without XLA).

    Raises:
        ValueError: for inputs the packed model does not accept (see ``PackedModel.prepare``).
    """
    from bnn.packed.model import PackedModel

    if isinstance(model, PackedModel):
        return Runner({False: lambda batch: model(batch).numpy()}, model.prepare(x))
    x = np.asarray(x, np.float32)
    spec = [tf.TensorSpec([None, *x.shape[1:]], tf.float32)]
    calls = {xla: tf.function(lambda batch: model(batch, training=False), jit_compile=xla,
                              input_signature=spec) for xla in (False, True)}
    return Runner({xla: (lambda batch, call=call: call(batch).numpy())
                   for xla, call in calls.items()}, x)


def cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def candidates(examples: int, batch_size: int | None = None,
               workers: int | None = None) -> list[Setting]:
    """Settings to try for ``examples`` examples: ``batch_size`` or each of
    :data:`BATCH_SIZES` (capped at ``examples``), with ``workers`` or 1 and 2 workers (1 on a
    single core, or when there is only one batch)."""
    sizes = [batch_size] if batch_size else sorted({max(1, min(b, examples))
                                                    for b in BATCH_SIZES})
    result = []
    for size in sizes:
        batches = -(-examples // size)
        counts = [workers] if workers else sorted({1, min(2, cores(), max(1, batches))})
        result += [Setting(size, count) for count in counts]
    return result


def _timed(run: Runner, setting: Setting, count: int | None = None) -> tuple[float, np.ndarray]:
    start = time.perf_counter()
    logits = run.run(setting, count)
    return time.perf_counter() - start, logits


def _fastest(runners: dict[str, Runner], options: dict[str, list[Setting]], sample: int,
             rounds: int) -> dict[str, Setting]:
    """Per model, the option with the shortest time per example in its best round, or, of those
    within :data:`TIE` of it, the one with the largest batches, the most workers, without XLA.
    Each option runs once untimed (tracing, compilation of every batch shape), then ``rounds``
    times on the first ``max(sample, batch_size * workers)`` examples, all models' and options'
    runs of a round in turn (the order reversed every other round, so a slow moment of a shared
    machine does not always hit the same option)."""
    work = [(name, s, max(sample, s.batch_size * s.workers)) for name, listed in options.items()
            for s in listed]
    if all(len(listed) == 1 for listed in options.values()):
        return {name: listed[0] for name, listed in options.items()}
    for name, setting, count in work:
        runners[name].run(setting, count)
    per_example: dict[tuple[str, Setting], float] = {}
    for round_index in range(rounds):
        for name, setting, count in (work if round_index % 2 == 0 else work[::-1]):
            seconds, _ = _timed(runners[name], setting, count)
            key = (name, setting)
            per_example[key] = min(per_example.get(key, np.inf),
                                   seconds / min(count, len(runners[name].x)))
    chosen = {}
    for name, listed in options.items():
        fastest = min(per_example[name, s] for s in listed)
        chosen[name] = min((s for s in listed if per_example[name, s] <= fastest * (1 + TIE)),
                           key=lambda s: (-s.batch_size, -s.workers, s.xla))
    return chosen


def calibrate(runners: dict[str, Runner], batch_size: int | None = None,
              workers: int | None = None, sample: int = SAMPLE, rounds: int = 3
              ) -> dict[str, Setting]:
    """The fastest setting for each model: first the fastest of the :func:`candidates` (without
    XLA), then, for a Keras model, that setting with and without XLA (one more compilation
    instead of one per candidate). Each step times its options as :func:`_fastest` describes.
    With both ``batch_size`` and ``workers`` given, the first step is skipped."""
    examples = min(len(r.x) for r in runners.values())
    settings = candidates(examples, batch_size, workers)
    best = _fastest(runners, {name: settings for name in runners}, sample, rounds)
    return _fastest(runners, {name: [best[name]] + (
        [Setting(best[name].batch_size, best[name].workers, xla=True)]
        if True in runners[name].predict else []) for name in runners}, sample, rounds)


def measure(runners: dict[str, Runner], settings: dict[str, Setting], rounds: int = 1
            ) -> dict[str, dict[str, Any]]:
    """Full passes over each model's data with its setting, ``rounds`` per model, the models'
    passes taking turns (reversed every other round), after one untimed call on each batch
    shape.

    Returns:
        Per model: ``logits`` (of the first pass), ``seconds`` (the median pass, wall clock),
        ``round_seconds`` (every pass, by round), ``examples``, ``examples_per_second``
        (``examples / seconds``), ``batch_size``, ``workers`` and ``xla``.
    """
    names = list(runners)
    for name in names:  # compile the first and the last batch's shapes (XLA) untimed
        run, setting = runners[name], settings[name]
        tail = len(run.x) % setting.batch_size
        for part in (run.x[:setting.batch_size], run.x[len(run.x) - tail:] if tail else None):
            if part is not None:
                run.predict[setting.xla](part)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    logits: dict[str, np.ndarray] = {}
    for round_index in range(rounds):
        for name in (names if round_index % 2 == 0 else names[::-1]):
            elapsed, out = _timed(runners[name], settings[name])
            seconds[name].append(elapsed)
            logits.setdefault(name, out)
    result = {}
    for name in names:
        median = float(np.median(seconds[name]))
        examples = len(runners[name].x)
        result[name] = {"logits": logits[name], "seconds": median,
                        "round_seconds": seconds[name], "examples": examples,
                        "examples_per_second": examples / median if median > 0 else float("inf"),
                        "batch_size": settings[name].batch_size,
                        "workers": settings[name].workers, "xla": settings[name].xla}
    return result
