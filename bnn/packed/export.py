"""Packed models for users: export a trained Keras model to a ``.bnn`` file, load one, and
predict or evaluate with either kind of model file at its fastest setting."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import keras
import numpy as np

from bnn.errors import ExportError
from bnn.files import atomic_write
from bnn.native import dispatch
from bnn.packed import throughput
from bnn.packed.format import FORMAT_VERSION, deserialize, serialize
from bnn.packed.model import PackedModel
from bnn.packed.stages import model_stages

__all__ = ["ExportError", "export_model", "load_packed", "load_any", "predict", "evaluate"]

_fail = ExportError.at  # "<where>: <problem>; <fix>"


def _load_keras(path: Path) -> keras.Model:
    try:
        return keras.saving.load_model(str(path), compile=False)
    except Exception as error:  # Keras raises many types for bad files
        raise _fail(path, f"cannot load the Keras model ({type(error).__name__}: "
                    f"{str(error).splitlines()[0] if str(error) else ''})",
                    "give a .keras file saved by bnn") from None


def export_model(source: str | Path | keras.Model, output: str | Path,
                 input_encoding: tuple[float, float] | None = None) -> dict[str, Any]:
    """Exports a binary Keras model to a packed ``.bnn`` file.

    Args:
        source: a ``.keras`` file, a run directory (``RUN_DIR/binary/model.keras`` is used), or
            a ``keras.Model``.
        output: the ``.bnn`` file to write.
        input_encoding: ``(scale, offset)`` when the model's inputs are ``x = scale * u +
            offset`` for uint8 pixels ``u`` (MNIST in :mod:`bnn.train.data`: ``(1 / 127.5,
            -1.0)``). The first layer (a ``BinaryDense`` with real inputs) then runs on exact
            integer products ``u . w``, its batch norm and sign folded into integer thresholds,
            and the packed model accepts uint8 pixels (or inputs normalized the same way).

    Returns:
        A summary: ``output``, ``bytes`` (file size), ``float32_bytes`` (4 bytes per parameter
        of the source), ``compression`` (their ratio), ``format_version``, ``input_encoding``,
        ``uint8_input_possible`` (no encoding was given, and the first layer could take one)
        and ``stages`` (per stage: layer, op, input and output kind).

    Raises:
        ExportError: for a missing source, or a layer or quantizer export does not support.
    """
    if isinstance(source, keras.Model):
        model, where = source, f"model {source.name!r}"
    else:
        path = Path(source)
        if path.is_dir():
            path = path / "binary" / "model.keras"
        if not path.is_file():
            raise _fail(path, "no such file", "give a .keras file or a run directory")
        model, where = _load_keras(path), str(path)
    input_shape, stages, arrays, encoding = model_stages(model, where, input_encoding)
    manifest = {"format": "bnn-packed", "model": model.name, "input_shape": list(input_shape),
                "word_bits": 64, "stages": stages, "input_encoding": encoding}
    data = serialize(manifest, arrays)
    output = Path(output)
    try:
        atomic_write(output, data)
    except OSError as error:
        raise _fail(output, f"cannot write ({error.strerror})", "check the directory") from None
    float_bytes = 4 * int(model.count_params())
    first = stages[0] if stages else {}
    return {"output": str(output), "bytes": len(data), "float32_bytes": float_bytes,
            "compression": float_bytes / len(data), "format_version": FORMAT_VERSION,
            "input_encoding": encoding,
            "uint8_input_possible": encoding is None and first.get("op") == "dense"
            and first.get("input") == "real" and not first.get("real_kernel")
            and not first.get("binarize_input"),
            "stages": [{"layer": s["layer"], "op": s["op"], "input": s["input"],
                        "output": s["output"], "pool": s["pool"]} for s in stages]}


def load_packed(path: str | Path, native: bool | None = None) -> PackedModel:
    """Reads and verifies a ``.bnn`` file (magic, version, checksum, sizes) into a
    :class:`~bnn.packed.model.PackedModel`; ``native`` as there (``None``: the native kernels of
    :mod:`bnn.native` where they are available and apply).

    Raises:
        ExportError: for an unreadable, truncated, corrupted or foreign file, or a
            ``BNN_NATIVE_KERNELS`` value :func:`bnn.native.dispatch.setting` cannot read.
        NativeKernelsUnavailable: for ``native=True`` where the native kernels cannot run it.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise _fail(path, f"cannot read ({error.strerror})", "check the path") from None
    manifest, arrays = deserialize(data, str(path))
    dispatch.setting()  # an unreadable BNN_NATIVE_KERNELS is a SettingError here
    try:
        return PackedModel(manifest["stages"], arrays, manifest["input_shape"],
                           manifest.get("input_encoding"), native=native)
    except (ValueError, KeyError, TypeError) as error:
        raise _fail(path, f"inconsistent stages ({error})", "re-export the model") from None


def load_any(path: str | Path):
    """A ``.bnn`` file -> :class:`~bnn.packed.model.PackedModel`; a ``.keras`` file -> the Keras
    model. Both have ``.predict(x)`` returning logits."""
    path = Path(path)
    if path.suffix == ".bnn":
        return load_packed(path)
    if path.suffix == ".keras":
        if not path.is_file():
            raise _fail(path, "no such file", "check the path")
        return _load_keras(path)
    raise _fail(path, f"unknown model file type {path.suffix!r}", "give a .bnn or .keras file")


def predict(path: str | Path, x: np.ndarray, batch_size: int | None = None,
            workers: int | None = None, compare: str | Path | None = None,
            rounds: int | None = None) -> dict[str, Any]:
    """Logits of the model file ``path`` for ``x``, timed in its fastest setting.

    The setting (batch size and batches in flight, :mod:`bnn.packed.throughput`) is calibrated
    on the first examples unless both ``batch_size`` and ``workers`` are given. With ``compare`` (a
    ``.keras`` or ``.bnn`` file), that model is calibrated the same way on the same ``x`` and
    the two models' full passes take turns, ``rounds`` each (default 3; 1 without
    ``compare``).

    Returns:
        ``model`` (the path), ``logits``, ``examples``, ``seconds`` (median full pass, wall
        clock), ``examples_per_second``, ``batch_size``, ``workers``, ``xla`` (a Keras model's
        call compiled by XLA; always false for a packed model, which picks its own kernels);
        with ``compare`` also
        ``compare`` (the same fields for that model) and ``speedup``: the median over rounds of
        (the compared model's pass) / (this model's pass).

    Raises:
        ExportError: for a model file that cannot be loaded, or inputs it does not accept.
    """
    x = np.asarray(x)
    models = {"model": (path, load_any(path))}
    if compare is not None:
        models["compare"] = (compare, load_any(compare))
    runners = {}
    for key, (where, model) in models.items():
        expected = tuple(model.input_shape if isinstance(model, PackedModel)
                         else model.inputs[0].shape[1:])
        if tuple(x.shape[1:]) != expected:
            raise _fail(where, f"takes inputs of shape {expected} per example, the data has "
                        f"{tuple(x.shape[1:])}", "give a model of this dataset")
        try:
            runners[key] = throughput.runner(model, x)
        except ValueError as error:
            raise _fail(where, str(error), "check the dataset and its normalization") from None
    settings = throughput.calibrate(runners, batch_size, workers)
    rounds = rounds or (3 if compare is not None else 1)
    timed = throughput.measure(runners, settings, rounds)
    result = {"model": str(path), **{k: v for k, v in timed["model"].items()
                                     if k != "round_seconds"}}
    if compare is not None:
        result["compare"] = {"model": str(compare), **{
            k: v for k, v in timed["compare"].items() if k != "round_seconds"}}
        result["speedup"] = float(np.median(np.array(timed["compare"]["round_seconds"])
                                            / np.array(timed["model"]["round_seconds"])))
    return result


def evaluate(path: str | Path, x: np.ndarray, y: np.ndarray, batch_size: int | None = None,
             workers: int | None = None, compare: str | Path | None = None,
             rounds: int | None = None) -> dict[str, Any]:
    """Accuracy and throughput of the model file ``path`` on ``(x, y)``, as :func:`predict`
    times it (the fastest setting, calibrated unless ``batch_size`` and ``workers`` are given).

    Returns:
        ``model``, ``accuracy`` (fraction of argmax logits equal to ``y``), ``examples``,
        ``seconds``, ``examples_per_second``, ``batch_size``, ``workers``, ``xla``; with
        ``compare`` also
        ``compare`` (the same for that model) and ``speedup`` (see :func:`predict`).
    """
    labels = np.asarray(y).reshape(-1)

    def scored(figures: dict[str, Any]) -> dict[str, Any]:
        logits = figures.pop("logits")
        accuracy = float(np.mean(np.argmax(logits, axis=-1) == labels))
        return {"model": figures.pop("model"), "accuracy": accuracy, **figures}

    result = scored(predict(path, x, batch_size, workers, compare, rounds))
    if compare is not None:
        result["compare"] = scored(result["compare"])
    return result
