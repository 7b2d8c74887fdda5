"""Bit packing, xor-popcount kernels, batch-norm -> threshold folding, and the packed model.

A ±1 vector of length ``n`` is stored as ``ceil(n / word_bits)`` integer words: bit ``i`` of the
vector (bit ``i % word_bits`` of word ``i // word_bits``, least significant first) is 1 where the
value is +1 (any value >= 0) and 0 where it is -1. Bits past ``n`` in the last word are 0 in
every packed operand, so they never count as a mismatch.

For two packed ±1 vectors the dot product is exact integer arithmetic:
``x . w = n - 2 * popcount(x XOR w)`` (matching bits contribute +1, mismatching ones -1).

:class:`PackedModel` runs a chain of *stages* exported from a Keras model (see ``bnn.export``):
each stage is a dense or convolution layer, an optional max-pooling and a batch normalization.
Hidden stages end in ``sign`` and hand packed bits to the next stage; the batch normalization and
sign of a stage with packed input fold into one integer threshold per channel (see
:func:`fold_sign_threshold`), so those stages do no float math at all. The first stage (real
inputs, binary kernel) and the last stage (batch normalization giving the logits) run in float32.

A first dense stage exported with an *input encoding* (inputs ``x = scale * u + offset`` for
integer pixels ``u`` in [0, 255]) takes ``u`` instead: ``x . w = scale * (u . w) + offset *
sum(w)``, and the integer ``u . w`` is computed exactly (``|u . w| <= 255 n < 2**24``), by an
int8 oneDNN (VNNI) product for batches of ``LARGE_BATCH`` or more, else by a float32 product of
the integer-valued ``u`` inside XLA; both give the same integers. Its batch norm and sign are
folded into an integer threshold on ``u . w``, like a hidden stage.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from bnn import cpu, kernels
from bnn.bitops import WORD_BITS, pack, same_pads, xor_popcount_conv2d, xor_popcount_matmul

__all__ = ["pack_bits", "unpack_bits", "xor_popcount_matmul", "fold_sign_threshold",
           "int8_matmul_available", "int8_first_layer_preferred", "PackedModel",
           "NativeKernelsUnavailable", "WORD_BITS", "LARGE_BATCH", "EAGER_BATCH"]

#: Batches of at least this many examples run the int8 oneDNN first layer (when available) and
#: split the XLA part into two halves that run concurrently; smaller batches run one XLA call.
LARGE_BATCH = 16
#: With native kernels, batches under this size of a model with an integer first stage and packed
#: dense layers run as one eager native op (no graph call at all).
EAGER_BATCH = 64
_WORD_DTYPES = {8: np.int8, 16: np.int16, 32: np.int32, 64: np.int64}


def _words(n: int, word_bits: int = WORD_BITS) -> int:
    return -(-n // word_bits)


def pack_bits(a: np.ndarray, axis: int = -1, word_bits: int = WORD_BITS) -> np.ndarray:
    """Packs ±1 values along ``axis`` into signed integer words (``int64`` for 64 bits, ``int32``
    for 32, ``int16``, ``int8``).

    Bit ``i`` (least significant first) of word ``j`` holds element ``j * word_bits + i``: 1 where
    the element is >= 0 (+1), 0 where it is negative (-1). The axis shrinks from ``n`` to
    ``ceil(n / word_bits)``; the last word's bits past ``n`` are 0.
    """
    if word_bits not in _WORD_DTYPES:
        raise ValueError(f"word_bits must be one of {sorted(_WORD_DTYPES)}, got {word_bits!r}")
    bits = np.moveaxis(np.asarray(a) >= 0, axis, -1)
    n = bits.shape[-1]
    pad = _words(n, word_bits) * word_bits - n
    bits = np.pad(bits, [(0, 0)] * (bits.ndim - 1) + [(0, pad)])
    packed = np.packbits(bits, axis=-1, bitorder="little")
    dtype = np.dtype(_WORD_DTYPES[word_bits]).newbyteorder("<")
    words = np.ascontiguousarray(packed).view(dtype).astype(_WORD_DTYPES[word_bits])
    return np.moveaxis(words, -1, axis)


def unpack_bits(words: np.ndarray, n: int, axis: int = -1,
                word_bits: int = WORD_BITS) -> np.ndarray:
    """Inverse of :func:`pack_bits`: ``n`` float32 values ±1 along ``axis``."""
    if word_bits not in _WORD_DTYPES:
        raise ValueError(f"word_bits must be one of {sorted(_WORD_DTYPES)}, got {word_bits!r}")
    w = np.moveaxis(np.asarray(words), axis, -1)
    if w.shape[-1] != _words(n, word_bits):
        raise ValueError(f"{w.shape[-1]} words along axis {axis} cannot hold n={n} values of "
                         f"{word_bits} bits; expected {_words(n, word_bits)} words")
    as_bytes = np.ascontiguousarray(w.astype(np.dtype(_WORD_DTYPES[word_bits]).newbyteorder("<")))
    bits = np.unpackbits(as_bytes.view(np.uint8), axis=-1, bitorder="little")[..., :n]
    return np.moveaxis(np.where(bits == 1, 1.0, -1.0).astype(np.float32), -1, axis)


def fold_sign_threshold(values: np.ndarray, positive: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Folds a per-channel monotone decision ``sign(f_c(a))`` over integers into a threshold.

    Args:
        values: ``(m,)`` increasing integers, every pre-activation value ``a`` that can occur.
        positive: ``(m, channels)`` bool, ``f_c(a) >= 0`` evaluated by the source model.

    Returns:
        ``(threshold, flip)``: int32 and bool ``(channels,)`` such that for every listed ``a``
        ``positive[a, c] == ((a >= threshold[c]) XOR flip[c])``. An increasing ``f_c``
        (gamma > 0) gives ``flip=False``; a decreasing one (gamma < 0) gives ``flip=True``.

    Raises:
        ValueError: if some channel's decision is not monotone in ``a`` (not a sign of an affine
            function), naming the channel.
    """
    values = np.asarray(values, np.int64)
    positive = np.asarray(positive, bool)
    thresholds = np.empty(positive.shape[1], np.int32)
    flips = np.zeros(positive.shape[1], bool)
    for c in range(positive.shape[1]):
        col = positive[:, c]
        for flip in (False, True):
            up = col ^ flip  # must be False...False True...True
            first = int(np.argmax(up)) if up.any() else len(up)
            if not up[first:].all():
                continue
            thresholds[c] = values[first] if first < len(up) else values[-1] + 1
            flips[c] = flip
            break
        else:
            raise ValueError(f"channel {c}: sign(batch_norm(a)) is not monotone in a, so it "
                             "cannot fold into a threshold")
    return thresholds, flips


class _Stage(tf.Module):
    """One exported stage: linear op, optional max-pool, batch norm, sign or logits."""

    def __init__(self, spec: dict[str, Any], arrays: dict[str, np.ndarray]):
        super().__init__(name=None)
        self.spec = spec
        self.op, self.packed_in = spec["op"], spec["input"] == "packed"
        self.integer_in = spec["input"] == "uint8"
        self.in_shape = tuple(spec["input_shape"])
        self.units = int(spec["units"])
        self.pool = tuple(spec["pool"]) if spec.get("pool") else None
        self.output = spec["output"]

        def const(key, dtype):
            return tf.Variable(np.asarray(arrays[key]), dtype=dtype, trainable=False, name=key)

        if self.packed_in:
            self.kernel = const("kernel", tf.int64)
        elif spec.get("real_kernel"):  # a real-valued first layer: its float32 kernel as is
            self.kernel = const("kernel", tf.float32)
        else:  # real inputs: the ±1 kernel, stored packed along its input axis, as float32
            n = int(np.prod(self.in_shape)) if self.op == "dense" else self.in_shape[-1]
            axis = 0 if self.op == "dense" else 2
            self.kernel = tf.Variable(unpack_bits(arrays["kernel"], n, axis=axis),
                                      trainable=False, name="kernel")
        self.bias = const("bias", tf.float32) if "bias" in arrays else None
        if self.integer_in:  # exact integer products u . w: int8 kernel for oneDNN, words, and
            self.kernel_int8 = self.kernel.numpy().astype(np.int8)  # the native pixel tables'
            self.kernel_words = const("kernel", tf.int64)
            self.kernel_table = tf.constant(kernels.table_kernel(
                arrays["kernel"], int(np.prod(self.in_shape))))
        if self.output == "bits" and (self.packed_in or self.integer_in):
            self.threshold = const("threshold", tf.int32)
            self.flip = const("flip", tf.int64)
        else:
            self.eps = float(spec["bn_epsilon"])
            self.mean = const("bn_mean", tf.float32)
            self.variance = const("bn_variance", tf.float32)
            self.gamma = const("bn_gamma", tf.float32) if "bn_gamma" in arrays else None
            self.beta = const("bn_beta", tf.float32) if "bn_beta" in arrays else None
        if self.output == "logits":
            self._fold_logits(arrays)
        if self.op == "conv2d":
            self.kh, self.kw = spec["kernel_size"]
            self.sh, self.sw = spec["strides"]
            self.pad_value = float(spec["pad_value"])
            h, w = self.in_shape[0], self.in_shape[1]
            if spec["padding"] == "same":
                self.pads = [[0, 0], list(same_pads(h, self.kh, self.sh)),
                             list(same_pads(w, self.kw, self.sw)), [0, 0]]
            else:
                self.pads = [[0, 0]] * 4
            self.corr = self.pad_mask = None
            if self.packed_in and any(p for pair in self.pads for p in pair):
                self._padding_constants(arrays)

    def _fold_logits(self, arrays):
        """Batch norm (and bias) of the logits as ``a * scale + shift`` per channel, folded in
        float64 and rounded once to float32: the bias commutes with max-pooling (it is the same
        across a window), so it folds into ``shift`` even when the stage pools."""
        var = np.asarray(arrays["bn_variance"], np.float64)
        scale = 1.0 / np.sqrt(var + float(self.spec["bn_epsilon"]))
        if "bn_gamma" in arrays:
            scale = scale * np.asarray(arrays["bn_gamma"], np.float64)
        shift = -np.asarray(arrays["bn_mean"], np.float64) * scale
        if "bn_beta" in arrays:
            shift = shift + np.asarray(arrays["bn_beta"], np.float64)
        if "bias" in arrays:
            shift = shift + np.asarray(arrays["bias"], np.float64) * scale
        self.logit_scale_np = scale.astype(np.float32)
        self.logit_shift_np = shift.astype(np.float32)
        self.logit_scale = tf.constant(self.logit_scale_np)
        self.logit_shift = tf.constant(self.logit_shift_np)

    def _padding_constants(self, arrays):
        """Packed-input padding: -1 padding is 0 bits; +1 padding ORs in a word mask of the real
        channel bits at padded positions; 0 padding pads -1 bits and adds back the sum of the
        kernel taps that fall in the padding (per output position and channel)."""
        h, w, c = self.in_shape
        inside = np.zeros((1, h + sum(self.pads[1]), w + sum(self.pads[2]), 1), np.float32)
        inside[:, self.pads[1][0]:self.pads[1][0] + h, self.pads[2][0]:self.pads[2][0] + w] = 1
        if self.pad_value == 1.0:
            mask = pack_bits(np.ones(c))  # real channel bits set, pad bits clear
            self.pad_mask = tf.constant(np.where(inside > 0, 0, 1).astype(np.int64) * mask)
        elif self.pad_value == 0.0:
            kernel = unpack_bits(arrays["kernel"].reshape(self.kh, self.kw, -1, self.units),
                                 c, axis=2)
            outside = np.broadcast_to(1 - inside, inside.shape[:3] + (c,))
            corr = tf.nn.conv2d(outside, kernel, [1, self.sh, self.sw, 1], "VALID")
            self.corr = tf.constant(np.rint(corr.numpy()[0]).astype(np.int32))

    def _linear(self, x: tf.Tensor) -> tf.Tensor:
        """Pre-activation: int32 for packed input, float32 for real input."""
        if self.op == "dense":
            x = tf.reshape(x, [-1, int(np.prod(x.shape[1:]))])
            if self.packed_in:
                return xor_popcount_matmul(x, self.kernel, int(np.prod(self.in_shape)))
            return tf.matmul(x, self.kernel)
        if not self.packed_in:
            if self.pad_value != 0.0:
                x = tf.pad(x, self.pads, constant_values=self.pad_value)
            padding = "VALID" if self.pad_value != 0.0 else self.spec["padding"].upper()
            return tf.nn.conv2d(x, self.kernel, [1, self.sh, self.sw, 1], padding)
        n = self.kh * self.kw * self.in_shape[-1]
        dots = xor_popcount_conv2d(self._padded_words(x), self.kernel, (self.kh, self.kw),
                                   (self.sh, self.sw), n)
        return dots if self.corr is None else dots + self.corr

    def _padded_words(self, x: tf.Tensor) -> tf.Tensor:
        """A packed convolution's input words, padded: -1 and 0 padding as 0 bits, +1 padding
        as the real channels' bits (``pad_mask``)."""
        x = tf.pad(x, self.pads)
        return x if self.pad_mask is None else tf.bitwise.bitwise_or(x, self.pad_mask)

    def _pool_or(self, words: tf.Tensor) -> tf.Tensor:
        """Max-pool of bits ``[a >= t]`` is the OR of the bits (windows of size = stride)."""
        ph, pw = self.pool
        ho, wo = words.shape[1] // ph, words.shape[2] // pw
        out = None
        for i in range(ph):
            for j in range(pw):
                tap = words[:, i:i + (ho - 1) * ph + 1:ph, j:j + (wo - 1) * pw + 1:pw, :]
                out = tap if out is None else tf.bitwise.bitwise_or(out, tap)
        return out

    def _norm(self, x: tf.Tensor) -> tf.Tensor:
        return tf.nn.batch_normalization(x, self.mean, self.variance, self.beta, self.gamma,
                                         self.eps)

    def integer_product(self, u: tf.Tensor) -> tf.Tensor:
        """Exact int32 ``u . w`` for uint8 ``u`` (batch, n) by oneDNN's int8 (u8 x s8 -> s32)
        inner product. The kernel is a graph constant, so oneDNN reorders it once, not per call."""
        out = tf.raw_ops.QuantizedMatMulWithBias(
            a=tf.bitcast(tf.reshape(u, [-1, self.kernel_int8.shape[0]]), tf.quint8),
            b=tf.constant(self.kernel_int8, tf.qint8),
            bias=tf.constant(np.zeros(self.units, np.int32), tf.qint32),
            min_a=0.0, max_a=255.0, min_b=-127.0, max_b=127.0, Toutput=tf.qint32)[0]
        return tf.bitcast(out, tf.int32)

    def bitplane_product(self, u: tf.Tensor) -> tf.Tensor:
        """Exact int32 ``u . w`` from the 8 bit planes of uint8 ``u``: with ``u = sum_k 2**k
        b_k``, ``b_k . w = 2 * popcount(b_k AND w_bits) - popcount(b_k)`` (``w_bits``: the
        packed +1 positions). Reads 1/32 of the float32 kernel's bytes: fastest for one
        example, where the product is a matrix-vector product bound by memory."""
        n = self.kernel_int8.shape[0]
        u = tf.cast(tf.reshape(u, [-1, 1, n]), tf.int32)
        planes = pack(tf.bitwise.bitwise_and(
            tf.bitwise.right_shift(u, tf.range(8)[None, :, None]), 1) > 0)  # (b, 8, words)
        counts = None
        for j in range(int(planes.shape[-1])):
            part = tf.cast(tf.raw_ops.PopulationCount(x=tf.bitwise.bitwise_and(
                planes[:, :, j, None], self.kernel_words[j][None, None, :])), tf.int32)
            counts = part if counts is None else counts + part
        ones = tf.reduce_sum(tf.cast(tf.raw_ops.PopulationCount(x=planes), tf.int32), axis=-1)
        weights = tf.constant([1 << k for k in range(8)], tf.int32)[None, :, None]
        return tf.reduce_sum((2 * counts - ones[:, :, None]) * weights, axis=1)

    def native_call(self, x: tf.Tensor, encoding: dict[str, float] | None = None
                    ) -> tf.Tensor | None:
        """The stage through the native kernels (:mod:`bnn.kernels`) where they apply: a packed
        dense stage, or an integer first stage given its uint8 pixels or float inputs encoded by
        ``encoding`` (pixel tables) or its int32 products (thresholds); ``None`` elsewhere.
        Same integers as :meth:`__call__`."""
        if self.packed_in and self.op == "dense":
            x = tf.reshape(x, [-1, int(np.prod(x.shape[1:]))])
            n = int(np.prod(self.in_shape))
            if self.output == "bits":
                return kernels.xor_popcount_sign(x, self.kernel, self.threshold, self.flip, n)
            if self.pool:
                return self._tail_xla(n - 2 * kernels.xor_popcount(x, self.kernel))
            return kernels.xor_popcount_affine(x, self.kernel, self.logit_scale,
                                               self.logit_shift, n)
        if self.packed_in and self.op == "conv2d" and self.output == "bits":
            dots = kernels.ops().xor_popcount_conv2d(
                self._padded_words(x), self.kernel, (self.kh, self.kw), (self.sh, self.sw),
                self.kh * self.kw * self.in_shape[-1])
            return self._bits_xla(dots)
        if self.integer_in and x.dtype != tf.int32 and self.output == "bits":
            return kernels.pixel_table_sign(x, self.kernel_table, self.threshold, self.flip,
                                            None if x.dtype == tf.uint8 else encoding)
        if self.integer_in and x.dtype == tf.int32 and self.output == "bits":
            return kernels.threshold_pack(x, self.threshold, self.flip)
        return None

    @tf.function(jit_compile=True)
    def call_xla(self, x: tf.Tensor) -> tf.Tensor:
        """The stage as its own XLA computation (the native path's stages without native
        kernels), so its float math rounds as in the all-XLA paths."""
        return self(x)

    @tf.function(jit_compile=True)
    def _bits_xla(self, dots: tf.Tensor) -> tf.Tensor:
        """:meth:`_bits` of a packed convolution's float32 dot products (exact integers), with
        its zero-padding correction, compiled by XLA."""
        a = tf.cast(dots, tf.int32)
        return self._bits(a if self.corr is None else a + self.corr)

    @tf.function(jit_compile=True)
    def _tail_xla(self, a: tf.Tensor) -> tf.Tensor:
        """:meth:`_tail` compiled by XLA, as in the all-XLA paths, so the float logits round
        the same way on every path."""
        return self._tail(a)

    def _tail(self, a: tf.Tensor) -> tf.Tensor:
        """Bias, max-pool and batch norm of a real or integer pre-activation, then the sign bits;
        or, for the logits, max-pool and the folded affine map ``a * scale + shift``."""
        a = tf.cast(a, tf.float32)
        if self.output == "logits":
            if self.pool:
                a = tf.nn.max_pool2d(a, list(self.pool), list(self.pool), "VALID")
            return a * self.logit_scale + self.logit_shift
        return pack(self._signs(a))

    def _signs(self, a: tf.Tensor) -> tf.Tensor:
        """``batch_norm(max_pool(a + bias)) >= 0``: the stage's sign bits, unpacked."""
        if self.bias is not None:
            a = a + self.bias
        if self.pool:
            a = tf.nn.max_pool2d(a, list(self.pool), list(self.pool), "VALID")
        return self._norm(a) >= 0

    def real_signs(self, x: tf.Tensor) -> tf.Tensor:
        """The unpacked sign bits of a hidden stage with real inputs (binarized first if the
        source layer binarized them), as plain TensorFlow ops: outside XLA they round exactly as
        the source Keras layers do when Keras runs without XLA (XLA may sum the product in
        another order and fuse the batch norm's multiply and add, which moves a value within
        rounding of 0 to the other side)."""
        return self._signs(self._linear(self._binarized(x)))

    def _binarized(self, x: tf.Tensor) -> tf.Tensor:
        """The inputs, binarized where the source layer binarized them."""
        return tf.where(x >= 0, 1.0, -1.0) if self.spec.get("binarize_input") else x

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        x = self._binarized(x)
        if self.integer_in:  # uint8 pixels, or their int32 products from integer_product
            if x.dtype == tf.int32:
                a = x
            elif x.shape[0] == 1:
                a = self.bitplane_product(x)
            else:  # exact: integer sums below 2**24
                a = tf.cast(self._linear(tf.cast(x, tf.float32)), tf.int32)
        else:
            a = self._linear(x)
        if (self.packed_in or self.integer_in) and self.output == "bits":
            return self._bits(a)
        return self._tail(a)

    def _bits(self, a: tf.Tensor) -> tf.Tensor:
        """The next stage's words from int32 pre-activations: ``[a >= threshold]`` packed,
        max-pooled as an OR, XOR the flips."""
        words = pack(a >= self.threshold)
        if self.pool:
            words = self._pool_or(words)
        return tf.bitwise.bitwise_xor(words, self.flip)


_pack_xla = tf.function(pack, jit_compile=True)


def _native_convolutions() -> bool:
    """Whether a model with packed convolutions runs its batches of :data:`LARGE_BATCH` or more
    on the native kernels by default (where :func:`bnn.kernels.preferred`): with their AVX2
    variant, which beat the XLA kernels on an AVX2-only CPU at batch 100 (docs/export.md);
    elsewhere the XLA kernels, as measured before. Smaller batches stay one XLA call."""
    return kernels.variant() == "avx2"


def int8_matmul_available() -> bool:
    """Whether this TensorFlow runs ``QuantizedMatMulWithBias`` (oneDNN builds, the default on
    x86 Linux; not with ``TF_ENABLE_ONEDNN_OPTS=0``) and it returns exact int32 products."""
    global _INT8_MATMUL
    if _INT8_MATMUL is None:
        u = np.arange(12, dtype=np.uint8).reshape(2, 6) * 21
        w = np.where(np.arange(18).reshape(6, 3) % 4 == 1, 1, -1).astype(np.int8)
        try:
            out = tf.raw_ops.QuantizedMatMulWithBias(
                a=tf.bitcast(tf.constant(u), tf.quint8), b=tf.bitcast(tf.constant(w), tf.qint8),
                bias=tf.zeros([3], tf.qint32), min_a=0.0, max_a=255.0, min_b=-127.0,
                max_b=127.0, Toutput=tf.qint32)[0]
            _INT8_MATMUL = bool(np.array_equal(tf.bitcast(out, tf.int32).numpy(),
                                               u.astype(np.int64) @ w))
        except (tf.errors.OpError, TypeError, ValueError):
            _INT8_MATMUL = False
    return _INT8_MATMUL


_INT8_MATMUL: bool | None = None


def int8_first_layer_preferred() -> bool:
    """Whether, with native kernels, an integer first stage of a batch of :data:`LARGE_BATCH` or
    more takes oneDNN's int8 product (:func:`int8_matmul_available`) rather than the native
    pixel tables (:meth:`bnn.kernels.Ops.pixel_table_sign`): where the kernels run their
    AVX-512 variant and the CPU has AVX-512 VNNI, whose int8 dot products beat the tables. Per
    example of a 784 -> 2048 layer, batch 1024, on an AVX-512 CPU with oneDNN limited to each
    instruction set: AVX2 21 us against 12 us for the tables, AVX2 with VNNI 12 against 12,
    AVX-512 with VNNI 9 against 12, all of it (AMX) 7 against 12 (docs/export.md)."""
    return kernels.variant() == "avx512" and "avx512_vnni" in cpu.flags()


class NativeKernelsUnavailable(RuntimeError):
    """``PackedModel(..., native=True)`` where :mod:`bnn.kernels` is unavailable or the model
    has packed convolutions."""


class _Dispatch:
    """The entry ``tf.function`` s by batch kind (``"one"``, ``"small"``, ``"large"``) and input
    dtype name, each traced to a concrete function on first use (calling the concrete function
    skips tf.function's dispatch). Kept outside TensorFlow's object tracking, so SavedModel
    export saves only the serving signature."""

    def __init__(self, functions: dict[str, dict[str, Any]]):
        self.functions, self.concrete = functions, {}

    def get(self, batch: int, dtype: str):
        kind = "one" if batch == 1 else "large" if batch >= LARGE_BATCH else "small"
        if (kind, dtype) not in self.concrete:
            self.concrete[kind, dtype] = self.functions[kind][dtype].get_concrete_function()
        return self.concrete[kind, dtype]


class PackedModel(tf.Module):
    """A compiled TensorFlow inference graph over exported stages (see the module docstring).

    Args:
        stages: stage specs (the ``"stages"`` of an export manifest).
        arrays: per stage, its named arrays (kernels, thresholds, batch-norm parameters).
        input_shape: the shape of one input example, without the batch axis.
        input_encoding: ``{"scale": s, "offset": o}`` when the first stage takes uint8 pixels
            ``u`` of normalized inputs ``x = s * u + o``; ``None`` for float inputs.

        native: use the native kernels of :mod:`bnn.kernels`; ``None`` (default): where
            :func:`bnn.kernels.preferred`, for a model with packed convolutions only where they
            run their AVX2 variant; ``True`` raises :class:`NativeKernelsUnavailable` where they
            are unavailable.

    Calls dispatch by batch size and input dtype, with no retracing and no per-call Python work
    per layer. With native kernels, a model with an integer first stage and packed dense layers
    (the MLP) runs batches under :data:`EAGER_BATCH`, and every batch where the first layer
    does not take the int8 product (:func:`int8_first_layer_preferred`), as one eager native
    op (:meth:`bnn.kernels.Ops.packed_dense_chain`: pixel-table first layer, xor-popcount
    layers, the logits' xor-popcount and affine map), with no graph call at all; larger
    batches, and other models' batches of :data:`LARGE_BATCH` or more, run one graph: the int8
    first layer (when :func:`int8_matmul_available`), native packed dense layers and packed
    convolutions spread over the intra-op threads (a dense logits stage with its affine map in
    float64, rounded once as XLA's fused multiply-add; a convolution's thresholds, pooling and
    packing as one XLA call), and the other stages as XLA calls. Without native kernels, batches under
    :data:`LARGE_BATCH` run one XLA call (batch 1 with a static shape, where an integer first
    stage uses bit planes), larger ones two independent halves, each the int8 first layer and
    one XLA call for the rest, which TensorFlow can run on two cores at once. All paths compute
    the same integers and round the float logits alike (XLA's fused multiply-add), so they give
    identical logits. :meth:`save_savedmodel` exports the pure-TensorFlow XLA path.
    """

    def __init__(self, stages: Sequence[dict[str, Any]],
                 arrays: Sequence[dict[str, np.ndarray]], input_shape: Sequence[int],
                 input_encoding: dict[str, float] | None = None, native: bool | None = None):
        super().__init__(name="packed_model")
        self.input_shape = tuple(int(d) for d in input_shape)
        self.input_encoding = dict(input_encoding) if input_encoding else None
        self.stages = [_Stage(spec, arr) for spec, arr in zip(stages, arrays)]
        integer = self.stages[0].integer_in
        if integer != (self.input_encoding is not None):
            raise ValueError("the first stage takes uint8 inputs exactly when the model has an "
                             "input encoding")
        in_dtype = tf.uint8 if integer else tf.float32
        first = self.stages[0]
        # a real-valued first stage's sign bits are computed outside XLA (see real_signs)
        self._real_first = not (first.integer_in or first.packed_in) and first.output == "bits"
        if self._real_first:
            s_shape = first.real_signs(tf.zeros([1, *self.input_shape])).shape[1:]
            self._body = tf.function(self._forward_from_signs, jit_compile=True,
                                     input_signature=[tf.TensorSpec([None, *s_shape], tf.bool)])
        else:
            self._body = tf.function(self._forward, jit_compile=True, input_signature=[
                tf.TensorSpec([None, *self.input_shape], in_dtype)])
        self._int8 = integer and int8_matmul_available()
        if self._int8:
            self._body_z = tf.function(self._forward, jit_compile=True, input_signature=[
                tf.TensorSpec([None, self.stages[0].units], tf.int32)])
        dense_only = not any(st.packed_in and st.op == "conv2d" for st in self.stages)
        if native is None:
            native = kernels.preferred() and (dense_only or _native_convolutions())
        elif native and not kernels.available():
            raise NativeKernelsUnavailable(
                f"native kernels cannot run this model: {kernels.unavailable_reason()}")
        self.native = bool(native)
        # the int8 first layer for large batches; otherwise the MLP's first layer stays on the
        # pixel tables and the eager chain beats a graph at every batch size
        self._int8_large = bool(self.native and self._int8 and int8_first_layer_preferred())
        functions: dict[str, dict[str, Any]] = {"one": {}, "small": {}, "large": {}}
        xla_entry = not self._real_first
        for dtype in ([tf.uint8, tf.float32] if integer else [tf.float32]):
            for kind, batch, mode in (("one", 1, "xla"), ("small", None, "xla"),
                                      ("large", None, "split")):
                if self.native and kind == "large":
                    mode = "native"
                functions[kind][dtype.name] = tf.function(
                    self._entry(in_dtype, mode), jit_compile=mode == "xla" and xla_entry,
                    input_signature=[tf.TensorSpec([batch, *self.input_shape], dtype)])
        self._dispatch = _Dispatch(functions)
        self._ops = kernels.ops() if self.native else None
        self._chain = self._eager_chain() if self.native else None
        self.serve = tf.function(self._entry(in_dtype, "xla"), jit_compile=xla_entry,
                                 input_signature=[tf.TensorSpec([None, *self.input_shape])])

    def _entry(self, in_dtype: tf.DType, mode: str):
        """The traced entry point: encodes float inputs of a uint8 model to pixels, then runs
        the whole model as one XLA computation (``"xla"``), as :meth:`_large_batch`
        (``"split"``) or through the native kernels (``"native"``)."""
        run = {"xla": self._run_body if self._real_first else self._forward,
               "split": self._large_batch, "native": self._native}[mode]

        # the native pixel tables encode float inputs themselves, in the same float32 arithmetic
        tables = mode == "native" and not self._int8_large

        def entry(x):
            if x.dtype != in_dtype and not tables:
                x = self._encode(x)
            return run(x)
        return entry

    def _eager_chain(self) -> tuple | None:
        """Constants for running batches as one eager native op (no graph call,
        :meth:`bnn.kernels.Ops.packed_dense_chain`): for an integer first stage, packed dense
        hidden stages and a packed dense logits stage without pooling, each stage's inputs the
        units of the one before it; ``None`` for other models."""
        first, middle, last = self.stages[0], self.stages[1:-1], self.stages[-1]
        if not (first.integer_in and first.output == "bits" and len(self.stages) >= 2
                and all(st.packed_in and st.op == "dense" and st.output == "bits"
                        for st in middle)
                and last.packed_in and last.op == "dense" and last.output == "logits"
                and not last.pool
                and all(int(np.prod(st.in_shape)) == before.units
                        for before, st in zip(self.stages, self.stages[1:]))):
            return None
        const = lambda v: tf.constant(v.numpy())  # noqa: E731
        return ((first.kernel_table, const(first.threshold), const(first.flip)),
                tuple((const(st.kernel), const(st.threshold), const(st.flip)) for st in middle),
                (const(last.kernel), last.logit_scale, last.logit_shift))

    def _eager(self, x: tf.Tensor) -> tf.Tensor:
        """A batch through :meth:`_eager_chain`'s constants: the whole model as one eager
        native op, whose logits are rounded as the XLA paths' fused multiply-add."""
        return self._ops.packed_dense_chain(x, *self._chain, encoding=(
            None if x.dtype == tf.uint8 else self.input_encoding))

    def _native(self, x: tf.Tensor) -> tf.Tensor:
        """Packed dense stages and an integer first stage on the native kernels (that stage's
        products by oneDNN's int8 inner product where :func:`int8_first_layer_preferred`), each
        other stage as one XLA call; the kernels use all intra-op threads."""
        if self._int8_large:
            x = self.stages[0].integer_product(x)
        for i, stage in enumerate(self.stages):
            if i == 0 and self._real_first:
                x = _pack_xla(stage.real_signs(x))
                continue
            y = stage.native_call(x, self.input_encoding)
            x = stage.call_xla(x) if y is None else y
        return x

    def _forward(self, x: tf.Tensor) -> tf.Tensor:
        for stage in self.stages:
            x = stage(x)
        return x

    def _forward_from_signs(self, signs: tf.Tensor) -> tf.Tensor:
        """:meth:`_forward` given the first stage's unpacked sign bits."""
        x = pack(signs)
        for stage in self.stages[1:]:
            x = stage(x)
        return x

    def _run_body(self, x: tf.Tensor) -> tf.Tensor:
        """The whole model: a real-valued first stage's signs outside XLA, the rest in one XLA
        call."""
        if self._real_first:
            return self._body(self.stages[0].real_signs(x))
        return self._body(x)

    def _encode(self, x: tf.Tensor) -> tf.Tensor:
        """float ``x = scale * u + offset`` -> uint8 ``u = round((x - offset) / scale)``."""
        u = tf.round((x - self.input_encoding["offset"]) / self.input_encoding["scale"])
        return tf.cast(tf.clip_by_value(u, 0.0, 255.0), tf.uint8)

    def _large_batch(self, x: tf.Tensor) -> tf.Tensor:
        """Two independent halves of the batch, each the int8 first layer (when available)
        then one XLA call for the rest; TensorFlow's executor runs the halves concurrently."""
        half = tf.shape(x)[0] // 2
        outputs = []
        for part in (x[:half], x[half:]):
            if self._int8:
                outputs.append(self._body_z(self.stages[0].integer_product(part)))
            else:
                outputs.append(self._run_body(part))
        return tf.concat(outputs, axis=0)

    def __call__(self, x) -> tf.Tensor:
        """float32 logits ``(batch, classes)`` for a batch of normalized float32 inputs, or, for
        a model with an input encoding, of uint8 pixels."""
        x = tf.convert_to_tensor(x)
        if x.dtype != tf.uint8 or self.input_encoding is None:
            x = tf.cast(x, tf.float32)
        if self._chain is not None and (x.shape[0] < EAGER_BATCH or not self._int8_large):
            return self._eager(x)
        return self._dispatch.get(x.shape[0], x.dtype.name)(x)

    def predict(self, x, batch_size: int = 256) -> np.ndarray:
        """Logits for ``x`` (numpy or tensor), computed ``batch_size`` examples at a time.

        ``x`` holds normalized float inputs or, for a model with an input encoding, uint8
        pixels; float inputs of such a model must lie on its pixel grid ``scale * u + offset``.
        """
        x = self.prepare(x)
        parts = [self(x[i:i + batch_size]).numpy() for i in range(0, len(x), batch_size)]
        return np.concatenate(parts) if parts else np.zeros((0, self.stages[-1].units), np.float32)

    def prepare(self, x) -> np.ndarray:
        """``x`` checked and converted for :meth:`__call__`: for a model with an input encoding,
        uint8 pixels (float inputs must lie on its pixel grid, and become the pixels they
        encode, which give identical logits); otherwise float32.

        Raises:
            ValueError: for inputs of the wrong shape, or float inputs of an encoded model that
                are not on its pixel grid.
        """
        x = np.asarray(x)
        if x.dtype != np.uint8 or self.input_encoding is None:
            x = x.astype(np.float32)
        if x.shape[1:] != self.input_shape:
            raise ValueError(f"inputs have shape {x.shape[1:]} per example but the packed model "
                             f"expects {self.input_shape}; reshape or normalize the data first")
        if self.input_encoding is not None and x.dtype == np.float32 and x.size:
            scale, offset = self.input_encoding["scale"], self.input_encoding["offset"]
            u = np.clip(np.rint((x - offset) / scale), 0, 255)
            error = float(np.abs(u * scale + offset - x).max())
            if error > 1e-3 * abs(scale):
                raise ValueError(f"inputs are not pixels u in [0, 255] normalized as "
                                 f"{scale:.6g} * u + {offset:.6g} (off by up to {error:.3g}); "
                                 "pass the uint8 pixels or inputs normalized the same way")
            return u.astype(np.uint8)
        return x

    def save_savedmodel(self, path: str) -> None:
        """Writes a TensorFlow SavedModel whose ``serving_default`` signature maps float32
        inputs ``(batch, *input_shape)`` to logits (one XLA call per batch)."""
        tf.saved_model.save(self, str(path),
                            signatures={"serving_default": self.serve.get_concrete_function()})
