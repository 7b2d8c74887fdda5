"""The train step a user's own Keras script gets: the README's BinaryNet MLP, written as a user
writes it, against its float twin, each run in a fresh process with a clean environment.

    python benchmarks/user_script.py [--rounds 3] [--steps 30] [--quick] [--json PATH]

The script imports only keras, numpy and bnn, builds the 784-2048-2048-2048-10 MLP of the
README ("BinaryNet in ten lines of Keras") or its float twin (``precision="float"``), compiles it
with ``"adam"`` (Keras' own Adam), and times ``model.train_on_batch`` on a batch of 100 after
warm-up steps. Each process runs one twin with one XLA setting: Keras' default on a CPU (no
XLA), or ``jit_compile=True``. The environment the scripts get has none of the variables bnn or
its benchmarks set (``TF_CPU_ALLOCATOR_USE_BFC``, ``BNN_*``), so TensorFlow runs with its
default allocator, as in a user's shell. Rounds take turns: binary, float, float, binary, ...

Reported: each twin's median step per XLA setting (median over rounds of each process's median
step), its best setting, and ``ratio``: the median over rounds of (the binary twin's best step in
the round) / (the float twin's best step in the round); below 1 means the binary model trains
faster.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

from bnn.cli.startup import start_tensorflow

SCRIPT = """
import sys, time
import keras, numpy as np
import bnn

precision, jit, steps, units = sys.argv[1], sys.argv[2] == "on", int(sys.argv[3]), int(sys.argv[4])
model = keras.Sequential([
    keras.Input((28, 28, 1)), keras.layers.Flatten(),
    bnn.BinaryDense(units, input_quantizer=None, precision=precision),
    keras.layers.BatchNormalization(momentum=0.9),
    bnn.BinaryDense(units, precision=precision), keras.layers.BatchNormalization(momentum=0.9),
    bnn.BinaryDense(units, precision=precision), keras.layers.BatchNormalization(momentum=0.9),
    bnn.BinaryDense(10, precision=precision), keras.layers.BatchNormalization(momentum=0.9, scale=False),
])
compile_args = {"jit_compile": True} if jit else {}
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"], **compile_args)
rng = np.random.default_rng(0)
x = rng.integers(0, 256, (100, 28, 28, 1)).astype("float32") / 127.5 - 1
y = rng.integers(0, 10, 100)
for _ in range(5):
    model.train_on_batch(x, y)
times = []
for _ in range(steps):
    start = time.perf_counter()
    model.train_on_batch(x, y)
    times.append(time.perf_counter() - start)
times.sort()
print("step_ms", 1000 * times[len(times) // 2])
"""

TWINS = ("binary", "float")
SETTINGS = {"default": "off", "xla": "on"}


def clean_environment() -> dict[str, str]:
    """This process's environment without the variables bnn or its benchmarks set, and with
    TensorFlow's log lines off (which changes nothing of the step)."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("BNN_") and key not in ("TF_CPU_ALLOCATOR_USE_BFC",
                                                         "TF_CPP_MIN_LOG_LEVEL")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    return env


def run_script(path: Path, twin: str, setting: str, steps: int, units: int) -> float:
    """One fresh process: the median step of ``twin`` with ``setting``, in ms."""
    done = subprocess.run([sys.executable, str(path), twin, SETTINGS[setting], str(steps),
                           str(units)], capture_output=True, text=True, timeout=900,
                          env=clean_environment(), cwd=path.parent)
    figures = [line.split() for line in done.stdout.splitlines() if line.startswith("step_ms")]
    if done.returncode != 0 or not figures:
        raise SystemExit(f"user_script: the {twin} script ({setting}) failed:\n"
                         f"{done.stderr[-3000:]}")
    return float(figures[-1][1])


def measure(rounds: int, steps: int, units: int) -> dict[str, Any]:
    """Every twin and setting once per round, in fresh processes; the figures of the module
    docstring."""
    runs: dict[str, dict[str, list[float]]] = {t: {s: [] for s in SETTINGS} for t in TWINS}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train_binarynet.py"
        path.write_text(SCRIPT)
        for index in range(rounds):
            order = TWINS if index % 2 == 0 else TWINS[::-1]
            for twin in order:
                for setting in SETTINGS:
                    runs[twin][setting].append(run_script(path, twin, setting, steps, units))
    best_by_round = {twin: [min(values) for values in zip(*runs[twin].values())]
                     for twin in TWINS}
    result: dict[str, Any] = {}
    for twin in TWINS:
        medians = {setting: statistics.median(values) for setting, values in runs[twin].items()}
        best = min(medians, key=medians.get)
        result[twin] = {"ms": medians, "rounds_ms": runs[twin], "best": best,
                        "best_ms": medians[best]}
    result["ratio"] = statistics.median(
        b / f for b, f in zip(best_by_round["binary"], best_by_round["float"]))
    return result


def to_markdown(results: dict[str, Any]) -> str:
    lines = ["| twin | default (no XLA) ms | XLA ms | best |", "|---|---|---|---|"]
    for twin in TWINS:
        row = results[twin]
        lines.append(f"| {twin} | {row['ms']['default']:.1f} | {row['ms']['xla']:.1f} | "
                     f"{row['best']} |")
    lines.append(f"\nbinary/float at each one's best: {results['ratio']:.2f} "
                 f"({results['rounds']} rounds, {results['steps']} timed steps per process, "
                 f"hidden units {results['units']}, {results['cpu']}).")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/user_script.py", description=__doc__
                                     .split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every run (default 3)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per run (default 30)")
    parser.add_argument("--quick", action="store_true",
                        help="64 hidden units, 1 round, 3 steps: checks the harness")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON here")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.steps < 1:
        parser.error("--rounds and --steps must be at least 1")
    rounds, steps, units = (1, 3, 64) if args.quick else (args.rounds, args.steps, 2048)
    results = measure(rounds, steps, units)
    start_tensorflow()  # quietly, for the machine's description
    from bnn.native.dispatch import cpu_model

    results.update(rounds=rounds, steps=steps, units=units, cpu=cpu_model(),
                   cores=os.cpu_count())
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    print(to_markdown(results), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
