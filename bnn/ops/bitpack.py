"""The one bit layout of packed ±1 values, in TensorFlow and in numpy.

A ±1 vector of length ``n`` packs into ``ceil(n / 64)`` int64 words: bit ``i % 64`` (least
significant first) of word ``i // 64`` is 1 where element ``i`` is +1 (any value >= 0) and 0
where it is -1; bits past ``n`` in the last word are 0, so they never count as a mismatch. For
two packed vectors the dot product is exact integer arithmetic,
``x . w = n - 2 * popcount(x XOR w)`` (matching bits contribute +1, mismatching ones -1).

The same layout in other word sizes is the same bytes read in smaller pieces: the int32 halves
of a 64-bit word (low half first), or 8- and 16-bit words for :func:`pack_bits`. Everything bnn
packs -- binary layers in training, ``.bnn`` files, the native kernels' operands -- uses it.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from bnn.ops.xla import compiled

__all__ = ["WORD_BITS", "words", "pack", "unpack", "pack_xla", "unpack_xla", "word_halves",
           "pack_bits", "unpack_bits"]

#: Bits per packed word.
WORD_BITS = 64
_WORD_DTYPES = {8: np.int8, 16: np.int16, 32: np.int32, 64: np.int64}


def words(n: int, word_bits: int = WORD_BITS) -> int:
    """Words that hold ``n`` bits."""
    return -(-n // word_bits)


def pack(bits: tf.Tensor, axis: int = -1, word_bits: int = WORD_BITS) -> tf.Tensor:
    """Packs a bool tensor along ``axis`` into int64 words (the axis shrinks from ``n`` to
    ``ceil(n / 64)``); with ``word_bits=32``, into the int32 halves of those words instead
    (``2 * ceil(n / 64)`` of them).

    Bits are first gathered 32 to an int32 word and pairs of those joined into int64, which XLA
    compiles into vector code several times faster than 64-bit shifts and sums.
    """
    if word_bits not in (32, WORD_BITS):
        raise ValueError(f"word_bits must be 32 or {WORD_BITS}, got {word_bits!r}")
    shape = bits.shape
    axis = axis % len(shape)
    n = int(shape[axis])
    dynamic = tf.shape(bits)
    pre = dynamic[:axis]
    post = shape[axis + 1:]
    inner = int(np.prod(post)) if post else 1
    x = tf.reshape(bits, tf.concat([[-1], [n, inner]], 0))
    pad = words(n) * WORD_BITS - n
    if pad:
        x = tf.pad(x, [[0, 0], [0, pad], [0, 0]])
    x = tf.reshape(tf.cast(x, tf.int32), [-1, 2 * words(n), 32, inner])
    shifts = tf.constant(np.arange(32, dtype=np.int32)[None, None, :, None])
    packed = tf.reduce_sum(tf.bitwise.left_shift(x, shifts), axis=2)  # (m, 2 * words, inner)
    if word_bits == WORD_BITS:
        halves = tf.reshape(tf.cast(packed, tf.int64), [-1, words(n), 2, inner])
        low = tf.bitwise.bitwise_and(halves[:, :, 0], 0xFFFFFFFF)
        packed = tf.bitwise.bitwise_or(low, tf.bitwise.left_shift(halves[:, :, 1], 32))
    count = words(n) * WORD_BITS // word_bits
    out_shape = tf.concat([pre, [count], tf.constant(list(post), tf.int32)], 0)
    return tf.reshape(packed, out_shape)


def unpack(words_: tf.Tensor, n: int, dtype: tf.DType = tf.float32, axis: int = -1) -> tf.Tensor:
    """Inverse of :func:`pack` along ``axis``: ``n`` values ±1 in ``dtype``, from int64 words or
    from their int32 halves (``pack(..., word_bits=32)``, which unpack with 32-bit arithmetic)."""
    axis = axis % len(words_.shape)
    word_bits = 32 if words_.dtype == tf.int32 else WORD_BITS
    k = int(words_.shape[axis])
    shifts = np.arange(word_bits).reshape([word_bits] + [1] * (len(words_.shape) - axis - 1))
    shifts = tf.constant(shifts, words_.dtype)
    shifted = tf.bitwise.right_shift(tf.expand_dims(words_, axis + 1), shifts)
    bits = tf.bitwise.bitwise_and(shifted, 1)
    dynamic = tf.shape(words_)
    shape = tf.concat([dynamic[:axis], [k * word_bits], dynamic[axis + 1:]], 0)
    size = [-1] * len(words_.shape)
    size[axis] = n
    bits = tf.slice(tf.reshape(bits, shape), [0] * len(size), size)
    return tf.where(bits > 0, tf.ones([], dtype), -tf.ones([], dtype))


#: :func:`pack` and :func:`unpack` as XLA computations of their own.
pack_xla = compiled(pack)
unpack_xla = compiled(unpack)


@compiled
def word_halves(words_: tf.Tensor, n: int) -> tf.Tensor:
    """Int64 words packed along axis 0, ``(words, units)``, as the int32 halves that
    ``pack(..., axis=0, word_bits=32)`` gives (a word's low half first)."""
    halves = tf.transpose(tf.bitcast(words_, tf.int32), [0, 2, 1])  # (words, 2, units)
    return tf.reshape(halves, [-1, int(words_.shape[1])])[:-(-n // 32)]


def _word_dtype(word_bits: int) -> type:
    if word_bits not in _WORD_DTYPES:
        raise ValueError(f"word_bits must be one of {sorted(_WORD_DTYPES)}, got {word_bits!r}")
    return _WORD_DTYPES[word_bits]


def pack_bits(a: np.ndarray, axis: int = -1, word_bits: int = WORD_BITS) -> np.ndarray:
    """:func:`pack` in numpy, of ``a >= 0`` for any array ``a``, into signed integer words
    (``int64`` for 64 bits, ``int32`` for 32, ``int16``, ``int8``)."""
    dtype = _word_dtype(word_bits)
    bits = np.moveaxis(np.asarray(a) >= 0, axis, -1)
    n = bits.shape[-1]
    pad = words(n, word_bits) * word_bits - n
    bits = np.pad(bits, [(0, 0)] * (bits.ndim - 1) + [(0, pad)])
    packed = np.packbits(bits, axis=-1, bitorder="little")
    packed_words = np.ascontiguousarray(packed).view(np.dtype(dtype).newbyteorder("<"))
    return np.moveaxis(packed_words.astype(dtype), -1, axis)


def unpack_bits(packed: np.ndarray, n: int, axis: int = -1,
                word_bits: int = WORD_BITS) -> np.ndarray:
    """Inverse of :func:`pack_bits`: ``n`` float32 values ±1 along ``axis``."""
    dtype = _word_dtype(word_bits)
    w = np.moveaxis(np.asarray(packed), axis, -1)
    if w.shape[-1] != words(n, word_bits):
        raise ValueError(f"{w.shape[-1]} words along axis {axis} cannot hold n={n} values of "
                         f"{word_bits} bits; expected {words(n, word_bits)} words")
    as_bytes = np.ascontiguousarray(w.astype(np.dtype(dtype).newbyteorder("<")))
    bits = np.unpackbits(as_bytes.view(np.uint8), axis=-1, bitorder="little")[..., :n]
    return np.moveaxis(np.where(bits == 1, 1.0, -1.0).astype(np.float32), -1, axis)
