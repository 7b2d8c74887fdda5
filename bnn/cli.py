"""``bnn``: the command line. Thin: parse arguments, call the library, turn user mistakes into
one-line errors with exit code 2.

    bnn train CONFIG.yaml [--precision binary|float] [--set KEY=VALUE ...] [--output-dir DIR]
    bnn compare CONFIG.yaml [--set KEY=VALUE ...] [--output-dir DIR] [--ablate distill] ...
    bnn summary CONFIG.yaml
    bnn bench [--quick] [--json PATH] ...
    bnn export SOURCE -o MODEL.bnn
    bnn evaluate MODEL --dataset NAME [--json PATH]
    bnn predict MODEL INPUT.npy [--dataset NAME] [-o OUT.npy]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def _add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="experiment YAML file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set training.epochs=3 (repeatable)")
    p.add_argument("--output-dir", help="run directory (default: output_dir from the config)")
    p.add_argument("--data-dir", help="dataset folder (default: $BNN_DATA_DIR, then the Keras cache)")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    p.add_argument("--overwrite", action="store_true", help="replace a finished or unfinished run")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bnn", description="Binarized neural networks on Keras 3.")
    sub = parser.add_subparsers(dest="command", required=True)
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
    summary.add_argument("--precision", choices=("binary", "float"), default="binary")
    sub.add_parser("bench", help="binary vs float train-step benchmark (see bnn bench --help)",
                   add_help=False)
    export = sub.add_parser("export", help="export a trained model to a bit-packed .bnn file")
    export.add_argument("source", help="a run directory or a .keras file")
    export.add_argument("-o", "--output", required=True, help="the .bnn file to write")
    export.add_argument("--pixels", choices=("auto", "uint8", "float"), default="auto",
                        help="uint8: inputs are MNIST-style pixels u/127.5-1 and the first dense "
                             "layer runs on exact integers; auto: uint8 for a run directory of a "
                             "BinaryNet MLP on (Fashion-)MNIST, else float")
    evaluate = sub.add_parser("evaluate", help="test accuracy and speed of a .bnn or .keras model")
    evaluate.add_argument("model")
    evaluate.add_argument("--dataset", required=True)
    evaluate.add_argument("--data-dir")
    evaluate.add_argument("--batch-size", type=int, default=500)
    evaluate.add_argument("--json", help="also write the figures to this JSON file")
    predict = sub.add_parser("predict", help="predicted classes for inputs in a .npy file")
    predict.add_argument("model")
    predict.add_argument("inputs", help=".npy array of raw images (uint8, N×H×W[×C])")
    predict.add_argument("--dataset", required=True, help="dataset whose normalization to apply")
    predict.add_argument("-o", "--output", help="write logits to this .npy file")
    return parser


def _user_errors() -> tuple[type[Exception], ...]:
    from bnn.config import ConfigError
    from bnn.data import DataError
    from bnn.export import ExportError
    from bnn.rundir import RunDirError
    from bnn.runtime import TrainingError

    return ConfigError, DataError, ExportError, RunDirError, TrainingError


def _run(args: argparse.Namespace, precisions: Sequence[str] | None) -> int:
    from bnn import report as report_lib
    from bnn import training
    from bnn.config import load_config
    from bnn.rundir import RunLock
    from bnn.runtime import check_environment, worker_run_dir

    config = load_config(args.config, args.overrides)
    check_environment()
    precisions = precisions or [config.model.precision]
    shared_dir = Path(args.output_dir or config.output_dir)
    with worker_run_dir(config, shared_dir) as run_dir, RunLock(run_dir):
        training.prepare_run_dir(run_dir, args.resume, args.overwrite)
        training.write_config_copy(config, run_dir)
        verbose = 0 if args.quiet else (1 if sys.stdout.isatty() else 2)
        twins = {}
        for label, precision, twin_config in training.plan_twins(
                config, precisions, tuple(getattr(args, "ablate", ()))):
            result = training.train_twin(twin_config, precision, run_dir, args.data_dir,
                                         resume=args.resume, verbose=verbose, label=label)
            twins[label] = result.summary()
        meta = {"name": config.name, "config": str(args.config), "model": config.model.name,
                "dataset": config.dataset.name, "batch_size": config.training.batch_size,
                "xla": config.training.xla}
        report = report_lib.build_report(twins, meta)
        report_lib.write_report(run_dir, report)
    print(report_lib.to_markdown(report))
    if run_dir != shared_dir:
        print(f"bnn: worker done; the chief worker writes {shared_dir}")
        return 0
    print(f"bnn: wrote {run_dir / 'report.json'}; curves: tensorboard --logdir {run_dir}")
    return 0


def _summary(args: argparse.Namespace) -> int:
    from bnn import models, summary
    from bnn.config import load_config
    from bnn.data import load_arrays

    config = load_config(args.config, args.overrides)
    shapes = {"mnist": ((28, 28, 1), 10), "fashion_mnist": ((28, 28, 1), 10),
              "cifar10": ((32, 32, 3), 10)}
    input_shape, classes = shapes.get(config.dataset.name) or (
        load_arrays(config.dataset.name).input_shape, 10)
    model = models.build(config.model.name, args.precision,
                         **{"input_shape": input_shape, "num_classes": classes,
                            **config.model.options})
    print(summary.format_table(summary.summarize(model)))
    return 0


def _pixel_encoding(args: argparse.Namespace) -> tuple[float, float] | None:
    """``(scale, offset)`` of the pixel normalization when ``--pixels`` asks for it, or for a
    run directory of a BinaryNet MLP on MNIST or Fashion-MNIST (``u / 127.5 - 1``): the packed
    model's first layer then runs on exact integer products of uint8 pixels."""
    if args.pixels == "float":
        return None
    if args.pixels == "uint8":
        return (1 / 127.5, -1.0)
    config_path = Path(args.source) / "config.yaml"
    if not config_path.is_file():
        return None
    from bnn.config import load_config

    config = load_config(config_path)
    if config.dataset.name in ("mnist", "fashion_mnist") and config.model.name == "binarynet_mlp":
        return (1 / 127.5, -1.0)
    return None


def _evaluate(args: argparse.Namespace) -> int:
    from bnn import data, export

    arrays = data.load_arrays(args.dataset, args.data_dir)
    x = data.normalize(args.dataset, arrays.x_test)
    figures = export.evaluate(args.model, x, arrays.y_test, batch_size=args.batch_size)
    figures = {"model": str(args.model), "dataset": args.dataset, **figures}
    print(json.dumps(figures, indent=2))
    if args.json:
        from bnn.rundir import write_json

        write_json(Path(args.json), figures)
    return 0


def _predict(args: argparse.Namespace) -> int:
    import keras
    import numpy as np

    from bnn import data, export

    try:
        raw = np.load(args.inputs, allow_pickle=False)
    except (OSError, ValueError) as error:
        raise export.ExportError(f"{args.inputs}: cannot read a .npy array ({error})") from None
    if raw.ndim == 3:
        raw = raw[..., None]
    model = export.load_any(args.model)
    x = data.normalize(args.dataset, raw)
    logits = np.asarray(model.predict(x, verbose=0) if isinstance(model, keras.Model)
                        else model.predict(x))
    for i, label in enumerate(logits.argmax(axis=-1)):
        print(f"{i}\t{label}")
    if args.output:
        np.save(args.output, logits)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        from bnn import benchmark

        return benchmark.main(argv[1:]) or 0
    args = _parser().parse_args(argv)
    errors = _user_errors()
    from bnn.training import Interrupted

    try:
        if args.command == "train":
            return _run(args, [args.precision] if args.precision else None)
        if args.command == "compare":
            return _run(args, ["binary", "float"])
        if args.command == "summary":
            return _summary(args)
        if args.command == "export":
            from bnn import export

            info = export.export_model(args.source, args.output,
                                       input_encoding=_pixel_encoding(args))
            print(json.dumps(info, indent=2, default=str))
            return 0
        if args.command == "evaluate":
            return _evaluate(args)
        if args.command == "predict":
            return _predict(args)
    except errors as error:
        print(f"bnn: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except (KeyboardInterrupt, Interrupted) as error:
        print(f"bnn: {error or 'interrupted'}", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
