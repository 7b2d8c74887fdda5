"""Exact ±1 products by xor-popcount: the matrix product and convolution that binary layers
train with, and the integer products of packed operands that packed models run.

With the bit layout of :mod:`bnn.ops.bitpack`, :func:`binary_matmul` and :func:`binary_conv2d`
compute ``x @ w`` and ``conv(x, w)`` of ±1 operands as ``n - 2 * popcount(x XOR w)`` in the
forward pass and return the ordinary float gradients, ``dy @ w^T`` and ``x^T @ dy`` (or the
convolution's), in the backward pass. The result is the float product exactly, since every
partial sum of ±1 terms is an integer far below 2**24; only the work differs (docs/speed.md).
Which kernels compute them -- one XLA computation, or bnn's native kernels -- is decided by
:mod:`bnn.native.dispatch`.
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from bnn.native import dispatch
from bnn.native.ops import Ops
from bnn.ops.bitpack import WORD_BITS, pack, unpack, unpack_xla, word_halves
from bnn.ops.gradients import custom_gradient
from bnn.ops.xla import compiled, computed_once, in_xla_context

__all__ = ["mismatches", "xor_popcount_matmul", "xor_popcount_conv2d", "binary_matmul",
           "sign_kernel_matmul", "binary_conv2d", "same_pads"]

_BLOCK_WORDS = 4


def _accumulator(n_words: int) -> tf.DType:
    """int16 (twice the SIMD width of int32) while ``n_words`` words bound the mismatch count
    below 2**15, else int32."""
    return tf.int16 if n_words * WORD_BITS < 2**15 else tf.int32


def _block_counts(x_words: tf.Tensor, w_words: tf.Tensor, dtype: tf.DType) -> list[tf.Tensor]:
    """Partial ``sum_k popcount(x[b, k] XOR w[k, u])`` over blocks of a few words (XLA compiles
    short reductions into much faster CPU loops than one long strided one)."""
    parts = []
    for start in range(0, int(w_words.shape[0]), _BLOCK_WORDS):
        xor = tf.bitwise.bitwise_xor(x_words[:, start:start + _BLOCK_WORDS, None],
                                     w_words[None, start:start + _BLOCK_WORDS, :])
        parts.append(tf.reduce_sum(tf.cast(tf.raw_ops.PopulationCount(x=xor), dtype), axis=1))
    return parts


def mismatches(x_words: tf.Tensor, w_words: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """``sum_k popcount(x[b, k] XOR w[k, u])`` in ``dtype`` for ``x`` ``(batch, words)`` and
    ``w`` ``(words, units)``."""
    parts = _block_counts(x_words, w_words, dtype)
    return sum(parts[1:], parts[0])


def xor_popcount_matmul(x_words: tf.Tensor, w_words: tf.Tensor, n: int) -> tf.Tensor:
    """Exact ±1 matrix product from packed operands: ``sign(x) @ sign(w)`` as int32.

    Args:
        x_words: ``(batch, words)`` int64, ``x`` ``(batch, n)`` packed along its last axis.
        w_words: ``(words, units)`` int64, ``w`` ``(n, units)`` packed along axis 0.
        n: the number of real bits per row (the pad bits past ``n`` must be 0 in both).

    Returns:
        ``(batch, units)`` int32, ``n - 2 * sum_k popcount(x[b, k] XOR w[k, u])``.
    """
    counts = mismatches(x_words, w_words, _accumulator(int(w_words.shape[0])))
    return n - 2 * tf.cast(counts, tf.int32)


def xor_popcount_conv2d(x_words: tf.Tensor, w_words: tf.Tensor, kernel_size: Sequence[int],
                        strides: Sequence[int], n: int) -> tf.Tensor:
    """Exact ±1 "valid" convolution from packed operands, as int32.

    Args:
        x_words: ``(batch, h, w, words)`` int64, the (already padded) input packed along
            channels.
        w_words: ``(kh * kw * words, filters)`` int64, the kernel ``(kh, kw, c, filters)``
            packed along ``c`` and flattened over its taps.
        kernel_size, strides: ``(kh, kw)`` and ``(sh, sw)``.
        n: ``kh * kw * c``, the real terms of each output.

    Returns:
        ``(batch, ho, wo, filters)`` int32. The kernel is applied one tap at a time, so no patch
        tensor is ever built.
    """
    kh, kw = kernel_size
    sh, sw = strides
    h, w, n_words = int(x_words.shape[1]), int(x_words.shape[2]), int(x_words.shape[3])
    ho, wo = (h - kh) // sh + 1, (w - kw) // sw + 1
    dtype = _accumulator(kh * kw * n_words)
    parts = []
    for i in range(kh):
        for j in range(kw):
            tap = x_words[:, i:i + (ho - 1) * sh + 1:sh, j:j + (wo - 1) * sw + 1:sw, :]
            first = (i * kw + j) * n_words
            parts += _block_counts(tf.reshape(tap, [-1, n_words]),
                                   w_words[first:first + n_words], dtype)
    counts = sum(parts[1:], parts[0])
    units = int(w_words.shape[1])
    return tf.reshape(n - 2 * tf.cast(counts, tf.int32), [-1, ho, wo, units])


@compiled
def _packed_matmul(x: tf.Tensor, w: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    n = int(w.shape[0])
    w_halves = pack(w >= 0, axis=0, word_bits=32)  # XLA computes the shared halves once
    dots = xor_popcount_matmul(pack(x >= 0, axis=-1), pack(w >= 0, axis=0), n)
    return computed_once(tf.cast(dots, x.dtype)), w_halves


def _native_matmul(native: Ops, x: tf.Tensor, w: tf.Tensor):
    """:func:`binary_matmul` on the native kernels: the forward product as a 1x1 convolution of
    one-pixel images, and a function of ``dy`` for the gradients. The operands' signs are packed
    by :meth:`bnn.native.ops.Ops.pack_signs` (``x`` along its rows, ``w`` along its columns). In
    float32 the gradients are products of ``dy`` with the operands' sign bits
    (:meth:`bnn.native.ops.Ops.sign_matmul`; ``x`` packed once more, along its columns); in
    bfloat16, the unpacked kernel's and the input's products with ``dy`` (where CPUs have
    bfloat16 dot products, such as AVX-512 BF16, TensorFlow's are faster)."""
    n, units = (int(d) for d in w.shape)
    x_words = native.pack_signs(x)
    w_words = native.pack_signs(w, along_rows=True)
    x_image = tf.reshape(x_words, [-1, 1, 1, int(x_words.shape[-1])])
    y = native.xor_popcount_conv2d(x_image, w_words, (1, 1), (1, 1), n, x.dtype)

    def gradients(dy: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        if x.dtype != tf.float32:
            return _unpacked_gradients(x, w, dy, word_halves(w_words, n))
        x_columns = native.pack_signs(x, along_rows=True, transpose_output=True)
        dw = native.sign_matmul(x_columns, dy)  # sign(x)^T @ dy
        return _signs_transposed_product(native, dy, w_words, n), tf.cast(dw, w.dtype)

    return tf.reshape(y, [-1, units]), gradients


def _signs_transposed_product(native: Ops, dy: tf.Tensor, w_words: tf.Tensor,
                              n: int) -> tf.Tensor:
    """``dy @ sign(w)^T`` by table lookup, from the words of ``w`` ``(n, units)`` packed along
    its columns (the forward product's), as ``(sign(w) @ dy^T)^T``."""
    return native.sign_matmul(w_words, dy, rows=n, transpose_f=True, transpose_output=True)


def _unpacked_gradients(x, w, dy, w_halves):
    """:func:`binary_matmul`'s gradients as float products, with ``w``'s signs unpacked from
    its int32 halves."""
    n = int(w.shape[0])
    if dy.dtype == tf.float32 or in_xla_context():
        dx = _matmul_signs_transposed(dy, w_halves, n)
    else:  # XLA's CPU products in 16-bit floats are slow; TensorFlow's (oneDNN) are not
        dx = tf.matmul(dy, unpack_xla(w_halves, n, dy.dtype, axis=0), transpose_b=True)
    return dx, tf.cast(tf.matmul(x, dy, transpose_a=True), w.dtype)


@compiled
def _matmul_signs_transposed(dy: tf.Tensor, w_halves: tf.Tensor, n: int) -> tf.Tensor:
    """``dy @ sign(w)^T``, with ``sign(w)`` unpacked from the forward pass's packed kernel, which
    reads 1/32 of the float kernel's bytes, in int32 halves (32-bit vector lanes)."""
    return tf.matmul(dy, unpack(w_halves, n, dy.dtype, axis=0), transpose_b=True)


def binary_matmul(x: tf.Tensor, w: tf.Tensor, training: bool = False) -> tf.Tensor:
    """``sign(x) @ sign(w)`` for ``x`` ``(batch, n)`` and ``w`` ``(n, units)``, exact, by
    xor-popcount (sign(0) = +1).

    The gradients are those of ``tf.matmul`` on the ±1 operands, passed straight through the
    signs: ``dy @ sign(w)^T`` for ``x`` and ``sign(x)^T @ dy`` for ``w``. So ``w`` may be the
    latent real-valued kernel itself where its straight-through mask is all ones (a kernel that
    ``WeightClip`` keeps in range), which spares a float pass over the weights; ``x`` must already
    be ±1 (its straight-through mask belongs to the input quantizer). ``w`` may be in another
    float dtype than ``x``, such as the float32 latent kernel of a layer computing in bfloat16:
    only its signs are read, and its gradient comes back in its own dtype.

    With ``training=True`` outside XLA the product runs on the native kernels where
    :func:`bnn.native.dispatch.training_ops` has them (the same integers), and in float32 so do the
    gradients: ``x`` and ``w`` are ±1, so each is a product of sign bits with a float32 matrix,
    which the kernels compute by table lookup with 8 times fewer additions than a matrix product
    has multiply-adds (:meth:`bnn.native.ops.Ops.sign_matmul`; equal to ``tf.matmul`` up to float32
    rounding).
    """
    native = dispatch.training_ops(x.dtype, in_xla_context()) if training else None

    @custom_gradient
    def op(x, w):
        if native is not None:
            return _native_matmul(native, x, w)
        y, w_halves = _packed_matmul(x, w)
        return y, lambda dy: _unpacked_gradients(x, w, dy, w_halves)

    return op(x, tf.convert_to_tensor(w))


def sign_kernel_matmul(x: tf.Tensor, w: tf.Tensor, native: Ops) -> tf.Tensor:
    """``x @ sign(w)`` for a real-valued float32 ``x`` ``(batch, n)`` (a first layer's input) and
    ``w`` ``(n, units)``, on the native kernels: ``(sign(w)^T @ x^T)^T`` by
    :meth:`bnn.native.ops.Ops.sign_matmul`, 8 times fewer additions than the float product has
    multiply-adds, equal to it up to float32 rounding. Gradients as :func:`binary_matmul`'s:
    ``dy @ sign(w)^T`` for ``x`` and ``x^T @ dy`` for ``w``, so ``w`` may be the latent kernel
    where its straight-through mask is all ones."""
    if x.dtype != tf.float32:
        raise ValueError(f"sign_kernel_matmul takes float32 inputs, got {x.dtype.name}")

    @custom_gradient
    def op(x, w):
        n = int(w.shape[0])
        w_words = native.pack_signs(w, along_rows=True)  # (words, units)
        w_rows = native.pack_signs(w, along_rows=True, transpose_output=True)  # (units, words)
        y = native.sign_matmul(w_rows, x, transpose_f=True, transpose_output=True)

        def grad(dy):
            return (_signs_transposed_product(native, dy, w_words, n),
                    tf.cast(tf.matmul(x, dy, transpose_a=True), w.dtype))

        return y, grad

    return op(x, tf.convert_to_tensor(w))


def same_pads(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """``padding="same"`` amounts (before, after) along one spatial axis, as TensorFlow and
    Keras pad: the odd one goes after."""
    total = max((-(-size // stride) - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def _conv_words(x, w, pads, pad_value):
    """The padded input packed along its channels, and the kernel packed along its input
    channels and flattened over its taps, as :func:`xor_popcount_conv2d` takes them."""
    if pads is not None:
        x = tf.pad(x, [[0, 0], pads[0], pads[1], [0, 0]], constant_values=pad_value)
    return pack(x >= 0, axis=-1), tf.reshape(pack(w >= 0, axis=2), [-1, int(w.shape[-1])])


_conv_operands = compiled(_conv_words)


@compiled
def _packed_conv2d(x, w, strides, pads, pad_value):
    kh, kw, c, _ = (int(d) for d in w.shape)
    x_words, w_words = _conv_words(x, w, pads, pad_value)
    dots = xor_popcount_conv2d(x_words, w_words, (kh, kw), strides, kh * kw * c)
    return computed_once(tf.cast(dots, x.dtype)), x_words


def _input_gradient(w, dy, x_shape, strides, padding):
    """The input's gradient for :func:`binary_conv2d`: the transposed convolution of ``dy``
    with zero padding (the padding is constant)."""
    return tf.raw_ops.Conv2DBackpropInput(input_sizes=x_shape, filter=w, out_backprop=dy,
                                          strides=[1, *strides, 1], padding=padding.upper())


def _conv2d_gradients(x_signs, w, dy, x_shape, strides, padding):
    """The float convolution's gradients for :func:`binary_conv2d`: the input's
    (:func:`_input_gradient`); the kernel's, from the padded ±1 input."""
    dw = tf.raw_ops.Conv2DBackpropFilter(input=x_signs, filter_sizes=tf.shape(w), out_backprop=dy,
                                         strides=[1, *strides, 1], padding="VALID")
    return _input_gradient(w, dy, x_shape, strides, padding), dw


@compiled
def _conv2d_gradients_xla(x_words, w, dy, x_shape, strides, padding):
    """:func:`_conv2d_gradients` as one XLA computation, the input unpacked from its words."""
    x_shape = tf.concat([tf.shape(dy)[:1], x_shape], 0)
    x_signs = unpack(x_words, int(w.shape[2]), dy.dtype)
    return _conv2d_gradients(x_signs, w, dy, x_shape, strides, padding)


@compiled
def _input_gradient_xla(w, dy, x_dims, strides, padding):
    """:func:`_input_gradient` as an XLA computation, for inputs of ``x_dims`` (height, width,
    channels)."""
    return _input_gradient(w, dy, tf.concat([tf.shape(dy)[:1], x_dims], 0), strides, padding)


def _conv2d_gradients_patches(native: Ops, x_words, w, dy, x_dims, strides, padding):
    """:func:`_conv2d_gradients` with the kernel's gradient the product of the sign bits of the
    packed input ``x_words``' patches with ``dy``, by table lookup in float32; the input's
    TensorFlow's, or XLA's on a CPU without AVX-512."""
    kh, kw, c, filters = (int(d) for d in w.shape)
    bits = native.sign_patches(x_words, (kh, kw), strides, c, tf.int64)
    dw = native.sign_matmul(bits, tf.cast(tf.reshape(dy, [-1, filters]), tf.float32))
    if dispatch.xla_convolutions_faster():
        dx = _input_gradient_xla(w, dy, x_dims, strides, padding)
    else:
        dx = _input_gradient(w, dy, tf.concat([tf.shape(dy)[:1], x_dims], 0), strides, padding)
    return dx, tf.cast(tf.reshape(dw, [kh, kw, c, filters]), w.dtype)


def binary_conv2d(x: tf.Tensor, w: tf.Tensor, strides: Sequence[int], padding: str = "valid",
                  pad_value: float = 1.0, training: bool = False) -> tf.Tensor:
    """``conv2d(x, w, strides, padding)`` for ±1 ``x`` ``(batch, h, w, c)`` and ±1 ``w``
    ``(kh, kw, c, filters)``, exact, by xor-popcount, where ``padding="same"`` pads with
    ``pad_value`` (+1 or -1, so that every operand stays ±1) instead of 0.

    The gradients are those of the float convolution of the padded input: the input's is the
    zero-padded transposed convolution (the padding is constant); the kernel's is read from the
    forward pass's packed, padded input, unpacked to ±1. Keeping only the packed words for the
    backward pass also spares XLA a transposing copy of the float activations fused with their
    producers. With ``training=True`` outside XLA the product runs on the native kernels where
    :func:`bnn.native.dispatch.training_ops` has them (the same integers).
    """
    if padding not in ("valid", "same"):
        raise ValueError(f"binary_conv2d padding must be 'valid' or 'same', got {padding!r}")
    if padding == "same" and pad_value not in (1.0, -1.0):
        raise ValueError(f"binary_conv2d pads with +1 or -1 only, got pad_value={pad_value!r}")
    strides = tuple(int(s) for s in strides)
    kh, kw = int(w.shape[0]), int(w.shape[1])
    pads = None
    if padding == "same":
        pads = (same_pads(int(x.shape[1]), kh, strides[0]),
                same_pads(int(x.shape[2]), kw, strides[1]))
        if not any(p for pair in pads for p in pair):
            pads = None
    native = dispatch.training_ops(x.dtype, in_xla_context()) if training else None

    @custom_gradient
    def op(x, w):
        def grad(dy):
            kernels_ = dispatch.conv_gradient_kernels(dy.dtype, kh * kw * int(w.shape[2]))
            if kernels_ == "xla" and not in_xla_context():
                return _conv2d_gradients_xla(x_words, w, dy, tuple(x.shape[1:]), strides, padding)
            if kernels_ == "patches" and native is not None:
                return _conv2d_gradients_patches(native, x_words, w, dy, tuple(x.shape[1:]),
                                                 strides, padding)
            x_signs = unpack_xla(x_words, int(x.shape[-1]), dy.dtype)
            return _conv2d_gradients(x_signs, w, dy, tf.shape(x), strides, padding)

        if native is None:
            y, x_words = _packed_conv2d(x, w, strides, pads, float(pad_value))
        else:
            x_words, w_words = _conv_operands(x, w, pads, float(pad_value))
            y = native.xor_popcount_conv2d(x_words, w_words, (kh, kw), strides,
                                           kh * kw * int(w.shape[2]), x.dtype)
        return y, grad

    return op(x, w)

