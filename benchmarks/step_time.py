"""Train-step time of bnn's binary models against their float twins, optionally beside Larq.

    python benchmarks/step_time.py [--models binarynet_mlp,vgg_small] [--xla on|off|both]
        [--quick] [--blocks 9] [--steps 10] [--json PATH] [--markdown PATH]
        [--larq-python /path/to/larq-env/bin/python]

Without ``--larq-python`` this is ``bnn bench``. With it, the same models, batch sizes and XLA
settings are also trained in Larq by ``benchmarks/larq_step_time.py``, running in that
interpreter (an environment with ``larq`` and ``tf-keras``; bnn does not depend on Larq). Larq's
process is started once and serves timed blocks on request, so Larq's binary and float blocks take
their turns among bnn's (bnn binary, bnn float, Larq binary, Larq float, then the reverse) and
every ratio is a median of ratios between blocks of the same round. Each result row gains
``larq_binary_ms``, ``larq_float_ms``, ``larq_ratio``, ``larq_binary_cpu_ms``,
``larq_float_cpu_ms``, ``larq_cpu_ratio``, ``bnn_over_larq`` (bnn binary step / Larq binary
step, wall time; below 1 means bnn is faster) and ``bnn_over_larq_cpu`` (the same in process CPU
time).
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

from bnn.cli.startup import start_tensorflow

start_tensorflow()  # the pooling CPU allocator, and TensorFlow without its start-up log lines

from bnn.tools import benchmark  # noqa: E402

LARQ_SCRIPT = Path(__file__).with_name("larq_step_time.py")
LARQ_LABELS = ("larq_binary", "larq_float")


class LarqServer:
    """``larq_step_time.py`` running under another Python, timing Larq's models on request.

    Called with a benchmark run's spec (see :func:`bnn.tools.benchmark.run`'s ``companions``), it
    builds and warms up Larq's twins and returns their block timers.
    """

    def __init__(self, python: str, script: Path | None = None) -> None:
        self.python = python
        script = script or LARQ_SCRIPT
        self.versions: dict[str, str] = {}
        self._log = tempfile.TemporaryFile("w+")
        env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
        try:
            self._process = subprocess.Popen([python, str(script)], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, stderr=self._log,
                                             text=True, env=env)
        except OSError as error:
            raise SystemExit(f"--larq-python {python!r} cannot be run ({error}); give the path "
                             "of a Python that has larq and tf-keras installed") from None

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        """Sends one request; returns the answer or exits with the Larq side's reason."""
        try:
            self._process.stdin.write(json.dumps(request) + "\n")
            self._process.stdin.flush()
            line = self._process.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            self._process.wait()
            self._log.seek(0)
            tail = "\n".join(self._log.read().strip().splitlines()[-5:])
            raise SystemExit(f"the Larq benchmark under {self.python!r} stopped (exit "
                             f"{self._process.returncode}):\n{tail}\nCheck that this Python "
                             "has larq and tf-keras installed.")
        answer = json.loads(line)
        if "error" in answer:
            raise SystemExit(f"the Larq benchmark under {self.python!r}: {answer['error']}")
        return answer

    def __call__(self, spec: dict[str, Any]) -> dict[str, benchmark.BlockTimer]:
        answer = self.ask({"op": "setup", **spec})
        self.versions = {"larq": answer["larq"], "larq_tensorflow": answer["tensorflow"]}
        return {label: functools.partial(self._block, label.split("_", 1)[1])
                for label in LARQ_LABELS}

    def _block(self, precision: str, steps: int) -> tuple[float, float]:
        answer = self.ask({"op": "block", "precision": precision, "steps": steps})
        return float(answer["wall"]), float(answer["cpu"])

    def close(self) -> None:
        if self._process.poll() is None:
            self._process.stdin.close()
            try:
                self._process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._process.kill()
        self._log.close()


def add_larq_fields(results: dict[str, Any], versions: dict[str, str]) -> dict[str, Any]:
    """Turns each row's interleaved Larq blocks into its Larq fields and the bnn / Larq ratios."""
    median_ms = statistics.median
    for row in results["results"]:
        larq = {label: row[f"{label}_block_ms"] for label in LARQ_LABELS}
        larq_cpu = {label: row[f"{label}_block_cpu_ms"] for label in LARQ_LABELS}
        row.update(
            larq_binary_ms=median_ms(larq["larq_binary"]),
            larq_float_ms=median_ms(larq["larq_float"]),
            larq_ratio=benchmark.paired_ratio(larq["larq_binary"], larq["larq_float"]),
            larq_binary_cpu_ms=median_ms(larq_cpu["larq_binary"]),
            larq_float_cpu_ms=median_ms(larq_cpu["larq_float"]),
            larq_cpu_ratio=benchmark.paired_ratio(larq_cpu["larq_binary"],
                                                  larq_cpu["larq_float"]),
            bnn_over_larq=benchmark.paired_ratio(row["binary_block_ms"], larq["larq_binary"]),
            bnn_over_larq_cpu=benchmark.paired_ratio(row["binary_block_cpu_ms"],
                                                     larq_cpu["larq_binary"]))
    results["machine"].update(versions)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = benchmark.build_parser(prog="benchmarks/step_time.py")
    parser.add_argument("--larq-python", metavar="PATH",
                        help="Python of an environment with larq and tf-keras: time Larq too")
    args = parser.parse_args(argv)
    larq = LarqServer(args.larq_python) if args.larq_python else None
    try:
        results = benchmark.run_from_args(args, companions=larq)
    except ValueError as error:
        parser.error(str(error))
    finally:
        if larq is not None:
            larq.close()
    if larq is not None:
        results = add_larq_fields(results, larq.versions)
    print(benchmark.write_outputs(results, args.json, args.markdown), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
