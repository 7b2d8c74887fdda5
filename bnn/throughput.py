"""Inference throughput over a dataset: the fastest batch size and number of concurrent batches
for a model, found by a short calibration, and interleaved timing of one or two models.

A *setting* is a batch size and a number of workers: batches of ``batch_size`` examples, with
``workers`` of them in flight at once (one Python thread each; TensorFlow runs the calls
concurrently). :func:`calibrate` times every candidate setting on the first examples of the data
and keeps the fastest per model; :func:`measure` then times full passes over the data, the
models' passes taking turns, and reports the median pass.

A packed model (:class:`bnn.packing.PackedModel`) is called on its :meth:`prepare` d inputs; a
Keras model runs ``model(x, training=False)`` in one ``tf.function`` (no XLA, as Keras' own
``predict`` runs on a CPU).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import tensorflow as tf

__all__ = ["BATCH_SIZES", "SAMPLE", "Setting", "Runner", "runner", "cores", "candidates",
           "calibrate", "measure"]

#: Batch sizes :func:`calibrate` tries (capped at the number of examples).
BATCH_SIZES = (64, 256, 1024)
#: Examples each calibration run covers (at least one batch per worker).
SAMPLE = 1024


@dataclass(frozen=True)
class Setting:
    """Batches of ``batch_size`` examples, ``workers`` of them in flight at once."""

    batch_size: int
    workers: int


@dataclass
class Runner:
    """A model as a function from a batch to its logits (numpy), and its inputs."""

    predict: Callable[[np.ndarray], np.ndarray]
    x: np.ndarray

    def run(self, setting: Setting, count: int | None = None) -> np.ndarray:
        """Logits of the first ``count`` examples (default: all), in order."""
        x = self.x if count is None else self.x[:count]
        size = setting.batch_size
        starts = range(0, len(x), size)
        if len(starts) == 0:
            return self.predict(x)
        if setting.workers == 1 or len(starts) == 1:
            parts = [self.predict(x[i:i + size]) for i in starts]
        else:
            with ThreadPoolExecutor(setting.workers) as pool:
                parts = list(pool.map(lambda i: self.predict(x[i:i + size]), starts))
        return np.concatenate(parts)


def runner(model: Any, x: np.ndarray) -> Runner:
    """A :class:`Runner` for a :class:`~bnn.packing.PackedModel` (``x`` checked and converted by
    its ``prepare``) or a ``keras.Model`` (``x`` as float32).

    Raises:
        ValueError: for inputs the packed model does not accept (see ``PackedModel.prepare``).
    """
    from bnn.packing import PackedModel

    if isinstance(model, PackedModel):
        return Runner(lambda batch: model(batch).numpy(), model.prepare(x))
    x = np.asarray(x, np.float32)
    call = tf.function(lambda batch: model(batch, training=False),
                       input_signature=[tf.TensorSpec([None, *x.shape[1:]], tf.float32)])
    return Runner(lambda batch: call(batch).numpy(), x)


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


def calibrate(runners: dict[str, Runner], batch_size: int | None = None,
              workers: int | None = None, sample: int = SAMPLE, rounds: int = 2
              ) -> dict[str, Setting]:
    """The fastest :func:`candidates` setting for each model.

    Each candidate first runs once untimed (tracing, compilation), then ``rounds`` times on the
    first ``max(sample, batch_size * workers)`` examples, every model's runs of a round in turn
    (the order reversed every other round, so a slow moment of a shared machine does not always
    hit the same candidate). The setting with the shortest time per example in its best round
    wins. With both ``batch_size`` and ``workers`` given, that setting is returned untimed.
    """
    examples = min(len(r.x) for r in runners.values())
    settings = candidates(examples, batch_size, workers)
    if len(settings) == 1:
        return {name: settings[0] for name in runners}
    work = [(name, s, max(sample, s.batch_size * s.workers)) for s in settings
            for name in runners]
    for name, setting, count in work:
        runners[name].run(setting, min(count, setting.batch_size))
    per_example: dict[tuple[str, Setting], float] = {}
    for round_index in range(rounds):
        for name, setting, count in (work if round_index % 2 == 0 else work[::-1]):
            seconds, _ = _timed(runners[name], setting, count)
            key = (name, setting)
            per_example[key] = min(per_example.get(key, np.inf),
                                   seconds / min(count, len(runners[name].x)))
    return {name: min(settings, key=lambda s, name=name: per_example[name, s])
            for name in runners}


def measure(runners: dict[str, Runner], settings: dict[str, Setting], rounds: int = 1
            ) -> dict[str, dict[str, Any]]:
    """Full passes over each model's data with its setting, ``rounds`` per model, the models'
    passes taking turns (reversed every other round).

    Returns:
        Per model: ``logits`` (of the first pass), ``seconds`` (the median pass, wall clock),
        ``round_seconds`` (every pass, by round), ``examples``, ``examples_per_second``
        (``examples / seconds``), ``batch_size`` and ``workers``.
    """
    names = list(runners)
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
                        "workers": settings[name].workers}
    return result
