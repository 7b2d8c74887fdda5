"""One stage of a packed model as TensorFlow ops: the XLA kernels, and the native kernels where
they apply, computing the same integers and rounding the float logits alike."""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from bnn.native import dispatch
from bnn.ops.bitpack import pack, pack_bits, unpack_bits
from bnn.ops.xnor import same_pads, xor_popcount_conv2d, xor_popcount_matmul
from bnn.packed.fold import logit_affine

__all__ = ["Stage", "table_kernel"]


def table_kernel(w_words: np.ndarray, n: int) -> np.ndarray:
    """The ±1 kernel of packed words ``w_words`` ``(ceil(n / 64), units)`` in the layout of
    :meth:`bnn.native.ops.Ops.pixel_table_sign`: uint8 ``(blocks, groups, 32)``, ``groups =
    ceil(n / 4)``, ``blocks = 2 * ceil(units / 64)``; byte ``[u // 32, g, u % 32]`` holds bits ``4 g`` to
    ``4 g + 3`` of unit ``u``'s weights (1 for +1; bits past ``n`` and pad units 0)."""
    units = np.shape(w_words)[1]
    groups, blocks = -(-n // 4), 2 * -(-units // 64)
    bits = (unpack_bits(w_words, n, axis=0).T > 0).astype(np.uint8)  # (units, n)
    bits = np.pad(bits, [(0, blocks * 32 - units), (0, groups * 4 - n)])
    nibbles = (bits.reshape(blocks * 32, groups, 4) << np.arange(4, dtype=np.uint8)).sum(-1)
    return np.ascontiguousarray(
        nibbles.reshape(blocks, 32, groups).transpose(0, 2, 1).astype(np.uint8))


class Stage(tf.Module):
    """One exported stage (:mod:`bnn.packed.stages`): linear op, optional max-pool, batch norm,
    sign or logits."""

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
            self.kernel_table = tf.constant(table_kernel(
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
        """The logits' batch norm (and bias) as ``a * scale + shift`` (:func:`logit_affine`)."""
        self.logit_scale_np, self.logit_shift_np = logit_affine(arrays,
                                                                self.spec["bn_epsilon"])
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
        """The stage through the native kernels (:mod:`bnn.native`) where they apply: a packed
        dense stage, or an integer first stage given its uint8 pixels or float inputs encoded by
        ``encoding`` (pixel tables) or its int32 products (thresholds); ``None`` elsewhere.
        Same integers as :meth:`__call__`."""
        if self.packed_in and self.op == "dense":
            x = tf.reshape(x, [-1, int(np.prod(x.shape[1:]))])
            n = int(np.prod(self.in_shape))
            if self.output == "bits":
                return dispatch.ops().xor_popcount_sign(x, self.kernel, self.threshold, self.flip,
                                                        n)
            if self.pool:
                return self._tail_xla(n - 2 * dispatch.ops().xor_popcount(x, self.kernel))
            return dispatch.ops().xor_popcount_affine(x, self.kernel, self.logit_scale,
                                               self.logit_shift, n)
        if self.packed_in and self.op == "conv2d" and self.output == "bits":
            dots = dispatch.ops().xor_popcount_conv2d(
                self._padded_words(x), self.kernel, (self.kh, self.kw), (self.sh, self.sw),
                self.kh * self.kw * self.in_shape[-1])
            return self._bits_xla(dots)
        if self.integer_in and x.dtype != tf.int32 and self.output == "bits":
            return dispatch.ops().pixel_table_sign(x, self.kernel_table, self.threshold, self.flip,
                                            None if x.dtype == tf.uint8 else encoding)
        if self.integer_in and x.dtype == tf.int32 and self.output == "bits":
            return dispatch.ops().threshold_pack(x, self.threshold, self.flip)
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
