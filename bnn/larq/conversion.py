"""Models saved by Larq -> Keras 3 bnn models with the same weights and outputs.

Larq saves through tf-keras, in one of three formats, all read here without tf-keras:

* **HDF5** (``model.save("m.h5")``): the model config in the file's ``model_config`` attribute,
  weights under ``model_weights/<layer>/<layer>/<variable>:0``;
* **tf-keras .keras** (``model.save("m.keras")``, tf-keras 2.13+): a zip of ``config.json`` and
  ``model.weights.h5``, weights under ``layers/<snake-cased class name>[_N]/vars/<i>``;
* **SavedModel** (``model.save("dir", save_format="tf")``, a directory): the config in
  ``keras_metadata.pb``, weights in the ``variables/`` checkpoint under
  ``layer_with_weights-<K>/<variable>``.

Every layer is mapped to its bnn or Keras 3 counterpart: ``QuantDense``, ``QuantConv2D``,
``QuantDepthwiseConv2D`` and ``QuantSeparableConv2D`` to :class:`~bnn.layers.BinaryDense`,
:class:`~bnn.layers.BinaryConv2D`, :class:`~bnn.layers.BinaryDepthwiseConv2D` and
:class:`~bnn.layers.BinarySeparableConv2D` (``precision="binary"``, the same quantizers from
:mod:`bnn.quantizers`, ``weight_clip`` as :class:`~bnn.layers.WeightClip`), batch
normalization and max pooling to bnn's drop-ins (same values, faster), other Keras layers to
their Keras 3 classes. The result uses only bnn and Keras classes, so it loads with
``keras.saving.load_model`` after ``import bnn``. Optimizer state is not carried over: compile
the converted model anew.

Anything that cannot be converted raises :class:`ConversionError` with one line naming the
file, the layer and what to do.
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from pathlib import Path
from typing import Any

import h5py
import keras
import numpy as np

from bnn import layers as bl
from bnn import quantizers as bq
from bnn.errors import ConversionError
from bnn.layers import constraints as bc
from bnn.layers import normalization, pooling
from bnn.larq import constraints as larq_constraints
from bnn.larq import layers as larq_layers
from bnn.larq import quantizers as larq_quantizers

__all__ = ["ConversionError", "convert", "convert_file", "FORMATS"]

_fail = ConversionError.at  # "<where>: <problem>; <fix>"

FORMATS = ("a tf-keras HDF5 file (.h5)", "a tf-keras .keras file",
           "a SavedModel directory saved by tf-keras")
_RESAVE = ("in the Larq environment, load the model and save it again with "
           "model.save('model.h5')")
_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"

#: Larq layers -> bnn layers, and the quantizer arguments each one has.
_LARQ_LAYERS = {
    "QuantDense": (bl.BinaryDense, ("input_quantizer", "kernel_quantizer")),
    "QuantConv2D": (bl.BinaryConv2D, ("input_quantizer", "kernel_quantizer")),
    "QuantDepthwiseConv2D": (bl.BinaryDepthwiseConv2D, ("input_quantizer", "depthwise_quantizer")),
    "QuantSeparableConv2D": (bl.BinarySeparableConv2D, ("input_quantizer", "depthwise_quantizer",
                                                        "pointwise_quantizer")),
}
#: Keras layers converted from their tf-keras config; batch norm and max pooling become bnn's
#: drop-ins (same values and gradients, faster in bnn's training).
_KERAS_LAYERS = {
    "BatchNormalization": normalization.BatchNormalization,
    "MaxPooling2D": pooling.MaxPooling2D,
    **{name: getattr(keras.layers, name) for name in (
        "Dense", "Conv2D", "DepthwiseConv2D", "SeparableConv2D", "AveragePooling2D",
        "GlobalAveragePooling2D", "GlobalMaxPooling2D", "Flatten", "Activation", "Dropout",
        "SpatialDropout2D", "Reshape", "Permute", "Add", "Subtract", "Multiply", "Average",
        "Maximum", "Minimum", "Concatenate", "ReLU", "LeakyReLU", "PReLU", "Softmax",
        "ZeroPadding2D", "UpSampling2D", "Rescaling", "Identity")},
}
#: tf-keras variable names of Keras 3 variables, where they differ.
_SOURCE_NAMES = {(bl.BinaryDepthwiseConv2D, "kernel"): "depthwise_kernel",
                 (keras.layers.DepthwiseConv2D, "kernel"): "depthwise_kernel"}


# ---------------------------------------------------------------------------------------------
# Reading the three formats: (model config, weights per layer name)
# ---------------------------------------------------------------------------------------------


def _tuples(item: dict) -> Any:
    """tf-keras writes tuples and shapes in SavedModel metadata as
    ``{"class_name": "__tuple__", "items": [...]}``; they are lists here."""
    if item.get("class_name") in ("__tuple__", "TensorShape") and "items" in item:
        return list(item["items"])
    return item


def _json(data: Any, where: Any) -> dict:
    try:
        return json.loads(data.decode() if isinstance(data, bytes) else data,
                          object_hook=_tuples)
    except (ValueError, UnicodeDecodeError) as error:
        raise _fail(where, f"the model config is not valid JSON ({error})", _RESAVE) from None


def _read_hdf5(path: Path) -> tuple[dict, dict[str, dict[str, np.ndarray]]]:
    with h5py.File(path, "r") as f:
        if "model_config" not in f.attrs:
            raise _fail(path, "holds weights only (saved with save_weights), not a model",
                        "in the Larq environment, build the model, load these weights and save "
                        "it with model.save('model.h5')")
        version = f.attrs.get("keras_version", b"2")
        version = version.decode() if isinstance(version, bytes) else str(version)
        if version.split(".")[0] == "3":
            raise _fail(path, f"is a Keras 3 model (Keras {version}), not one saved by Larq",
                        "load it with keras.saving.load_model after import bnn")
        config = _json(f.attrs["model_config"], path)
        group = f["model_weights"] if "model_weights" in f else f
        weights = {}
        for layer in group.attrs.get("layer_names", []):
            layer = layer.decode() if isinstance(layer, bytes) else str(layer)
            names = [n.decode() if isinstance(n, bytes) else str(n)
                     for n in group[layer].attrs.get("weight_names", [])]
            weights[layer] = {_variable_name(n): np.asarray(group[layer][n]) for n in names}
    return config, weights


def _variable_name(weight_name: str) -> str:
    """``"quant_dense/kernel:0"`` -> ``"kernel"``."""
    return weight_name.rsplit("/", 1)[-1].split(":", 1)[0]


def _snake_case(name: str) -> str:
    """Keras' class-name-to-path rule: ``QuantConv2D`` -> ``quant_conv2d``."""
    name = re.sub("(.)([A-Z][a-z0-9]+)", r"\1_\2", name)
    name = re.sub("([a-z])([A-Z])", r"\1_\2", name).lower()
    return name if not name.startswith("_") else "private" + name


def _read_keras_zip(path: Path) -> tuple[dict, dict[str, dict[int, np.ndarray]]]:
    with zipfile.ZipFile(path) as archive:
        members = set(archive.namelist())
        if not {"config.json", "model.weights.h5"} <= members:
            raise _fail(path, "is a zip file without config.json and model.weights.h5, not a "
                        "saved Keras model", _RESAVE)
        metadata = _json(archive.read("metadata.json"), path) if "metadata.json" in members \
            else {}
        if str(metadata.get("keras_version", "2")).split(".")[0] == "3":
            raise _fail(path, f"is already a Keras 3 model (Keras {metadata['keras_version']})",
                        "load it with keras.saving.load_model after import bnn")
        config = _json(archive.read("config.json"), path)
        weights_file = h5py.File(io.BytesIO(archive.read("model.weights.h5")), "r")
    with weights_file:
        stored = weights_file.get("layers", {})
        weights = {}
        counts: dict[str, int] = {}
        for entry in _layer_entries(config, path):
            if entry["class_name"] == "InputLayer":
                continue
            key = _snake_case(entry["class_name"])
            counts[key] = counts.get(key, -1) + 1
            key = key if counts[key] == 0 else f"{key}_{counts[key]}"
            variables = stored[key]["vars"] if key in stored and "vars" in stored[key] else {}
            weights[entry["config"]["name"]] = {int(i): np.asarray(variables[i])
                                                for i in variables}
            _check_quantizer_variables(stored.get(key), entry, path)
    return config, weights


def _check_quantizer_variables(group, entry: dict, path: Path) -> None:
    """Quantizers with variables of their own (trainable quantizer layers) have no bnn
    counterpart."""
    if group is None:
        return
    for name, item in group.items():
        if name != "vars" and isinstance(item, h5py.Group) and len(item.get("vars", {})):
            raise _fail(path, f"layer {entry['config']['name']!r}: its {name} has weights of its "
                        "own", "bnn converts Larq's built-in quantizers only")


def _protobuf_fields(data: bytes):
    """(field number, value) pairs of a serialized protocol buffer message: varints as ints,
    length-delimited fields as bytes (enough to read ``keras_metadata.pb``)."""
    def varint(i: int) -> tuple[int, int]:
        value = shift = 0
        while True:
            byte = data[i]
            i += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value, i

    i = 0
    while i < len(data):
        key, i = varint(i)
        field, kind = key >> 3, key & 7
        if kind == 0:
            value, i = varint(i)
        elif kind == 2:
            size, i = varint(i)
            value, i = data[i:i + size], i + size
        elif kind in (1, 5):
            size = 8 if kind == 1 else 4
            value, i = data[i:i + size], i + size
        else:
            raise ValueError(f"unsupported protobuf wire type {kind}")
        yield field, value


def _read_savedmodel(path: Path) -> tuple[dict, dict[str, dict[str, np.ndarray]]]:
    metadata_path = path / "keras_metadata.pb"
    if not metadata_path.is_file():
        raise _fail(path, "is a SavedModel without keras_metadata.pb (not saved by tf-keras), so "
                    "it has no Keras model config", _RESAVE)
    # keras_metadata.pb: SavedMetadata { repeated SavedObject nodes = 1 }, each node with
    # node_path = 3 ("root", "root.layer_with_weights-0", ...) and metadata = 5 (JSON).
    nodes = {}
    try:
        for field, node in _protobuf_fields(metadata_path.read_bytes()):
            if field == 1:
                values = dict(_protobuf_fields(node))
                nodes[values.get(3, b"").decode()] = values.get(5, b"")
    except (ValueError, IndexError, UnicodeDecodeError) as error:
        raise _fail(metadata_path, f"cannot be read ({error})", _RESAVE) from None
    if "root" not in nodes:
        raise _fail(metadata_path, "has no root model", _RESAVE)
    config = _json(nodes["root"], metadata_path)
    import tensorflow as tf

    try:
        reader = tf.train.load_checkpoint(str(path / "variables" / "variables"))
    except (tf.errors.OpError, ValueError) as error:
        raise _fail(path / "variables", f"cannot be read ({type(error).__name__})",
                    _RESAVE) from None
    weights: dict[str, dict[str, np.ndarray]] = {}
    suffix = "/.ATTRIBUTES/VARIABLE_VALUE"
    for node_path, node_metadata in nodes.items():
        parts = node_path.split(".")
        if len(parts) != 2 or not parts[1].startswith("layer_with_weights-"):
            continue
        name = _json(node_metadata, metadata_path).get("name")
        prefix = parts[1] + "/"
        weights[name] = {key[len(prefix):-len(suffix)]: reader.get_tensor(key)
                         for key in reader.get_variable_to_shape_map()
                         if key.startswith(prefix) and key.endswith(suffix)
                         and key.count("/") == 3}
    return {"class_name": config.get("class_name"), "config": config.get("config")}, weights


def _read(path: Path) -> tuple[dict, dict, str]:
    """(model config, weights per layer name, format name) of a file saved by Larq."""
    if path.is_dir():
        if not (path / "saved_model.pb").is_file():
            raise _fail(path, "is a directory but not a SavedModel (no saved_model.pb)",
                        f"give {', '.join(FORMATS)}")
        return (*_read_savedmodel(path), "savedmodel")
    if not path.is_file():
        raise _fail(path, "no such file or directory", f"give {', '.join(FORMATS)}")
    with open(path, "rb") as f:
        head = f.read(8)
    try:
        if head == _HDF5_MAGIC:
            return (*_read_hdf5(path), "h5")
        if zipfile.is_zipfile(path):
            return (*_read_keras_zip(path), "keras")
    except (OSError, KeyError, zipfile.BadZipFile) as error:
        raise _fail(path, f"cannot be read ({type(error).__name__}: {error})",
                    _RESAVE) from None
    raise _fail(path, "is not an HDF5 file, a zip file or a SavedModel directory",
                f"give {', '.join(FORMATS)}")


# ---------------------------------------------------------------------------------------------
# Translating the config
# ---------------------------------------------------------------------------------------------


def _layer_entries(config: dict, where: Any) -> list[dict]:
    kind = config.get("class_name")
    if kind not in ("Sequential", "Functional", "Model"):
        raise _fail(where, f"holds a {kind} model, not a Sequential or functional one",
                    "bnn converts Sequential and functional Keras models; rebuild subclassed "
                    "models as one of those in the Larq environment and save again")
    return list((config.get("config") or {}).get("layers") or [])


def _core_quantizer(value: Any, where: str, argument: str) -> Any:
    """A Larq quantizer config (or name) -> a bnn quantizer object, or None."""
    if value is None:
        return None
    try:
        quantizer = larq_quantizers.get(value)
    except (ValueError, TypeError) as error:
        name = value.get("class_name") if isinstance(value, dict) else value
        raise _fail(where, f"{argument} {name!r} is not one of Larq's quantizers ({error})",
                    "bnn converts SteSign, ApproxSign, SwishSign, MagnitudeAwareSign, "
                    "SteHeaviside, SteTern, DoReFa and NoOp") from None
    core = bq.equivalent(quantizer)
    if core is None:
        raise _fail(where, f"{argument} {value!r} is not one of Larq's quantizers",
                    "bnn converts Larq's built-in quantizers only")
    return core


def _core_constraint(value: Any) -> Any:
    constraint = larq_constraints.get(value)
    if isinstance(constraint, bc.WeightClip):
        return bc.WeightClip(constraint.clip_value)
    return constraint


def _activation(value: Any, where: str) -> Any:
    """Larq quantizers used as activations become bnn quantizers; Keras names stay."""
    if isinstance(value, str) and value in larq_quantizers.NAMES:
        return _core_quantizer(value, where, "activation")
    if isinstance(value, dict) and (value.get("class_name") in larq_quantizers.NAMES or (
            value.get("class_name") == "function" and value.get("config") in
            larq_quantizers.NAMES)):
        return _core_quantizer(value, where, "activation")
    return value


def _dtype(value: Any) -> Any:
    """tf-keras mixed-precision policies are saved as dicts; Keras 3 takes their name."""
    if isinstance(value, dict):
        return (value.get("config") or {}).get("name", "float32")
    return value


def _layer_config(entry: dict, where: str) -> dict:
    config = dict(entry.get("config") or {})
    for key in ("batch_input_shape", "input_dim", "input_shape"):
        config.pop(key, None)
    if "dtype" in config:
        config["dtype"] = _dtype(config["dtype"])
    if "activation" in config:
        config["activation"] = _activation(config["activation"], where)
    for key in list(config):
        if key.endswith("_constraint") and config[key] is not None:
            config[key] = _core_constraint(config[key])
    return config


def _drop_conv_leftovers(config: dict) -> None:
    """tf-keras' depthwise and separable convolutions inherit ``Conv``'s config keys
    ``groups`` (always 1) and ``kernel_*`` (unused: they have depthwise and pointwise kernels);
    Keras 3 does not take them."""
    if config.get("groups", 1) == 1:
        config.pop("groups", None)
    for key in ("kernel_initializer", "kernel_regularizer", "kernel_constraint"):
        config.pop(key, None)


def _translate(entry: dict, path: Path) -> keras.layers.Layer:
    """A Keras 3 layer with the behaviour of the tf-keras layer config ``entry``."""
    class_name = entry.get("class_name")
    name = (entry.get("config") or {}).get("name", "?")
    where = f"{path}: layer {name!r} ({class_name})"
    if class_name in ("Sequential", "Functional", "Model"):
        raise ConversionError(f"{where}: is a nested model; flatten it into the outer model in "
                              "the Larq environment and save again")
    if class_name in larq_layers.UNSUPPORTED:
        raise ConversionError(
            f"{where}: has no bnn counterpart; bnn converts {', '.join(_LARQ_LAYERS)}: replace "
            "this layer in the Larq model, or keep the model in Larq")
    config = _layer_config(entry, where)
    if class_name in _LARQ_LAYERS:
        cls, quantizer_arguments = _LARQ_LAYERS[class_name]
        for argument in quantizer_arguments:
            config[argument] = _core_quantizer(config.get(argument), where, argument)
        config["precision"] = "binary"
        if cls in (bl.BinaryDepthwiseConv2D, bl.BinarySeparableConv2D):
            _drop_conv_leftovers(config)
    elif class_name in _KERAS_LAYERS:
        cls = _KERAS_LAYERS[class_name]
        if class_name == "BatchNormalization" and isinstance(config.get("axis"), list):
            if len(config["axis"]) != 1:
                raise ConversionError(f"{where}: normalizes over axes {config['axis']}; bnn "
                                      "converts batch norm over one axis")
            config["axis"] = config["axis"][0]
        if class_name in ("DepthwiseConv2D", "SeparableConv2D"):
            _drop_conv_leftovers(config)
    else:
        raise ConversionError(
            f"{where}: is not a layer bnn can convert (Larq's {', '.join(_LARQ_LAYERS)} and "
            f"Keras' {', '.join(sorted(_KERAS_LAYERS))}); replace it in the Larq model, or keep "
            "the model in Larq")
    try:
        return cls(**config)
    except (TypeError, ValueError) as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ConversionError(f"{where}: Keras 3 cannot build {cls.__name__} from its tf-keras "
                              f"config ({message[:200]})") from None


def _input_layer(entry: dict, path: Path) -> keras.layers.InputLayer:
    config = entry.get("config") or {}
    shape = config.get("batch_input_shape") or config.get("batch_shape")
    if shape is None:
        raise _fail(path, f"input layer {config.get('name')!r} has no shape", _RESAVE)
    try:
        return keras.layers.InputLayer(batch_shape=tuple(shape),
                                       dtype=_dtype(config.get("dtype")), name=config.get("name"))
    except (TypeError, ValueError) as error:
        raise _fail(path, f"input layer {config.get('name')!r} has shape {shape!r}, which Keras 3 "
                    f"does not take ({str(error).splitlines()[0][:160]})", _RESAVE) from None


def _sequential(config: dict, path: Path) -> keras.Model:
    entries = _layer_entries(config, path)
    body = config["config"]
    shape = None
    if entries and entries[0].get("class_name") == "InputLayer":
        entry = entries.pop(0)
        shape = (entry.get("config") or {}).get("batch_input_shape")
    elif entries:
        shape = (entries[0].get("config") or {}).get("batch_input_shape")
    shape = shape or body.get("build_input_shape")
    if shape is None:
        raise _fail(path, "the Sequential model was saved before it knew its input shape",
                    "in the Larq environment, build it (model.build(input_shape) or call it on "
                    "data) and save again")
    layers = [_translate(entry, path) for entry in entries]
    return keras.Sequential([keras.Input(batch_shape=tuple(shape)), *layers],
                            name=body.get("name"))


def _functional(config: dict, path: Path) -> keras.Model:
    body = dict(config["config"])
    layers = []
    for entry in _layer_entries(config, path):
        layer = (_input_layer(entry, path) if entry.get("class_name") == "InputLayer"
                 else _translate(entry, path))
        serialized = keras.saving.serialize_keras_object(layer)
        serialized.pop("build_config", None)
        serialized["name"] = entry.get("name", layer.name)
        serialized["inbound_nodes"] = entry.get("inbound_nodes", [])
        layers.append(serialized)
    body["layers"] = layers
    for key in ("input_layers", "output_layers"):
        # tf-keras nests a single input or output as [[name, 0, 0]]; Keras 3 writes [name, 0, 0]
        if isinstance(body.get(key), list) and len(body[key]) == 1 and isinstance(
                body[key][0], list):
            body[key] = body[key][0]
    try:
        return keras.Model.from_config(body)
    except (TypeError, ValueError, IndexError, KeyError) as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise _fail(path, f"Keras 3 cannot connect the functional model's layers ({message})",
                    _RESAVE) from None


# ---------------------------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------------------------


def _source_name(layer: keras.layers.Layer, variable) -> str:
    for cls in type(layer).__mro__:
        if (cls, variable.name) in _SOURCE_NAMES:
            return _SOURCE_NAMES[(cls, variable.name)]
    return variable.name


def _copy_weights(model: keras.Model, weights: dict, path: Path) -> None:
    for layer in model.layers:
        source = weights.get(layer.name, {})
        targets = list(layer.weights)
        where = f"{path}: layer {layer.name!r}"
        if not targets and not source:
            continue
        if all(isinstance(key, int) for key in source):  # .keras: by position
            values = [source.get(i) for i in range(len(targets))]
            extra = sorted(set(source) - set(range(len(targets))))
            names = [_source_name(layer, v) for v in targets]
        else:  # HDF5, SavedModel: by variable name
            names = [_source_name(layer, v) for v in targets]
            values = [source.get(name) for name in names]
            extra = sorted(set(source) - set(names))
        missing = [name for name, value in zip(names, values) if value is None]
        if missing or extra:
            raise _fail(where, f"the file's weights do not match the layer (missing: "
                        f"{missing or 'none'}; unexpected: {extra or 'none'})", _RESAVE)
        for variable, value, name in zip(targets, values, names):
            if tuple(value.shape) != tuple(variable.shape):
                raise _fail(where, f"weight {name!r} has shape {tuple(value.shape)} where the "
                            f"layer needs {tuple(variable.shape)}", _RESAVE)
            variable.assign(value.astype(keras.backend.standardize_dtype(variable.dtype)))
    unused = sorted(set(weights) - {layer.name for layer in model.layers})
    unused = [name for name in unused if weights[name]]
    if unused:
        raise _fail(path, f"has weights for layers the model does not have ({unused})", _RESAVE)


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------


def convert(path: str | Path) -> keras.Model:
    """The Keras 3 bnn model of the Larq model saved at ``path`` (HDF5 ``.h5``, tf-keras
    ``.keras``, or a SavedModel directory), with its weights. Its outputs equal the Larq model's
    in inference mode. Optimizer state is not converted.

    Raises:
        ConversionError: for an unreadable file or a layer, quantizer or constraint bnn cannot
            convert, with a one-line message naming it and the fix.
    """
    path = Path(path)
    config, weights, _ = _read(path)
    model = _build(config, weights, path)
    return model


def _build(config: dict, weights: dict, path: Path) -> keras.Model:
    model = (_sequential(config, path) if config.get("class_name") == "Sequential"
             else _functional(config, path))
    _copy_weights(model, weights, path)
    return model


def convert_file(source: str | Path, output: str | Path) -> dict[str, Any]:
    """Converts the Larq model at ``source`` (see :func:`convert`) and saves it as the Keras 3
    file ``output`` (``.keras``).

    Returns:
        ``source``, ``format`` (``"h5"``, ``"keras"`` or ``"savedmodel"``), ``output``,
        ``params`` and ``layers``: for each layer its name, its class in the Larq model and
        its class in the converted one.

    Raises:
        ConversionError: as :func:`convert`, and for an output that is not a writable
            ``.keras`` path.
    """
    source, output = Path(source), Path(output)
    if output.suffix != ".keras":
        raise _fail(output, "the output must be a .keras file", "give -o NAME.keras")
    config, weights, kind = _read(source)
    model = _build(config, weights, source)
    entries = [e for e in _layer_entries(config, source) if e.get("class_name") != "InputLayer"]
    larq_classes = {(e.get("config") or {}).get("name"): e.get("class_name") for e in entries}
    try:
        model.save(output)
    except OSError as error:
        raise _fail(output, f"cannot be written ({error.strerror or error})",
                    "check the directory") from None
    return {"source": str(source), "format": kind, "output": str(output),
            "params": int(model.count_params()),
            "layers": [{"name": layer.name, "larq": larq_classes.get(layer.name, "?"),
                        "bnn": type(layer).__name__} for layer in model.layers]}
