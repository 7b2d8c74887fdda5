"""The packed model file (``.bnn``): export from Keras, load, verify, evaluate.

Layout (all integers little-endian; see docs/export.md)::

    magic      8 bytes   b"BNNPACK\\0"
    version    uint32    FORMAT_VERSION
    length     uint64    byte length of the manifest
    manifest   JSON      UTF-8: input shape, stages, and where each array lies in the blobs
    blobs      bytes     the arrays, back to back, little-endian, C order
    checksum   32 bytes  SHA-256 of every byte before it

A file that is truncated, altered, of another version or not a packed model raises
:class:`ExportError`; it never loads into a model that predicts something else.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from bnn import kernels, quantizers
from bnn.errors import ExportError
from bnn.layers import BinaryConv2D, BinaryDense
from bnn.rundir import atomic_write
from bnn.packing import PackedModel, fold_sign_threshold, pack_bits

__all__ = ["ExportError", "FORMAT_VERSION", "READABLE_VERSIONS", "MAGIC", "export_model",
           "load_packed", "load_any", "predict", "evaluate"]

FORMAT_VERSION = 3
#: Versions this bnn reads: version 1 files are version 2 files without an input encoding, and
#: version 2 files are version 3 files without a real-valued first layer.
READABLE_VERSIONS = (1, 2, 3)
MAGIC = b"BNNPACK\x00"
_HEADER = struct.Struct("<8sIQ")
_DIGEST = 32
_DTYPES = ("int64", "int32", "float32")
_SUPPORTED = ("BinaryDense, BinaryConv2D (precision='binary', kernel_quantizer='ste_sign', "
              "input_quantizer='ste_sign'; on the first layer input_quantizer=None, and "
              "kernel_quantizer=None too for a real-valued first layer), MaxPooling2D, "
              "BatchNormalization, Flatten, Dropout, a final softmax Activation")


def _fail(where: Any, problem: str, fix: str) -> ExportError:
    return ExportError(f"{where}: {problem}; {fix}")


# ---- Keras model -> stages -------------------------------------------------------------------

def _check_binary_layer(layer, first: bool, where: str) -> bool:
    """Validates a binary layer; returns True when its inputs are binarized (ste_sign)."""
    name = f"{where}: layer {layer.name!r}"
    if layer.precision != "binary":
        raise _fail(name, "has precision='float' (a float twin)",
                    "export the binary model (RUN_DIR/binary/model.keras)")
    binarized = isinstance(layer.input_quantizer, quantizers.SteSign)
    if layer.kernel_quantizer is None and first and not binarized:
        pass  # a real-valued first layer: its float32 kernel is stored as is
    elif not isinstance(layer.kernel_quantizer, quantizers.SteSign):
        raise _fail(name, f"kernel_quantizer {layer.kernel_quantizer!r} is not supported",
                    f"supported: {_SUPPORTED}")
    if layer.scale_kernel:
        raise _fail(name, "uses scale_kernel=True", "export supports unscaled ±1 kernels only")
    if layer.get_config().get("activation") not in (None, "linear"):
        raise _fail(name, f"has activation {layer.get_config()['activation']!r}",
                    "binary layers must be linear (batch norm and sign follow)")
    if not binarized and not (first and layer.input_quantizer is None):
        raise _fail(name, f"input_quantizer {layer.input_quantizer!r} is not supported here",
                    f"supported: {_SUPPORTED}")
    if isinstance(layer, BinaryConv2D):
        if layer.data_format != "channels_last" or tuple(layer.dilation_rate) != (1, 1) \
                or layer.groups != 1:
            raise _fail(name, "uses channels_first, dilation or groups",
                        "export supports channels_last, dilation 1, groups 1")
        if layer.padding == "same" and layer.pad_values not in (1.0, 0.0, -1.0):
            raise _fail(name, f"pads with {layer.pad_values}",
                        "export supports pad_values 1.0, 0.0 (Keras zeros) or -1.0")
    return binarized


def _norm_arrays(bn) -> tuple[dict[str, np.ndarray], float]:
    arrays = {"bn_mean": bn.moving_mean.numpy(), "bn_variance": bn.moving_variance.numpy()}
    if bn.scale:
        arrays["bn_gamma"] = bn.gamma.numpy()
    if bn.center:
        arrays["bn_beta"] = bn.beta.numpy()
    return {k: np.asarray(v, np.float32) for k, v in arrays.items()}, float(bn.epsilon)


def _threshold_arrays(bn, bias, fan_in: int, where: str) -> dict[str, np.ndarray]:
    """Integer thresholds reproducing ``sign(BN(a + bias))`` of the source for every integer
    pre-activation ``a`` in ``[-fan_in, fan_in]``, evaluated with the same float32 ops."""
    values = np.arange(-fan_in, fan_in + 1)
    pre = np.broadcast_to(values.astype(np.float32)[:, None],
                          (len(values), bn.moving_mean.shape[0]))
    pre = tf.constant(pre)
    if bias is not None:
        pre = pre + bias
    norm, eps = _norm_arrays(bn)
    y = tf.nn.batch_normalization(pre, norm["bn_mean"], norm["bn_variance"], norm.get("bn_beta"),
                                  norm.get("bn_gamma"), eps)
    try:
        threshold, flip = fold_sign_threshold(values, (y >= 0).numpy())
    except ValueError as error:
        raise _fail(f"{where}: layer {bn.name!r}", str(error), "check its parameters") from None
    return {"threshold": threshold, "flip": pack_bits(np.where(flip, 1.0, -1.0))}


def _integer_threshold_arrays(bn, bias, kernel: np.ndarray,
                              encoding: dict[str, float]) -> dict[str, np.ndarray]:
    """Integer thresholds on ``z = u . w`` (uint8 pixels ``u``, ±1 kernel ``w`` (n, units))
    reproducing ``sign(BN(x . w + bias))`` for ``x = scale * u + offset``.

    The pre-activation is ``float32(scale * z + offset * sum(w))`` (float64, rounded once),
    plus ``bias``, then the source's float32 batch norm. Every step is monotone in ``z``, so per
    channel a bisection over ``[-255 n, 255 n]`` finds the first ``z`` whose sign differs from
    the sign at ``-255 n``: ``bit = (z >= threshold) XOR flip`` with ``flip`` that first sign.
    """
    n, units = kernel.shape
    col_sum = kernel.astype(np.float64).sum(axis=0)
    norm, eps = _norm_arrays(bn)

    def positive(z: np.ndarray) -> np.ndarray:
        pre = (encoding["scale"] * z + encoding["offset"] * col_sum).astype(np.float32)
        if bias is not None:
            pre = pre + bias
        y = tf.nn.batch_normalization(pre[None], norm["bn_mean"], norm["bn_variance"],
                                      norm.get("bn_beta"), norm.get("bn_gamma"), eps)
        return (y >= 0).numpy()[0]

    low, high = np.full(units, -255 * n, np.int64), np.full(units, 255 * n + 1, np.int64)
    flip = positive(low)
    while (high - low > 1).any():  # positive(low) == flip; positive(high) != flip or past the end
        mid = (low + high) // 2
        changed = positive(mid) != flip
        low, high = np.where(changed, low, mid), np.where(changed, mid, high)
    return {"threshold": high.astype(np.int32), "flip": pack_bits(np.where(flip, 1.0, -1.0))}


def _check_encoding(encoding, layer, binarized: bool, where: str) -> dict[str, float]:
    name = f"{where}: input_encoding"
    try:
        scale, offset = (float(v) for v in encoding)
    except (TypeError, ValueError):
        raise _fail(name, f"{encoding!r} is not a (scale, offset) pair",
                    "give e.g. (1 / 127.5, -1.0) for inputs u / 127.5 - 1") from None
    if not (np.isfinite(scale) and np.isfinite(offset) and scale > 0):
        raise _fail(name, f"scale {scale} must be positive and finite, offset {offset} finite",
                    "give the constants of x = scale * u + offset")
    if not isinstance(layer, BinaryDense) or binarized:
        raise _fail(name, f"first layer {layer.name!r} is not a BinaryDense with real inputs",
                    "export without input_encoding")
    if 255 * int(layer.kernel.shape[0]) >= 2**24:
        raise _fail(name, f"first layer {layer.name!r} has {layer.kernel.shape[0]} inputs, too "
                    "many for exact float32 sums of pixels", "export without input_encoding")
    return {"scale": scale, "offset": offset}


def _model_stages(model: keras.Model, where: str, input_encoding=None):
    if not isinstance(model, keras.Sequential):
        raise _fail(where, f"model {model.name!r} is not a keras.Sequential chain",
                    f"export supports Sequential models built from {_SUPPORTED}")
    layers = [layer for layer in model.layers
              if not isinstance(layer, (keras.layers.InputLayer, keras.layers.Dropout))]
    if layers and isinstance(layers[-1], keras.layers.Activation) and getattr(
            layers[-1].activation, "__name__", None) == "softmax":
        layers = layers[:-1]  # the packed model returns logits: the same predicted classes
    input_shape = tuple(int(d) for d in model.inputs[0].shape[1:])
    shape, flat, packed, model_encoding = input_shape, len(input_shape) == 1, False, None
    stages, arrays, i = [], [], 0
    while i < len(layers):
        layer = layers[i]
        if isinstance(layer, keras.layers.Flatten):
            flat, i = True, i + 1
            continue
        if not isinstance(layer, (BinaryDense, BinaryConv2D)):
            raise _fail(f"{where}: layer {layer.name!r}",
                        f"{type(layer).__name__} is not supported", f"supported: {_SUPPORTED}")
        binarized = _check_binary_layer(layer, not stages, where)
        real_kernel = layer.kernel_quantizer is None
        kernel = np.asarray((layer.kernel if real_kernel else layer.binary_kernel()).numpy(),
                            np.float32)
        units = int(kernel.shape[-1])
        spec: dict[str, Any] = {"layer": layer.name, "input": "packed" if packed else "real",
                                "input_shape": list(shape), "units": units, "pool": None}
        if real_kernel:
            spec["real_kernel"] = True
        encoding = None
        if input_encoding is not None and not stages:
            if real_kernel:
                raise _fail(f"{where}: input_encoding", f"first layer {layer.name!r} has a "
                            "real-valued kernel, so its products are not integers",
                            "export without input_encoding")
            encoding = model_encoding = _check_encoding(input_encoding, layer, binarized, where)
            spec["input"] = "uint8"
            signs = kernel.reshape(-1, units)
        if binarized and not packed:
            spec["binarize_input"] = True
        if isinstance(layer, BinaryDense):
            if not flat:
                raise _fail(f"{where}: layer {layer.name!r}", f"sees unflattened input {shape}",
                            "put a Flatten layer before it")
            spec["op"] = "dense"
            fan_in = int(np.prod(shape))
            if real_kernel:
                pass
            elif packed:  # pack along the channel axis of the flattened (..., C) input
                kernel = pack_bits(kernel.reshape(-1, shape[-1], units), axis=1).reshape(-1, units)
            else:
                kernel = pack_bits(kernel, axis=0)
        else:
            if flat:
                raise _fail(f"{where}: layer {layer.name!r}", "sees flattened input",
                            "convolutions must come before Flatten")
            spec.update(op="conv2d", kernel_size=list(layer.kernel_size),
                        strides=list(layer.strides), padding=layer.padding,
                        pad_value=layer.pad_values)
            fan_in = int(np.prod(kernel.shape[:3]))
            if not real_kernel:
                kernel = pack_bits(kernel, axis=2)
            if packed:
                kernel = kernel.reshape(-1, units)
        stage_arrays = {"kernel": kernel}
        bias = None
        if layer.use_bias:
            bias = np.asarray(layer.bias.numpy(), np.float32)
            if encoding is None:  # an integer first stage folds its bias into the threshold
                stage_arrays["bias"] = bias
        out_shape = (units,) if spec["op"] == "dense" else tuple(
            int(d) for d in layer.compute_output_shape((1, *shape))[1:])
        i += 1
        if i < len(layers) and isinstance(layers[i], keras.layers.MaxPooling2D):
            pool = layers[i]
            if tuple(pool.pool_size) != tuple(pool.strides) or pool.padding != "valid" \
                    or pool.data_format != "channels_last":
                raise _fail(f"{where}: layer {pool.name!r}", "is not a non-overlapping 'valid' "
                            "channels_last pooling", "use MaxPooling2D(k) with strides = k")
            spec["pool"] = list(pool.pool_size)
            out_shape = (out_shape[0] // pool.pool_size[0], out_shape[1] // pool.pool_size[1],
                         out_shape[2])
            i += 1
        if i >= len(layers) or not isinstance(layers[i], keras.layers.BatchNormalization):
            raise _fail(f"{where}: layer {layer.name!r}", "is not followed by BatchNormalization",
                        "export supports Binary layer -> [MaxPooling2D] -> BatchNormalization")
        bn = layers[i]
        if bn.axis not in (-1, len(out_shape)):
            raise _fail(f"{where}: layer {bn.name!r}", f"normalizes axis {bn.axis}",
                        "export supports batch norm over the last (channel) axis")
        i += 1
        spec["output"] = "logits" if i == len(layers) else "bits"
        if encoding is not None:
            if spec["output"] == "logits":
                raise _fail(f"{where}: input_encoding", "the model has a single binary layer",
                            "export without input_encoding")
            stage_arrays.update(_integer_threshold_arrays(bn, bias, signs, encoding))
        elif spec["output"] == "bits" and packed:
            stage_arrays.update(_threshold_arrays(bn, bias, fan_in, where))
        else:
            norm, spec["bn_epsilon"] = _norm_arrays(bn)
            stage_arrays.update(norm)
        stages.append(spec)
        arrays.append(stage_arrays)
        shape, packed = out_shape, True
    if not stages:
        raise _fail(where, "the model has no binary layers", f"supported: {_SUPPORTED}")
    return input_shape, stages, arrays, model_encoding


# ---- file format -----------------------------------------------------------------------------

def _serialize(manifest: dict[str, Any], arrays: list[dict[str, np.ndarray]]) -> bytes:
    blobs, entries, offset = [], [], 0
    for index, stage_arrays in enumerate(arrays):
        for name, array in stage_arrays.items():
            array = np.ascontiguousarray(array)
            data = array.astype(array.dtype.newbyteorder("<")).tobytes()
            entries.append({"stage": index, "name": name, "dtype": array.dtype.name,
                            "shape": list(array.shape), "offset": offset, "nbytes": len(data)})
            blobs.append(data)
            offset += len(data)
    manifest = {**manifest, "arrays": entries, "blob_bytes": offset}
    text = json.dumps(manifest, sort_keys=True).encode("utf-8")
    body = _HEADER.pack(MAGIC, FORMAT_VERSION, len(text)) + text + b"".join(blobs)
    return body + hashlib.sha256(body).digest()


def _deserialize(data: bytes, where: str):
    if len(data) < _HEADER.size + _DIGEST:
        raise _fail(where, f"file is only {len(data)} bytes (truncated)", "re-export the model")
    magic, version, length = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise _fail(where, "not a bnn packed model (bad magic bytes)",
                    "give a file written by bnn export")
    if version not in READABLE_VERSIONS:
        newer = version > FORMAT_VERSION
        raise _fail(where, f"format version {version}, this bnn reads versions "
                    f"{', '.join(map(str, READABLE_VERSIONS))}",
                    "upgrade bnn to read it" if newer else
                    "re-export the model with this version of bnn")
    if hashlib.sha256(data[:-_DIGEST]).digest() != data[-_DIGEST:]:
        raise _fail(where, "checksum mismatch (the file is truncated or corrupted)",
                    "re-export or re-copy the model")
    start = _HEADER.size + length
    try:
        manifest = json.loads(data[_HEADER.size:start].decode("utf-8"))
        blobs = data[start:-_DIGEST]
        if len(blobs) != manifest["blob_bytes"]:
            raise ValueError(f"{len(blobs)} blob bytes, manifest says {manifest['blob_bytes']}")
        arrays: list[dict[str, np.ndarray]] = [{} for _ in manifest["stages"]]
        for entry in manifest["arrays"]:
            if entry["dtype"] not in _DTYPES:
                raise ValueError(f"array dtype {entry['dtype']!r}")
            dtype = np.dtype(entry["dtype"]).newbyteorder("<")
            count = int(np.prod(entry["shape"], dtype=np.int64))
            if count * dtype.itemsize != entry["nbytes"] or \
                    entry["offset"] + entry["nbytes"] > len(blobs):
                raise ValueError(f"array {entry['name']!r} of stage {entry['stage']} does not "
                                 "fit its declared size")
            array = np.frombuffer(blobs, dtype, count, entry["offset"]).reshape(entry["shape"])
            arrays[entry["stage"]][entry["name"]] = array.astype(dtype.newbyteorder("="))
    except (ValueError, KeyError, TypeError, IndexError, UnicodeDecodeError) as error:
        raise _fail(where, f"malformed manifest ({error})", "re-export the model") from None
    return manifest, arrays


# ---- public API ------------------------------------------------------------------------------

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
            offset`` for uint8 pixels ``u`` (MNIST in bnn.data: ``(1 / 127.5, -1.0)``). The
            first layer (a ``BinaryDense`` with real inputs) then runs on exact integer
            products ``u . w``, its batch norm and sign folded into integer thresholds, and
            the packed model accepts uint8 pixels (or inputs normalized the same way).

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
    input_shape, stages, arrays, encoding = _model_stages(model, where, input_encoding)
    manifest = {"format": "bnn-packed", "model": model.name, "input_shape": list(input_shape),
                "word_bits": 64, "stages": stages, "input_encoding": encoding}
    data = _serialize(manifest, arrays)
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
    :class:`~bnn.packing.PackedModel`; ``native`` as there (``None``: the native kernels of
    :mod:`bnn.kernels` where they are available and apply).

    Raises:
        ExportError: for an unreadable, truncated, corrupted or foreign file, or a
            ``BNN_NATIVE_KERNELS`` value :func:`bnn.kernels.setting` cannot read.
        NativeKernelsUnavailable: for ``native=True`` where the native kernels cannot run it.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise _fail(path, f"cannot read ({error.strerror})", "check the path") from None
    manifest, arrays = _deserialize(data, str(path))
    kernels.setting()  # an unreadable BNN_NATIVE_KERNELS is a SettingError here
    try:
        return PackedModel(manifest["stages"], arrays, manifest["input_shape"],
                           manifest.get("input_encoding"), native=native)
    except (ValueError, KeyError, TypeError) as error:
        raise _fail(path, f"inconsistent stages ({error})", "re-export the model") from None


def load_any(path: str | Path):
    """A ``.bnn`` file -> :class:`~bnn.packing.PackedModel`; a ``.keras`` file -> the Keras
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

    The setting (batch size and batches in flight, :mod:`bnn.throughput`) is calibrated on the
    first examples unless both ``batch_size`` and ``workers`` are given. With ``compare`` (a
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
    from bnn import throughput

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
