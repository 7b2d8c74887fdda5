"""Train-step time of bnn's binary models against their float twins, optionally beside Larq.

    python benchmarks/step_time.py [--models binarynet_mlp,vgg_small] [--xla on|off|both]
        [--quick] [--blocks 9] [--steps 10] [--json PATH] [--markdown PATH]
        [--larq-python /path/to/larq-env/bin/python]

Without ``--larq-python`` this is ``bnn bench``. With it, after bnn's runs, the same models,
batch sizes and XLA settings are timed in Larq by ``benchmarks/larq_step_time.py`` running in
that interpreter (an environment with ``larq`` and ``tf-keras``; bnn does not depend on Larq),
and each result row gains ``larq_binary_ms``, ``larq_float_ms``, ``larq_ratio``,
``larq_binary_cpu_ms``, ``larq_float_cpu_ms``, ``larq_cpu_ratio``, ``bnn_over_larq`` (bnn binary
step / Larq binary step, wall time; below 1 means bnn is faster) and ``bnn_over_larq_cpu`` (the
same in process CPU time). bnn and Larq run one after the other, in separate processes, so
those two ratios are not interleaved.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

from bnn import benchmark

LARQ_SCRIPT = Path(__file__).with_name("larq_step_time.py")


def larq_results(python: str, results: dict[str, Any], blocks: int, steps_per_block: int,
                 warmup_steps: int) -> dict[str, Any]:
    """Runs ``larq_step_time.py`` under ``python`` for the runs in ``results``; returns its JSON."""
    runs = [{"model": row["model"], "xla": row["xla"], "batch_size": row["batch_size"],
             "options": row["options"]} for row in results["results"]]
    config = {"runs": runs, "blocks": blocks, "steps_per_block": steps_per_block,
              "warmup_steps": warmup_steps}
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1"}
    try:
        done = subprocess.run([python, str(LARQ_SCRIPT), "--config", json.dumps(config)],
                              capture_output=True, text=True, env=env, check=False)
    except OSError as error:
        raise SystemExit(f"--larq-python {python!r} cannot be run ({error}); give the path of "
                         "a Python that has larq and tf-keras installed") from None
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise SystemExit(f"the Larq benchmark under {python!r} failed (exit {done.returncode}):\n"
                         f"{tail}\nCheck that this Python has larq and tf-keras installed.")
    return json.loads(done.stdout.strip().splitlines()[-1])


def merge(results: dict[str, Any], larq: dict[str, Any]) -> dict[str, Any]:
    """Adds Larq's figures to bnn's rows of the same (model, xla, batch_size)."""
    by_key = {(r["model"], r["xla"], r["batch_size"]): r for r in larq["results"]}
    for row in results["results"]:
        other = by_key[(row["model"], row["xla"], row["batch_size"])]
        row.update(larq_binary_ms=other["binary_ms"], larq_float_ms=other["float_ms"],
                   larq_ratio=other["ratio"], larq_binary_cpu_ms=other["binary_cpu_ms"],
                   larq_float_cpu_ms=other["float_cpu_ms"], larq_cpu_ratio=other["cpu_ratio"],
                   bnn_over_larq=row["binary_ms"] / other["binary_ms"],
                   bnn_over_larq_cpu=row["binary_cpu_ms"] / other["binary_cpu_ms"])
    results["machine"].update(larq=larq["larq"], larq_tensorflow=larq["tensorflow"])
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = benchmark.build_parser(prog="benchmarks/step_time.py")
    parser.add_argument("--larq-python", metavar="PATH",
                        help="Python of an environment with larq and tf-keras: time Larq too")
    args = parser.parse_args(argv)
    try:
        results = benchmark.run_from_args(args)
    except ValueError as error:
        parser.error(str(error))
    if args.larq_python:
        rows = results["results"]
        results = merge(results, larq_results(args.larq_python, results, rows[0]["blocks"],
                                              rows[0]["steps_per_block"],
                                              rows[0]["warmup_steps"]))
    print(benchmark.write_outputs(results, args.json, args.markdown), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
