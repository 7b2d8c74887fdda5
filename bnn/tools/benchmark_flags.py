"""The flags of ``bnn bench`` (and ``benchmarks/step_time.py``), parsed and checked without
importing TensorFlow, so that a mistake in them is reported before the benchmark starts."""

from __future__ import annotations

import argparse

from bnn import catalog

__all__ = ["add_arguments", "parse_models", "check"]




def _xla_settings(value: str) -> tuple[bool, ...]:
    settings = {"on": (True,), "off": (False,), "both": (True, False)}
    if value not in settings:
        raise argparse.ArgumentTypeError(f"--xla must be on, off or both, got {value!r}")
    return settings[value]


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value!r}")
    return number


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds the benchmark's flags to ``parser``; returns it."""
    parser.add_argument("--models", default="binarynet_mlp,vgg_small",
                        help="comma-separated architectures (default: binarynet_mlp,vgg_small)")
    parser.add_argument("--xla", type=_xla_settings, default=(True, False), metavar="on|off|both",
                        help="jit_compile setting(s) to time (default: both)")
    parser.add_argument("--quick", action="store_true",
                        help="tiny models and few steps: checks the harness in seconds")
    parser.add_argument("--blocks", type=_positive, default=9,
                        help="timed blocks per twin (default 9)")
    parser.add_argument("--steps", type=_positive, default=10,
                        help="train steps per block (default 10)")
    parser.add_argument("--batch-size", type=_positive, default=None,
                        help="one batch size for every model (default: MLP 100, VGG-small 50)")
    parser.add_argument("--phases", action="store_true",
                        help="also time the forward pass and forward plus backward pass alone")
    parser.add_argument("--mixed-precision", choices=catalog.MIXED_PRECISIONS, default="off",
                        help="build the twins under this Keras mixed-precision policy (default off)")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON here")
    parser.add_argument("--markdown", metavar="PATH", help="write the markdown table here")
    return parser


def parse_models(value: str) -> tuple[str, ...]:
    """``"a,b"`` -> ``("a", "b")``, each checked against :func:`bnn.catalog.model_names`.

    Raises:
        ValueError: for an empty list or an unknown architecture, naming the known ones.
    """
    names = tuple(m.strip() for m in value.split(",") if m.strip())
    known = catalog.model_names()
    unknown = [m for m in names if m not in known]
    if not names or unknown:
        raise ValueError(f"--models: unknown or empty {', '.join(unknown) or value!r}; "
                         f"choose from {', '.join(known)}")
    return names


def check(args: argparse.Namespace) -> None:
    """Checks the parsed flags that argparse cannot: the model names.

    Raises:
        ValueError: naming the flag, the problem and the choices.
    """
    parse_models(args.models)
