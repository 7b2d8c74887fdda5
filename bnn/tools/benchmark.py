"""Training-step timing: a binary model against its float twin, interleaved, in one process.

For each model and each XLA setting, :func:`run` builds the binary model and its float twin with
:func:`bnn.models.build`, compiles both the same way (Adam, sparse cross-entropy on logits,
``jit_compile`` on or off), and trains them on one fixed synthetic batch of the dataset's shape
through ``model.train_on_batch`` -- the compiled train function that ``fit`` runs. Each step is
synchronised by fetching its loss. After warm-up steps (tracing and compilation, not timed) it
times blocks of ``steps_per_block`` steps, alternating binary, float, float, binary, ... so that
slow drifts in machine load hit both twins alike. It reports, per twin:

* ``*_ms``: median over blocks of the block's mean step time, in milliseconds;
* ``*_examples_per_second``: ``batch_size / (ms / 1000)``;
* ``ratio``: median over block pairs of ``binary block time / float block time`` (below 1 means
  the binary step is faster). Paired ratios are what to trust on a shared, noisy machine;
* ``*_cpu_ms`` and ``cpu_ratio``: the same for the process's CPU time per step (all threads),
  which other processes on a busy machine disturb less than wall time.

``bnn bench`` and ``benchmarks/step_time.py`` call :func:`main`.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import platform
import statistics
from typing import Any, Callable, Mapping, Sequence

import keras
import numpy as np
import tensorflow as tf

from bnn import models as models_lib
from bnn import optimizers, settings
from bnn.catalog import POLICIES
from bnn.native import dispatch
from bnn.tools import benchmark_flags, step_phases

__all__ = ["run", "paired_ratio", "BlockTimer", "Companions", "to_markdown", "machine_info",
           "build_parser", "main", "DEFAULT_BATCH_SIZES"]

DEFAULT_BATCH_SIZES: dict[str, int] = {"binarynet_mlp": 100, "vgg_small": 50, "binary_resnet": 50,
                                       "reactnet_resnet": 50}

# Small versions of each architecture for --quick (a smoke test of the harness, not a measurement).
_QUICK_OPTIONS: dict[str, dict[str, Any]] = {
    "binarynet_mlp": dict(input_shape=(8, 8, 1), hidden_units=(32, 32)),
    "vgg_small": dict(input_shape=(8, 8, 3), filters=(4, 4, 8, 8, 8, 8), dense_units=(16, 16)),
    "binary_resnet": dict(input_shape=(8, 8, 3), stages=(4, 8), blocks_per_stage=1),
    "reactnet_resnet": dict(input_shape=(8, 8, 3), stages=(4, 8), blocks_per_stage=1),
}
_QUICK_BATCH = 8


# Times ``steps`` train steps; returns (wall, process CPU) seconds per step.
BlockTimer = Callable[[int], "tuple[float, float]"]
Companions = Callable[[dict[str, Any]], Mapping[str, BlockTimer]]


def machine_info() -> dict[str, Any]:
    """CPU model, logical cores, accelerators, TensorFlow's CPU allocator (see
    :func:`bnn.settings.select_pooling_allocator`), TensorFlow and Keras versions, UTC date."""
    gpus = dispatch.gpus()
    return {
        "cpu": dispatch.cpu_model(),
        "cores": os.cpu_count(),
        "device": "GPU" if gpus else "CPU",
        "gpus": gpus,
        "cpu_allocator": settings.allocator_name(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _compiled_twin(name: str, precision: str, options: dict[str, Any], xla: bool) -> keras.Model:
    model = models_lib.build(name, precision, **options)
    model.compile(optimizer=optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=xla)
    return model


def _time_block(model: keras.Model, x: np.ndarray, y: np.ndarray,
                steps: int) -> tuple[float, float]:
    """Mean (wall, process CPU) seconds per train step over ``steps`` steps; each step waits for
    its loss."""
    timer = step_phases.block_timer(lambda: model.train_on_batch(x, y),
                                    f"{model.name}: the training loss")
    return timer(steps)


def paired_ratio(first: list[float], second: list[float]) -> float:
    """Median over blocks of a block's time in ``first`` / the neighbouring block's in
    ``second``."""
    return statistics.median(a / b for a, b in zip(first, second))


def _interleave(timers: dict[str, BlockTimer], blocks: int,
                steps_per_block: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Runs ``blocks`` rounds of one block per timer, in the given order on even rounds and the
    reverse on odd ones; returns per-timer lists of (wall, CPU) seconds per step."""
    times: dict[str, list[float]] = {name: [] for name in timers}
    cpu: dict[str, list[float]] = {name: [] for name in timers}
    names = list(timers)
    for block in range(blocks):
        for name in names if block % 2 == 0 else reversed(names):
            wall, cpu_time = timers[name](steps_per_block)
            times[name].append(wall)
            cpu[name].append(cpu_time)
    return times, cpu


def _measure(name: str, xla: bool, batch_size: int, options: dict[str, Any], blocks: int,
             steps_per_block: int, warmup_steps: int, seed: int,
             companions: Companions | None = None, phases: bool = False,
             mixed_precision: str = "off") -> dict[str, Any]:
    # per row: Keras' clear_session() between rows resets the global policy to float32
    keras.mixed_precision.set_global_policy(POLICIES[mixed_precision])
    keras.utils.set_random_seed(seed)
    twins = {p: _compiled_twin(name, p, options, xla) for p in ("binary", "float")}
    input_shape = tuple(twins["binary"].input_shape[1:])
    num_classes = int(twins["binary"].output_shape[-1])
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch_size, *input_shape), dtype=np.float32)
    y = rng.integers(0, num_classes, size=(batch_size,))
    for model in twins.values():
        _time_block(model, x, y, warmup_steps)
    timers: dict[str, BlockTimer] = {
        p: functools.partial(_time_block, model, x, y) for p, model in twins.items()}
    if phases:
        for p, model in twins.items():
            for phase, timer in step_phases.phase_timers(model, x, y, xla, warmup_steps).items():
                timers[f"{p}_{phase}"] = timer
    options_out = {k: list(v) if isinstance(v, tuple) else v for k, v in options.items()}
    spec = {"model": name, "xla": xla, "batch_size": batch_size, "options": options_out,
            "warmup_steps": warmup_steps, "seed": seed, "mixed_precision": mixed_precision}
    extra = dict(companions(spec)) if companions else {}
    clash = set(extra) & set(timers)
    if clash:
        raise ValueError(f"companion timers may not be named {sorted(clash)}")
    times, cpu = _interleave({**timers, **extra}, blocks, steps_per_block)
    binary_ms = statistics.median(times["binary"]) * 1e3
    float_ms = statistics.median(times["float"]) * 1e3
    row = {
        "model": name, "xla": xla, "batch_size": batch_size,
        "binary_ms": binary_ms, "float_ms": float_ms,
        "ratio": paired_ratio(times["binary"], times["float"]),
        "binary_examples_per_second": batch_size / binary_ms * 1e3,
        "float_examples_per_second": batch_size / float_ms * 1e3,
        "binary_cpu_ms": statistics.median(cpu["binary"]) * 1e3,
        "float_cpu_ms": statistics.median(cpu["float"]) * 1e3,
        "cpu_ratio": paired_ratio(cpu["binary"], cpu["float"]),
        "blocks": blocks, "steps_per_block": steps_per_block, "warmup_steps": warmup_steps,
        "options": options_out, "mixed_precision": mixed_precision,
    }
    for label in times:
        row[f"{label}_block_ms"] = [t * 1e3 for t in times[label]]
        row[f"{label}_block_cpu_ms"] = [t * 1e3 for t in cpu[label]]
    if phases:
        step_phases.summarize(row, tuple(twins))
    return row


def run(
    models: Sequence[str] = ("binarynet_mlp", "vgg_small"),
    xla: Sequence[bool] = (True, False),
    batch_sizes: dict[str, int] | None = None,
    quick: bool = False,
    blocks: int = 9,
    steps_per_block: int = 10,
    warmup_steps: int = 3,
    seed: int = 0,
    companions: Companions | None = None,
    phases: bool = False,
    mixed_precision: str = "off",
) -> dict[str, Any]:
    """Times the train step of each model's binary and float twins under each XLA setting.

    Args:
        models: architecture names of :func:`bnn.models.build`.
        xla: ``jit_compile`` settings to measure, e.g. ``(True, False)``.
        batch_sizes: per model; defaults to :data:`DEFAULT_BATCH_SIZES` (MLP 100, VGG-small 50).
        quick: tiny versions of the models, batch 8, 2 blocks of 2 steps: checks the harness
            end to end in seconds; its numbers mean nothing.
        blocks: timed blocks per twin (the medians are over these).
        steps_per_block: train steps per block.
        warmup_steps: untimed steps per twin first (tracing, XLA compilation).
        seed: seed of the weights and the synthetic batch.
        companions: called once per (model, XLA setting) with ``{"model", "xla",
            "batch_size", "options", "warmup_steps", "seed", "mixed_precision"}``, after the
            twins' warm-up; returns more block timers, ``{label: timer(steps) -> (wall, CPU) seconds per step}``, already
            warmed up, that take their turns among the twins' blocks. Their blocks appear in the
            row as ``<label>_block_ms`` and ``<label>_block_cpu_ms`` (``benchmarks/step_time.py``
            times Larq this way).
        phases: also time each twin's forward pass and forward plus backward pass, in blocks of
            their own among the others, and add ``<twin>_forward_ms``, ``_backward_ms`` and
            ``_rest_ms`` to each row (see :mod:`bnn.tools.step_phases`).
        mixed_precision: ``"off"``, ``"bfloat16"`` or ``"float16"``: the Keras dtype policy the
            twins are built under (``training.mixed_precision``); each row records it.

    Returns:
        ``{"machine": machine_info(), "results": [one dict per (model, xla)]}``; see the module
        docstring for the fields.

    Raises:
        ValueError: for an unknown model name or a count below 1.
    """
    known = models_lib.names()
    unknown = [m for m in models if m not in known]
    if unknown:
        raise ValueError(f"unknown model(s) {', '.join(unknown)}; known models: {', '.join(known)}")
    for label, value in (("blocks", blocks), ("steps_per_block", steps_per_block),
                         ("warmup_steps", warmup_steps)):
        if int(value) < 1:
            raise ValueError(f"benchmark {label} must be >= 1, got {value!r}")
    if mixed_precision not in POLICIES:
        raise ValueError(f"mixed_precision must be one of {', '.join(POLICIES)}, "
                         f"got {mixed_precision!r}")
    if quick:
        blocks, steps_per_block, warmup_steps = 2, 2, 1
    sizes = {**DEFAULT_BATCH_SIZES, **(batch_sizes or {})}
    results = []
    previous = keras.mixed_precision.global_policy()
    try:
        for name in models:
            options = _QUICK_OPTIONS[name] if quick else {}
            batch_size = _QUICK_BATCH if quick else int(sizes[name])
            for jit in xla:
                row = _measure(name, bool(jit), batch_size, options, blocks, steps_per_block,
                               warmup_steps, seed, companions, phases, mixed_precision)
                results.append(row)
                keras.backend.clear_session()
    finally:
        keras.mixed_precision.set_global_policy(previous)
    return {"machine": machine_info(), "results": results}


def to_markdown(results: dict[str, Any]) -> str:
    """A markdown table of :func:`run`'s results, one row per (model, XLA setting).

    When rows carry ``larq_binary_ms`` (added by ``benchmarks/step_time.py``), more columns show
    Larq's steps, its binary/float ratio and ``bnn binary / Larq binary`` (wall and CPU time).
    """
    rows = results["results"]
    with_larq = any("larq_binary_ms" in row for row in rows)
    head = ["model", "XLA", "batch", "binary ms", "float ms", "binary/float", "CPU-time ratio",
            "binary ex/s", "float ex/s"]
    if with_larq:
        head += ["Larq binary ms", "Larq float ms", "Larq binary/float",
                 "bnn binary / Larq binary", "same, CPU time"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        model = row["model"] + ("" if row.get("mixed_precision", "off") == "off"
                                else f" ({row['mixed_precision']})")
        cells = [model, "on" if row["xla"] else "off", str(row["batch_size"]),
                 f"{row['binary_ms']:.1f}", f"{row['float_ms']:.1f}", f"{row['ratio']:.2f}",
                 f"{row['cpu_ratio']:.2f}",
                 f"{row['binary_examples_per_second']:.0f}",
                 f"{row['float_examples_per_second']:.0f}"]
        if with_larq:
            if "larq_binary_ms" in row:
                cells += [f"{row['larq_binary_ms']:.1f}", f"{row['larq_float_ms']:.1f}",
                          f"{row['larq_ratio']:.2f}", f"{row['bnn_over_larq']:.2f}",
                          f"{row['bnn_over_larq_cpu']:.2f}"]
            else:
                cells += ["-"] * 5
        lines.append("| " + " | ".join(cells) + " |")
    machine = results["machine"]
    lines.append("")
    lines.append(f"{machine['cpu']}, {machine['cores']} cores, {machine['device']}, "
                 f"TensorFlow {machine['tensorflow']}, Keras {machine['keras']}, "
                 f"{machine.get('cpu_allocator', 'default')} CPU allocator, "
                 f"{machine['date']}. Times are medians over interleaved blocks; binary/float is "
                 "the median of per-block-pair ratios.")
    phase_table = step_phases.to_markdown(rows, ("binary", "float"))
    if phase_table:
        lines += ["", "Phases (backward = forward and backward less forward; rest = whole step "
                  "less forward and backward: the update, constraints and Keras' step work):",
                  "", phase_table.rstrip("\n")]
    return "\n".join(lines) + "\n"


def build_parser(prog: str = "bnn bench") -> argparse.ArgumentParser:
    """The command-line flags of :func:`main` (see :mod:`bnn.benchmark_flags`)."""
    return benchmark_flags.add_arguments(argparse.ArgumentParser(
        prog=prog, description="Time the train step of binary models against their float twins."))


def run_from_args(args: argparse.Namespace,
                  companions: Companions | None = None) -> dict[str, Any]:
    """Runs :func:`run` with the parsed flags of :func:`build_parser`."""
    names = benchmark_flags.parse_models(args.models)
    sizes = {name: args.batch_size for name in names} if args.batch_size else None
    return run(names, args.xla, sizes, quick=args.quick, blocks=args.blocks,
               steps_per_block=args.steps, companions=companions, phases=args.phases,
               mixed_precision=args.mixed_precision)


def write_outputs(results: dict[str, Any], json_path: str | None,
                  markdown_path: str | None) -> str:
    """Writes the JSON and markdown files asked for; returns the markdown table."""
    table = to_markdown(results)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(results, f, indent=2)
    if markdown_path:
        with open(markdown_path, "w") as f:
            f.write(table)
    return table


def main(argv: Sequence[str] | None = None) -> int:
    """``bnn bench``: parse flags, time, print the table, write ``--json``/``--markdown``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    settings.select_pooling_allocator()
    try:
        results = run_from_args(args)
    except ValueError as error:
        parser.error(str(error))
    print(write_outputs(results, args.json, args.markdown), end="")
    return 0
