"""``bnn``: the command line. Thin: parse arguments, check the user's input, call the library.

    bnn train CONFIG.yaml [--precision binary|float] [--set KEY=VALUE ...] [--output-dir DIR]
    bnn compare CONFIG.yaml [--set KEY=VALUE ...] [--output-dir DIR] [--ablate distill] ...
    bnn summary CONFIG.yaml
    bnn bench [--quick] [--json PATH] ...
    bnn export SOURCE -o MODEL.bnn
    bnn evaluate MODEL --dataset NAME [--compare MODEL] [--json PATH]
    bnn predict MODEL INPUT.npy --dataset NAME [--compare MODEL] [-o OUT.npy]
    bnn import-larq MODEL -o MODEL.keras

Each command checks its arguments, the experiment file, the paths it reads and the run directory
it writes before it imports TensorFlow, so a mistake is reported within a fraction of a second,
as one line on standard error, ``bnn: error: <what is wrong>; <what to do>``, with exit code 2 and
nothing written. TensorFlow's start-up log lines are silenced unless ``--verbose`` is given or
``BNN_TF_LOG=1`` is set. Runs use TensorFlow's pooling CPU allocator
(:func:`bnn.settings.select_pooling_allocator`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from bnn import progress
from bnn.catalog import DATASETS, PRECISIONS
from bnn.cli import startup
from bnn.errors import Interrupted, UserError
from bnn.tools import benchmark_flags

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class _Parser(argparse.ArgumentParser):
    """argparse with mistakes reported as one :class:`UserError` line, without the usage block."""

    def error(self, message: str):
        where = "" if self.prog == "bnn" else f"{self.prog}: "
        raise UserError(f"{where}{message} (see '{self.prog} --help')")


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--verbose", action="store_true",
                   help="show TensorFlow's own log lines (also: BNN_TF_LOG=1)")


def _add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="experiment YAML file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set training.epochs=3 (repeatable)")
    p.add_argument("--output-dir", help="run directory (default: output_dir from the config)")
    p.add_argument("--data-dir", help="dataset folder (default: $BNN_DATA_DIR, then the Keras cache)")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    p.add_argument("--overwrite", action="store_true", help="replace a finished or unfinished run")
    p.add_argument("--quiet", action="store_true", help="no progress bar or progress lines")
    p.add_argument("--html", action="store_true",
                   help="also write a self-contained report.html beside report.md")
    _add_common(p)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="bnn", description="Binarized neural networks on Keras 3.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    train = sub.add_parser("train", help="train one model of an experiment")
    _add_run_arguments(train)
    train.add_argument("--precision", choices=("binary", "float"),
                       help="which twin (default: model.precision from the config)")
    compare = sub.add_parser("compare", help="train the binary model and its float twin, compare")
    _add_run_arguments(compare)
    compare.add_argument("--ablate", action="append", choices=("distill",), default=[],
                         help="also train the binary twin without training.distill, and report it")
    summary = sub.add_parser("summary", help="per-layer parameters, packed memory and MACs")
    summary.add_argument("config")
    summary.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    summary.add_argument("--precision", choices=PRECISIONS, default="binary")
    _add_common(summary)
    bench = sub.add_parser("bench", help="binary vs float train-step benchmark",
                           description="Time the train step of binary models against their "
                                       "float twins.")
    benchmark_flags.add_arguments(bench)
    _add_common(bench)
    export = sub.add_parser("export", help="export a trained model to a bit-packed .bnn file")
    export.add_argument("source", help="a run directory or a .keras file")
    export.add_argument("-o", "--output", required=True, help="the .bnn file to write")
    export.add_argument("--pixels", choices=("auto", "uint8", "float"), default="auto",
                        help="uint8: inputs are MNIST-style pixels u/127.5-1 and the first dense "
                             "layer runs on exact integers; auto: uint8 for a run directory (or "
                             "its binary/model.keras) of a BinaryNet MLP on (Fashion-)MNIST, "
                             "else float")
    _add_common(export)
    evaluate = sub.add_parser("evaluate", help="test accuracy and speed of a .bnn or .keras model")
    evaluate.add_argument("model")
    evaluate.add_argument("--dataset", required=True, choices=DATASETS)
    evaluate.add_argument("--data-dir")
    evaluate.add_argument("--json", help="also write the figures to this JSON file")
    _add_common(evaluate)
    predict = sub.add_parser("predict", help="predicted classes for inputs in a .npy file")
    predict.add_argument("model")
    predict.add_argument("inputs", help=".npy array of raw images (uint8, N×H×W[×C])")
    predict.add_argument("--dataset", required=True, choices=DATASETS,
                         help="dataset whose normalization to apply")
    predict.add_argument("-o", "--output", help="write logits to this .npy file")
    _add_common(predict)
    for p in (evaluate, predict):
        p.add_argument("--compare", metavar="MODEL", help="also time this model (e.g. the float "
                       "twin's model.keras) the same way, interleaved, and print the speed-up")
        p.add_argument("--batch-size", type=_positive, help="examples per call (default: the "
                       "fastest of 64, 256, 1024, calibrated on the data)")
        p.add_argument("--workers", type=_positive, help="batches in flight at once (default: "
                       "the faster of 1 and 2, calibrated)")
    larq = sub.add_parser("import-larq", help="convert a model saved by Larq to a Keras 3 model")
    larq.add_argument("model", help="a .h5 or .keras file, or a SavedModel directory, from Larq")
    larq.add_argument("-o", "--output", required=True, help="the .keras file to write")
    _add_common(larq)
    return parser


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return int(text)


# -- checks made before TensorFlow is imported ----------------------------------------------------

def _existing(path: str, what: str, fix: str) -> Path:
    """``path`` as a Path, or a UserError when nothing is there."""
    found = Path(path)
    if not found.exists():
        raise UserError(f"{path}: no such {what}; {fix}")
    return found


def _data_dir(value: str | None) -> str | None:
    """``--data-dir`` as an absolute path (so that it means the same in every worker process),
    checked to be a folder."""
    if value is None:
        return None
    path = Path(os.path.abspath(os.path.expanduser(value)))
    if not path.is_dir():
        raise UserError(f"--data-dir {value}: no such folder; give the folder that holds the "
                        "dataset files, or leave it out to use $BNN_DATA_DIR and the Keras cache")
    return str(path)


def _model_file(path: str) -> Path:
    model = _existing(path, "model file", "give a .bnn file from 'bnn export' or a .keras model")
    if model.suffix not in (".bnn", ".keras"):
        raise UserError(f"{path}: not a .bnn or .keras file; give a model written by "
                        "'bnn export' (.bnn) or by Keras (.keras)")
    return model


# -- commands ----------------------------------------------------------------------------------

def _run(args: argparse.Namespace, precisions: Sequence[str] | None) -> int:
    from bnn import settings
    from bnn.train.config import load_config
    from bnn.train.twins import plan_twins

    config = load_config(args.config, args.overrides)
    settings.check()
    data_dir = _data_dir(args.data_dir)
    shared_dir = Path(args.output_dir or config.output_dir)
    plan = plan_twins(config, precisions or [config.model.precision],
                      tuple(getattr(args, "ablate", ())), shared_dir)
    with progress.enabled(not args.quiet):
        return _train_and_report(args, config, plan, data_dir, shared_dir)


def _train_and_report(args, config, plan, data_dir, shared_dir) -> int:
    from bnn.train.config import dump_config
    from bnn.train.rundir import RunLock, prepare_run_dir

    if config.training.distribute == "multi_worker":
        startup.start_tensorflow(args.verbose)  # the workers meet before any of them writes
        from bnn.train.runtime import worker_run_dir

        place = worker_run_dir(config, shared_dir)
    else:
        place = contextlib.nullcontext(shared_dir)
    with place as run_dir, RunLock(run_dir):
        prepare_run_dir(run_dir, args.resume, args.overwrite)
        dump_config(config, run_dir / "config.yaml")
        startup.start_tensorflow(args.verbose)
        from bnn.tools import report as report_lib
        from bnn.train import trainer

        verbose = 0 if args.quiet else (1 if sys.stdout.isatty() else 2)
        twins = {}
        for label, precision, twin_config in plan:
            twins[label] = trainer.train_twin(twin_config, precision, run_dir, data_dir,
                                              resume=args.resume, verbose=verbose, label=label)
        meta = {"name": config.name, "config": str(args.config), "model": config.model.name,
                "dataset": config.dataset.name, "batch_size": config.training.batch_size,
                "xla": config.training.xla}
        report = report_lib.build_report({p: t.summary() for p, t in twins.items()}, meta,
                                         {p: t.history for p, t in twins.items()})
        written = report_lib.write_report(run_dir, report, html_page=args.html)
    print(report_lib.to_markdown(report))
    if run_dir != shared_dir:
        print(f"bnn: worker done; the chief worker writes {shared_dir}")
        return 0
    print(f"bnn: wrote {', '.join(str(p) for p in written)}; "
          f"curves over time: tensorboard --logdir {run_dir}")
    return 0


def _summary(args: argparse.Namespace) -> int:
    from bnn.train.config import load_config

    config = load_config(args.config, args.overrides)
    startup.start_tensorflow(args.verbose)
    from bnn import models
    from bnn.models import summary
    from bnn.train.data import load_arrays

    shapes = {"mnist": ((28, 28, 1), 10), "fashion_mnist": ((28, 28, 1), 10),
              "cifar10": ((32, 32, 3), 10)}
    input_shape, classes = shapes.get(config.dataset.name) or (
        load_arrays(config.dataset.name).input_shape, 10)
    model = models.build(config.model.name, args.precision,
                         **{"input_shape": input_shape, "num_classes": classes,
                            **config.model.options})
    print(summary.format_table(summary.summarize(model)))
    return 0


def _bench(args: argparse.Namespace) -> int:
    try:
        benchmark_flags.check(args)
    except ValueError as error:
        raise UserError(f"bnn bench: {error}") from None
    startup.start_tensorflow(args.verbose)
    from bnn.tools import benchmark

    results = benchmark.run_from_args(args)
    print(benchmark.write_outputs(results, args.json, args.markdown), end="")
    return 0


def _pixel_encoding(args: argparse.Namespace) -> tuple[float, float] | None:
    """``(scale, offset)`` of the pixel normalization when ``--pixels`` asks for it, or for a
    run directory of a BinaryNet MLP on MNIST or Fashion-MNIST (``u / 127.5 - 1``): the packed
    model's first layer then runs on exact integer products of uint8 pixels."""
    if args.pixels == "float":
        return None
    if args.pixels == "uint8":
        return (1 / 127.5, -1.0)
    source = Path(args.source)
    config_path = source / "config.yaml"
    if source.is_file() and source.parent.name == "binary":  # RUN_DIR/binary/model.keras
        config_path = source.parent.parent / "config.yaml"
    if not config_path.is_file():
        return None
    from bnn.train.config import load_config

    config = load_config(config_path)
    if config.dataset.name in ("mnist", "fashion_mnist") and config.model.name == "binarynet_mlp":
        return (1 / 127.5, -1.0)
    return None


def _export(args: argparse.Namespace) -> int:
    _existing(args.source, "run directory or .keras file",
              "give a run directory written by 'bnn train' or a .keras model file")
    encoding = _pixel_encoding(args)
    startup.start_tensorflow(args.verbose)
    from bnn.packed import export

    info = export.export_model(args.source, args.output, input_encoding=encoding)
    print(json.dumps(info, indent=2, default=str))
    if args.pixels == "auto" and info["uint8_input_possible"]:
        print("bnn: note: the first layer stays a float product of real inputs; if they are "
              "pixels u/127.5-1 (bnn's MNIST), export with --pixels uint8 for exact integer "
              "products, several times faster", file=sys.stderr)
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    _model_file(args.model)
    if args.compare:
        _model_file(args.compare)
    data_dir = _data_dir(args.data_dir)
    startup.start_tensorflow(args.verbose)
    from bnn.packed import export
    from bnn.train import data

    arrays = data.load_arrays(args.dataset, data_dir)
    x = data.normalize(args.dataset, arrays.x_test)
    figures = export.evaluate(args.model, x, arrays.y_test, batch_size=args.batch_size,
                              workers=args.workers, compare=args.compare)
    figures = {"dataset": args.dataset, **figures}
    print(json.dumps(figures, indent=2))
    if args.json:
        from bnn.files import write_json

        write_json(Path(args.json), figures)
    return 0


def _predict(args: argparse.Namespace) -> int:
    _model_file(args.model)
    if args.compare:
        _model_file(args.compare)
    _existing(args.inputs, "input file", "give a .npy array of images")
    startup.start_tensorflow(args.verbose)
    import numpy as np

    from bnn.packed import export
    from bnn.train import data

    try:
        raw = np.load(args.inputs, allow_pickle=False)
    except (OSError, ValueError) as error:
        raise export.ExportError(f"{args.inputs}: cannot read a .npy array ({error})") from None
    if raw.ndim == 3:
        raw = raw[..., None]
    x = data.normalize(args.dataset, raw)
    result = export.predict(args.model, x, batch_size=args.batch_size, workers=args.workers,
                            compare=args.compare)
    for i, label in enumerate(result["logits"].argmax(axis=-1)):
        print(f"{i}\t{label}")
    if args.output:
        np.save(args.output, result["logits"])
    for figures in [result] + ([result["compare"]] if args.compare else []):
        print(f"bnn: {figures['model']}: {figures['examples_per_second']:,.0f} examples/s "
              f"(batch {figures['batch_size']}, {figures['workers']} in flight"
              f"{', XLA' if figures['xla'] else ''})", file=sys.stderr)
    if args.compare:
        print(f"bnn: speed-up over {args.compare}: {result['speedup']:.2f}x", file=sys.stderr)
    return 0


def _import_larq(args: argparse.Namespace) -> int:
    _existing(args.model, "Larq model", "give a .h5 or .keras file or a SavedModel directory "
              "saved by Larq")
    startup.start_tensorflow(args.verbose)
    from bnn.larq import conversion

    print(json.dumps(conversion.convert_file(args.model, args.output), indent=2))
    return 0


_COMMANDS: dict[str, Any] = {
    "train": lambda args: _run(args, [args.precision] if args.precision else None),
    "compare": lambda args: _run(args, ["binary", "float"]),
    "summary": _summary,
    "bench": _bench,
    "export": _export,
    "evaluate": _evaluate,
    "predict": _predict,
    "import-larq": _import_larq,
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _parser().parse_args(argv)
        return _COMMANDS[args.command](args)
    except UserError as error:
        print(f"bnn: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except (KeyboardInterrupt, Interrupted) as error:
        print(f"bnn: {error or 'interrupted'}", file=sys.stderr)
        return EXIT_INTERRUPTED

