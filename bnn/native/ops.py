"""The native ops, one method each: thin wrappers that name the arguments, for the kernels
of one instruction-set variant (:func:`bnn.native.dispatch.ops` hands them out).

The ops are TensorFlow CPU ops from ``src/tf``, each computing with the framework-free kernels
of ``src/core``: xor-popcount products of packed rows (plain, thresholded and packed, or mapped
to logits), thresholds of int32 products, the exact first layer of 8-bit pixels, a whole packed
MLP in one call, the ±1 convolution binary layers train with, the one-pass Adam update (and
weight clip) of :class:`bnn.optimizers.Adam`, the ±1 patches of packed images, products of sign
bits with float32 matrices by table lookup, and the packing of float tensors' signs. Packed
operands follow :mod:`bnn.ops.bitpack`.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

__all__ = ["Ops"]


class Ops:
    """The native ops of one variant (see :func:`bnn.native.dispatch.ops`), looked up once: for
    code that calls them many times, such as :class:`bnn.packed.model.PackedModel` on small
    batches. Inputs are tensors or arrays of the stated dtypes."""

    def __init__(self, lib, variant: str):
        self._lib, self.variant = lib, variant

    def xor_popcount(self, x_words: tf.Tensor, w_words: tf.Tensor) -> tf.Tensor:
        """``(batch, units)`` int32 ``sum_k popcount(x[b, k] XOR w[k, u])`` for int64 words
        ``x`` ``(batch, words)`` and ``w`` ``(words, units)``."""
        return self._lib.bnn_xor_popcount(x_words, w_words, isa=self.variant)

    def xor_popcount_sign(self, x_words: tf.Tensor, w_words: tf.Tensor, threshold: tf.Tensor,
                          flip: tf.Tensor, n: int) -> tf.Tensor:
        """Packed bits ``[n - 2 * xor_popcount(x, w) >= threshold] XOR flip``, ``(batch,
        ceil(units / 64))`` int64, for ``n`` real bits per row."""
        return self._lib.bnn_xor_popcount_sign(x_words, w_words, threshold, flip, n=int(n),
                                               isa=self.variant)

    def xor_popcount_affine(self, x_words: tf.Tensor, w_words: tf.Tensor, scale: tf.Tensor,
                            shift: tf.Tensor, n: int) -> tf.Tensor:
        """float32 ``(batch, units)`` ``a * scale + shift`` for the dot products ``a = n - 2 *
        xor_popcount(x, w)``, computed in float64 and rounded once to float32 (the product is
        exact, so this is the rounding of XLA's fused multiply-add)."""
        return self._lib.bnn_xor_popcount_affine(x_words, w_words, scale, shift, n=int(n),
                                                 isa=self.variant)

    def xor_popcount_conv2d(self, x_words: tf.Tensor, w_words: tf.Tensor,
                            kernel_size: tuple[int, int], strides: tuple[int, int], n: int,
                            dtype: tf.DType = tf.float32) -> tf.Tensor:
        """The "valid" ±1 convolution ``n - 2 * mismatches`` in ``dtype`` (float32 or bfloat16),
        ``(batch, ho, wo, units)``, of ``x`` ``(batch, h, w, words)`` packed along its channels
        and a ``(kh, kw, c, units)`` kernel packed along ``c`` and flattened over its taps to
        ``(kh * kw * words, units)``, as :func:`bnn.ops.xnor.xor_popcount_conv2d` takes them."""
        (kh, kw), (sh, sw) = kernel_size, strides
        return self._lib.bnn_xor_popcount_conv2d(x_words, w_words, kh=int(kh), kw=int(kw),
                                                 sh=int(sh), sw=int(sw), n=int(n), T=dtype,
                                                 isa=self.variant)

    def adam_update(self, var, m, v, grad: tf.Tensor, alpha: tf.Tensor, beta1: tf.Tensor,
                    beta2: tf.Tensor, epsilon: tf.Tensor, clip: tf.Tensor = float("inf")):
        """One Adam step, in place, on the float32 resource variables ``var``, ``m`` and ``v``
        (TensorFlow variables or their handles) with a float32 or bfloat16 ``grad`` and the
        step's rate ``alpha = lr * sqrt(1 - beta2^t) / (1 - beta1^t)``, in TensorFlow's
        ``ApplyAdam`` expressions, ``var`` then clipped to ``[-clip, clip]``: one pass over
        memory. Returns the op (``None`` eagerly)."""
        handles = (getattr(variable, "handle", variable) for variable in (var, m, v))
        scalars = (tf.cast(value, tf.float32) for value in (alpha, beta1, beta2, epsilon, clip))
        return self._lib.bnn_adam_update(*handles, grad, *scalars)

    def sign_patches(self, x_words: tf.Tensor, kernel_size: tuple[int, int],
                     strides: tuple[int, int], channels: int, dtype: tf.DType = tf.float32
                     ) -> tf.Tensor:
        """The transposed "valid" patches (im2col) of ``x`` ``(batch, h, w, words)``, packed
        along its ``channels``, as ±1 in ``dtype`` (float32 or bfloat16): ``(kh * kw *
        channels, batch * ho * wo)``, row ``(i * kw + j) * channels + k``, column ``(b * ho + y)
        * wo + x`` holding channel ``k`` of pixel ``(b, y * sh + i, x * sw + j)``. Times the
        output gradient ``(batch * ho * wo, filters)``, the convolution's kernel gradient."""
        (kh, kw), (sh, sw) = kernel_size, strides
        return self._lib.bnn_sign_patches(x_words, kh=int(kh), kw=int(kw), sh=int(sh),
                                          sw=int(sw), c=int(channels), T=dtype,
                                          isa=self.variant)

    def sign_matmul(self, signs: tf.Tensor, f: tf.Tensor, rows: int | None = None,
                    transpose_f: bool = False, transpose_output: bool = False) -> tf.Tensor:
        """float32 ``s @ f`` for float32 ``f`` ``(q, p)`` (given as ``(p, q)`` with
        ``transpose_f``) and the ±1 matrix ``s`` ``(m, q)`` given by its sign bits, +1 where set,
        packed as :func:`bnn.ops.bitpack.pack` packs: along ``q``, int64 ``(m, ceil(q / 64))``; or,
        with ``rows=m``, along ``m``, int64 ``(ceil(m / 64), q)``. ``(p, m)`` with
        ``transpose_output``. Each output row's sum is looked up 8 rows of ``f`` at a time in
        tables of their 256 signed sums: ``q / 8`` additions per value instead of ``q``
        multiply-adds; equal to the float product up to rounding."""
        return self._lib.bnn_sign_matmul(signs, f, rows=-1 if rows is None else int(rows),
                                         transpose_signs=rows is not None,
                                         transpose_f=bool(transpose_f),
                                         transpose_output=bool(transpose_output),
                                         isa=self.variant)

    def pack_signs(self, x: tf.Tensor, along_rows: bool = False, transpose_output: bool = False
                   ) -> tf.Tensor:
        """The signs of float32 or bfloat16 ``x`` packed into int64 words as
        :func:`bnn.ops.bitpack.pack` packs ``x >= 0``: along the last axis, ``(..., n)`` ->
        ``(..., ceil(n / 64))``; with ``along_rows``, along the second-last, ``(..., r, c)`` ->
        ``(..., ceil(r / 64), c)``, or ``(..., c, ceil(r / 64))`` with ``transpose_output``.
        One pass over ``x`` (vector comparisons and their masks, 64x64 bit transposes along the
        rows)."""
        return self._lib.bnn_pack_signs(x, along_rows=bool(along_rows),
                                        transpose_output=bool(transpose_output),
                                        isa=self.variant)

    def threshold_pack(self, a: tf.Tensor, threshold: tf.Tensor, flip: tf.Tensor) -> tf.Tensor:
        """Packed bits ``[a >= threshold] XOR flip`` of int32 ``a`` ``(batch, units)``."""
        return self._lib.bnn_threshold_pack(a, threshold, flip, isa=self.variant)

    def pixel_table_sign(self, u: tf.Tensor, w_table: tf.Tensor, threshold: tf.Tensor,
                         flip: tf.Tensor, encoding: dict[str, float] | None = None
                         ) -> tf.Tensor:
        """Packed bits ``[u . w >= threshold] XOR flip`` for pixels ``u`` ``(batch, ...)`` in
        [0, 255] (each example flattened) and a ±1 kernel ``w`` given as
        :func:`bnn.packed.runtime.table_kernel`, exact. ``u`` is uint8, or float32 ``x`` with
        ``encoding`` ``{"scale": s, "offset": o}``, encoded to ``clip(round((x - o) / s), 0,
        255)``.

        With ``u . w = 2 * (u . b) - sum(u)`` for the weight bits ``b`` and ``u = 16 * h + l``
        for the pixels' nibbles, ``u . b = 16 * (h . b) + l . b``; per group of 4 pixels, the
        16 sums of their low (high) nibbles over the subsets of the group form a table that
        each unit's 4 weight bits index."""
        scale, offset = (1.0, 0.0) if encoding is None else (encoding["scale"],
                                                             encoding["offset"])
        # every attribute given: eager calls that leave one at its default cost about 18 us more
        return self._lib.bnn_pixel_table_sign(u, w_table, threshold, flip, scale=float(scale),
                                              offset=float(offset), isa=self.variant)

    def packed_dense_chain(self, u: tf.Tensor, first: tuple, hidden: Sequence[tuple],
                           last: tuple, encoding: dict[str, float] | None = None) -> tf.Tensor:
        """float32 logits of a packed MLP in one call: :meth:`pixel_table_sign` with ``first =
        (w_table, threshold, flip)``, then :meth:`xor_popcount_sign` for each ``(w_words,
        threshold, flip)`` of ``hidden`` and :meth:`xor_popcount_affine` with ``last = (w_words,
        scale, shift)``, each layer's ``n`` the units of the one before it. The same logits as
        those calls one after the other, without their dispatch between layers (on small
        batches most of the time)."""
        scale, offset = (1.0, 0.0) if encoding is None else (encoding["scale"],
                                                             encoding["offset"])
        kernels, thresholds, flips = ([layer[i] for layer in hidden] for i in range(3))
        return self._lib.bnn_packed_dense_chain(u, *first, kernels, thresholds, flips, *last,
                                                scale=float(scale), offset=float(offset),
                                                isa=self.variant)
