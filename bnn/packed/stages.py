"""A trained binary Keras model as *stages*: the one description every packed target runs.

Each stage is a dense or convolution layer, an optional max-pooling and a batch normalization.
Hidden stages end in ``sign`` and hand packed bits to the next stage; the batch normalization and
sign of a stage with packed input fold into one integer threshold per channel
(:mod:`bnn.packed.fold`), so those stages do no float math at all. The first stage (real inputs,
binary kernel) and the last stage (batch normalization giving the logits) run in float32.

A first dense stage exported with an *input encoding* (inputs ``x = scale * u + offset`` for
integer pixels ``u`` in [0, 255]) takes ``u`` instead: ``x . w = scale * (u . w) + offset *
sum(w)``, and the integer ``u . w`` is exact (``|u . w| <= 255 n < 2**24``); its batch norm and
sign fold into an integer threshold on ``u . w``, like a hidden stage.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from bnn import quantizers
from bnn.errors import ExportError
from bnn.layers import BinaryConv2D, BinaryDense
from bnn.ops.bitpack import pack_bits
from bnn.packed.fold import norm_arrays, pixel_thresholds, sign_thresholds

__all__ = ["SUPPORTED", "model_stages"]

_fail = ExportError.at  # "<where>: <problem>; <fix>"

SUPPORTED = ("BinaryDense, BinaryConv2D (precision='binary', kernel_quantizer='ste_sign', "
              "input_quantizer='ste_sign'; on the first layer input_quantizer=None, and "
              "kernel_quantizer=None too for a real-valued first layer), MaxPooling2D, "
              "BatchNormalization, Flatten, Dropout, a final softmax Activation")


def _check_binary_layer(layer, first: bool, where: str) -> bool:
    """Validates a binary layer; returns True when its inputs are binarized (ste_sign)."""
    name = f"{where}: layer {layer.name!r}"
    if layer.precision != "binary":
        raise _fail(name, "has precision='float' (a float twin)",
                    "export the binary model (RUN_DIR/binary/model.keras)")
    binarized = isinstance(quantizers.equivalent(layer.input_quantizer), quantizers.SteSign)
    if layer.kernel_quantizer is None and first and not binarized:
        pass  # a real-valued first layer: its float32 kernel is stored as is
    elif not isinstance(quantizers.equivalent(layer.kernel_quantizer), quantizers.SteSign):
        raise _fail(name, f"kernel_quantizer {layer.kernel_quantizer!r} is not supported",
                    f"supported: {SUPPORTED}")
    if layer.scale_kernel:
        raise _fail(name, "uses scale_kernel=True", "export supports unscaled ±1 kernels only")
    if layer.get_config().get("activation") not in (None, "linear"):
        raise _fail(name, f"has activation {layer.get_config()['activation']!r}",
                    "binary layers must be linear (batch norm and sign follow)")
    if not binarized and not (first and layer.input_quantizer is None):
        raise _fail(name, f"input_quantizer {layer.input_quantizer!r} is not supported here",
                    f"supported: {SUPPORTED}")
    if isinstance(layer, BinaryConv2D):
        if layer.data_format != "channels_last" or tuple(layer.dilation_rate) != (1, 1) \
                or layer.groups != 1:
            raise _fail(name, "uses channels_first, dilation or groups",
                        "export supports channels_last, dilation 1, groups 1")
        if layer.padding == "same" and layer.pad_values not in (1.0, 0.0, -1.0):
            raise _fail(name, f"pads with {layer.pad_values}",
                        "export supports pad_values 1.0, 0.0 (Keras zeros) or -1.0")
    return binarized


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


def _sign_thresholds(bn, bias, fan_in: int, where: str) -> dict[str, np.ndarray]:
    """:func:`bnn.packed.fold.sign_thresholds`, its error naming the layer."""
    try:
        return sign_thresholds(bn, bias, fan_in)
    except ValueError as error:
        raise _fail(f"{where}: layer {bn.name!r}", str(error),
                             "check its parameters") from None


def model_stages(model: keras.Model, where: str, input_encoding=None):
    """The stages of a binary Keras model: ``(input_shape, stages, arrays, input_encoding)``,
    each stage a spec (``layer``, ``op``, ``input`` kind, ``input_shape``, ``units``, ``pool``,
    ``output`` kind, and the convolution's geometry) with its named arrays (packed kernel,
    folded thresholds or batch-norm parameters). ``where`` names the model in errors.

    Raises:
        ExportError: naming the layer a model has that export does not support.
    """
    if not isinstance(model, keras.Sequential):
        raise _fail(where, f"model {model.name!r} is not a keras.Sequential chain",
                    f"export supports Sequential models built from {SUPPORTED}")
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
                        f"{type(layer).__name__} is not supported", f"supported: {SUPPORTED}")
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
            stage_arrays.update(pixel_thresholds(bn, bias, signs, encoding))
        elif spec["output"] == "bits" and packed:
            stage_arrays.update(_sign_thresholds(bn, bias, fan_in, where))
        else:
            norm, spec["bn_epsilon"] = norm_arrays(bn)
            stage_arrays.update(norm)
        stages.append(spec)
        arrays.append(stage_arrays)
        shape, packed = out_shape, True
    if not stages:
        raise _fail(where, "the model has no binary layers", f"supported: {SUPPORTED}")
    return input_shape, stages, arrays, model_encoding
