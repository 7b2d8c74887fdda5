"""Native kernels, through TensorFlow: against numpy, inside PackedModel, and when they cannot
be built."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from bnn import models
from bnn.native import dispatch
from bnn.errors import SettingError
from bnn.packed.export import export_model, load_packed
from bnn.errors import NativeKernelsUnavailable
from bnn.native.dispatch import EAGER_BATCH
from bnn.packed.runtime import table_kernel
from bnn.ops.bitpack import pack_bits

needs_native = pytest.mark.skipif(
    not dispatch.available(),
    reason=f"native kernels unavailable: {dispatch.unavailable_reason()}")


def adam_reference(var, m, v, grad, alpha, beta1, beta2, epsilon, clip=np.inf):
    """:meth:`bnn.native.ops.Ops.adam_update` in numpy float32, the same expressions in the same
    order."""
    f = np.float32
    var, m, v, grad = (np.asarray(a, f) for a in (var, m, v, grad))
    m = m + (grad - m) * (f(1) - f(beta1))
    v = v + (grad * grad - v) * (f(1) - f(beta2))
    var = var - (m * f(alpha)) / (np.sqrt(v) + f(epsilon))
    return np.clip(var, -f(clip), f(clip)), m, v


def _signs(rng, shape):
    return np.where(rng.random(shape) < 0.5, 1.0, -1.0)


def _flip_words(flip):
    return pack_bits(np.where(flip, 1.0, -1.0))


def _thresholds(rng, units, bound):
    """Random per-unit thresholds in [-bound, bound] and flip bits."""
    return rng.integers(-bound, bound + 1, units).astype(np.int32), rng.random(units) < 0.5


def _expected_words(values, threshold, flip):
    """numpy reference: rows of ``[values >= threshold] XOR flip`` packed to words."""
    batch, units = values.shape
    return pack_bits(np.where((values >= threshold) ^ flip, 1.0, -1.0), axis=1).reshape(
        batch, -(-units // 64))


def _variants():
    """Every kernel variant this CPU runs (on an AVX-512 machine also avx2 and generic)."""
    return dispatch.variants() if dispatch.available() else ("unavailable",)


@needs_native
@pytest.mark.parametrize("variant", _variants())
@settings(max_examples=30, deadline=None)
@given(batch=st.integers(0, 70), n=st.integers(1, 300), units=st.integers(1, 150),
       seed=st.integers(0, 2**16))
def test_kernels_equal_numpy_for_ragged_sizes(variant, batch, n, units, seed):
    rng = np.random.default_rng(seed)
    x, w = _signs(rng, (batch, n)), _signs(rng, (n, units))
    dots = (x @ w).astype(np.int32)
    threshold, flip = _thresholds(rng, units, n + 1)
    expected = _expected_words(dots, threshold, flip)
    xw, ww = pack_bits(x, axis=1).reshape(batch, -(-n // 64)), pack_bits(w, axis=0)
    mismatches = dispatch.ops(variant).xor_popcount(xw, ww).numpy()
    assert mismatches.shape == (batch, units) and mismatches.dtype == np.int32
    np.testing.assert_array_equal(n - 2 * mismatches, dots)
    np.testing.assert_array_equal(
        dispatch.ops(variant).xor_popcount_sign(xw, ww, threshold, _flip_words(flip), n).numpy(), expected)
    np.testing.assert_array_equal(
        dispatch.ops(variant).threshold_pack(dots, threshold, _flip_words(flip)).numpy(),
        expected)


@needs_native
@pytest.mark.parametrize("variant", _variants())
@pytest.mark.parametrize("batch, n, units", [
    (1, 2048, 2048),   # the MLP's hidden layers at batch 1
    (100, 2048, 2048),  # ... and at batch 100: full tiles and a row tail
    (7, 64 * 31, 72),  # exactly one block of byte counts; a partial last tile column
    (5, 64 * 33, 9),   # byte counts over more than one block (31 words); units < one tile
    (4, 64 * 62 + 1, 130),  # two full blocks and one bit more; odd word count
])
def test_kernels_equal_numpy_at_layer_sizes(variant, batch, n, units):
    rng = np.random.default_rng(batch * n + units)
    x, w = _signs(rng, (batch, n)), _signs(rng, (n, units))
    x[0] = 1.0  # one row that mismatches every -1 weight: the largest counts the bytes hold
    w[:, 0] = -1.0
    dots = (x @ w).astype(np.int32)
    threshold, flip = _thresholds(rng, units, 60)
    xw, ww = pack_bits(x, axis=1), pack_bits(w, axis=0)
    np.testing.assert_array_equal(n - 2 * dispatch.ops(variant).xor_popcount(xw, ww).numpy(),
                                  dots)
    np.testing.assert_array_equal(
        dispatch.ops(variant).xor_popcount_sign(xw, ww, threshold, _flip_words(flip), n).numpy(),
        _expected_words(dots, threshold, flip))
    scale, shift = (rng.normal(0, 0.1, units).astype(np.float32) for _ in range(2))
    logits = (dots * scale.astype(np.float64) + shift.astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal(  # float64 products are exact: one rounding, bit for bit
        dispatch.ops(variant).xor_popcount_affine(xw, ww, scale, shift, n).numpy(), logits)


@needs_native
@pytest.mark.parametrize("variant", _variants())
@settings(max_examples=30, deadline=None)
@given(batch=st.integers(0, 20), n=st.integers(1, 300), units=st.integers(1, 150),
       seed=st.integers(0, 2**16), zeros=st.sampled_from([0.0, 0.5, 0.9, 1.0]))
def test_pixel_table_kernel_equals_numpy_integer_products(variant, batch, n, units, seed, zeros):
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (batch, n)).astype(np.uint8)
    pixels[rng.random((batch, n)) < zeros] = 0  # the kernel skips groups of 4 zero pixels
    w = _signs(rng, (n, units))
    z = pixels.astype(np.int64) @ w.astype(np.int64)
    threshold, flip = _thresholds(rng, units, 255 * n // 8)
    expected = _expected_words(z, threshold, flip)
    args = (table_kernel(pack_bits(w, axis=0), n), threshold, _flip_words(flip))
    np.testing.assert_array_equal(
        dispatch.ops(variant).pixel_table_sign(pixels, *args).numpy(), expected)
    scale, offset = 1 / 127.5, -1.0  # float inputs on the pixel grid encode back to the pixels
    x = (pixels.astype(np.float32) * np.float32(scale) + np.float32(offset)).reshape(
        batch, 1, n, 1)
    np.testing.assert_array_equal(
        dispatch.ops(variant).pixel_table_sign(x, *args, encoding={"scale": scale, "offset": offset}).numpy(),
        expected)


@needs_native
@pytest.mark.parametrize("variant", _variants())
@pytest.mark.parametrize("n", [784, 4 * 33 + 1])  # the MNIST layer; 33 groups: a partial round
def test_pixel_table_kernel_is_exact_at_the_extremes(variant, n):
    rng = np.random.default_rng(n)
    pixels = rng.integers(0, 256, (4, n)).astype(np.uint8)
    pixels[0], pixels[1] = 255, 0  # every nibble 15 (the largest table sums); none
    w = _signs(rng, (n, 2048))
    w[:, 0], w[:, 1] = 1.0, -1.0  # the largest and smallest products
    z = pixels.astype(np.int64) @ w.astype(np.int64)
    threshold, flip = _thresholds(rng, 2048, 255 * n)
    threshold[:2] = z[0, :2]  # the extreme products sit exactly on their thresholds
    np.testing.assert_array_equal(
        dispatch.ops(variant).pixel_table_sign(pixels, table_kernel(pack_bits(w, axis=0), n),
                                 threshold, _flip_words(flip)).numpy(),
        _expected_words(z, threshold, flip))


@needs_native
@pytest.mark.parametrize("variant", _variants())
def test_pixel_table_kernel_skips_zero_groups_exactly(variant):
    """MNIST-like images: a zero border, zero runs inside, every example a different pattern."""
    rng = np.random.default_rng(7)
    images = rng.integers(1, 256, (6, 28, 28)).astype(np.uint8)
    images[:, :4], images[:, -4:], images[:, :, :5], images[:, :, -3:] = 0, 0, 0, 0
    images[1, 10:12] = 0
    images[2] = 0
    images[3, :, 4:8] = 0
    images[4, 4:24, 5:25] = np.where(rng.random((20, 20)) < 0.7, 0, images[4, 4:24, 5:25])
    pixels = images.reshape(6, 784)
    w = _signs(rng, (784, 130))
    z = pixels.astype(np.int64) @ w.astype(np.int64)
    threshold, flip = _thresholds(rng, 130, 255 * 784 // 8)
    threshold[:5] = z[0, :5]  # some products sit exactly on their thresholds
    np.testing.assert_array_equal(
        dispatch.ops(variant).pixel_table_sign(pixels, table_kernel(pack_bits(w, axis=0), 784),
                                 threshold, _flip_words(flip)).numpy(),
        _expected_words(z, threshold, flip))


def test_table_kernel_layout_holds_four_weight_bits_per_byte():
    w = -np.ones((9, 70))
    w[5, 33] = 1.0   # input 5: group 1, bit 1 of unit 33 (block 1, column 1)
    w[8, 69] = 1.0   # input 8: group 2, bit 0 of unit 69 (block 2, column 5)
    table = table_kernel(pack_bits(w, axis=0), 9)
    assert table.shape == (4, 3, 32) and table.dtype == np.uint8  # 2 words of 64 units: 4 blocks
    expected = np.zeros((4, 3, 32), np.uint8)
    expected[1, 1, 1] = 0b10
    expected[2, 2, 5] = 0b01
    np.testing.assert_array_equal(table, expected)


def _conv_reference(x, w, strides):
    """numpy "valid" convolution of ±1 ``x`` (batch, h, w, c) and ``w`` (kh, kw, c, f)."""
    kh, kw, _, _ = w.shape
    sh, sw = strides
    ho = max(0, (x.shape[1] - kh) // sh + 1)  # an input smaller than the kernel: no positions
    wo = max(0, (x.shape[2] - kw) // sw + 1)
    out = np.zeros((x.shape[0], ho, wo, w.shape[3]))
    for i in range(ho):
        for j in range(wo):
            patch = x[:, i * sh:i * sh + kh, j * sw:j * sw + kw]
            out[:, i, j] = np.einsum("bhwc,hwcf->bf", patch, w)
    return out


def _conv_words(x, w):
    """``x`` packed along channels, ``w`` packed along its input channels and flattened over
    its taps, as BnnXorPopcountConv2d takes them."""
    b, h, wd, c = x.shape
    kh, kw, _, f = w.shape
    words = -(-c // 64)
    xw = pack_bits(x.reshape(-1, c), axis=1).reshape(b, h, wd, words)
    ww = pack_bits(w.transpose(3, 0, 1, 2).reshape(-1, c), axis=1).reshape(f, kh * kw * words)
    return xw, np.ascontiguousarray(ww.T)


@needs_native
@pytest.mark.parametrize("variant", _variants())
@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
@settings(max_examples=15, deadline=None)
@given(batch=st.integers(0, 4), size=st.integers(1, 9), c=st.integers(1, 140),
       f=st.integers(1, 130), kernel=st.sampled_from([(1, 1), (3, 3), (2, 3)]),
       strides=st.sampled_from([(1, 1), (2, 2), (1, 2)]), seed=st.integers(0, 2**16))
def test_conv_kernel_equals_numpy_convolution(variant, dtype, batch, size, c, f, kernel, strides,
                                              seed):
    rng = np.random.default_rng(seed)
    x, w = _signs(rng, (batch, size, size + 1, c)), _signs(rng, (*kernel, c, f))
    xw, ww = _conv_words(x, w)
    y = dispatch.ops(variant).xor_popcount_conv2d(xw, ww, kernel, strides,
                                                 kernel[0] * kernel[1] * c, dtype)
    expected = _conv_reference(x, w, strides)
    assert y.dtype == dtype and tuple(y.shape) == expected.shape
    # bfloat16 holds integers up to 256 exactly and rounds larger ones to nearest even
    want = tf.cast(tf.constant(expected, tf.float32), dtype).numpy().astype(np.float32)
    np.testing.assert_array_equal(y.numpy().astype(np.float32), want)


def _patches_reference(x, kernel, strides):
    """numpy's transposed "valid" patches (im2col) of ``x`` (batch, h, w, c)."""
    (kh, kw), (sh, sw), c = kernel, strides, x.shape[-1]
    ho, wo = (x.shape[1] - kh) // sh + 1, (x.shape[2] - kw) // sw + 1
    taps = [x[:, i:i + (ho - 1) * sh + 1:sh, j:j + (wo - 1) * sw + 1:sw].reshape(-1, c)
            for i in range(kh) for j in range(kw)]
    return np.concatenate(taps, axis=1).T


@needs_native
@pytest.mark.parametrize("variant", _variants())
@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16, tf.int64])
@settings(max_examples=15, deadline=None)
@given(batch=st.integers(0, 3), h=st.integers(3, 9), w=st.integers(3, 140),
       c=st.integers(1, 140), kernel=st.sampled_from([(1, 1), (3, 3), (2, 3)]),
       strides=st.sampled_from([(1, 1), (2, 2), (1, 3)]), seed=st.integers(0, 2**16))
def test_sign_patches_equal_numpy_im2col(variant, dtype, batch, h, w, c, kernel, strides, seed):
    """Images up to 140 pixels wide: plane rows of three words, and runs across word edges;
    int64: the rows packed to words, zero past the last column."""
    x = _signs(np.random.default_rng(seed), (batch, h, w, c))
    words = pack_bits(x.reshape(-1, c), axis=1).reshape(batch, h, w, -(-c // 64))
    patches = dispatch.ops(variant).sign_patches(words, kernel, strides, c, dtype)
    expected = _patches_reference(x, kernel, strides)
    if dtype == tf.int64:
        expected = (pack_bits(expected, axis=1).reshape(len(expected), -1) if expected.size
                    else np.zeros((len(expected), 0), np.int64))
    assert patches.dtype == dtype and tuple(patches.shape) == expected.shape
    np.testing.assert_array_equal(patches.numpy().astype(expected.dtype), expected)


@needs_native
@pytest.mark.parametrize("variant", _variants())
@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
def test_sign_patches_written_past_the_caches_equal_numpy(variant, dtype):
    """Patches of 8 MiB or more whose rows fill whole cache lines take streaming stores; the
    second shape's rows do not."""
    rng = np.random.default_rng(5)
    for shape in [(8, 34, 34, 128), (7, 33, 35, 100)]:
        x = _signs(rng, shape)
        words = pack_bits(x.reshape(-1, shape[-1]), axis=1).reshape(*shape[:3], -1)
        patches = dispatch.ops(variant).sign_patches(words, (3, 3), (1, 1), shape[-1], dtype)
        assert patches.shape[0] * patches.shape[1] * dtype.size >= 8 << 20
        np.testing.assert_array_equal(patches.numpy().astype(np.float64),
                                      _patches_reference(x, (3, 3), (1, 1)))


@needs_native
def test_sign_patches_times_dy_is_the_kernel_gradient():
    rng = np.random.default_rng(3)
    x, dy = _signs(rng, (2, 10, 12, 70)), rng.integers(-4, 5, (2, 8, 5, 6)).astype(np.float32)
    words = pack_bits(x.reshape(-1, 70), axis=1).reshape(2, 10, 12, 2)
    patches = dispatch.ops().sign_patches(words, (3, 4), (1, 2), 70, tf.float32)
    expected = tf.raw_ops.Conv2DBackpropFilter(
        input=tf.constant(x, tf.float32), filter_sizes=[3, 4, 70, 6], out_backprop=dy,
        strides=[1, 1, 2, 1], padding="VALID")
    np.testing.assert_array_equal((patches @ dy.reshape(-1, 6)).numpy().reshape(3, 4, 70, 6),
                                  expected.numpy())


@needs_native
@pytest.mark.parametrize("shape, channels, kernel, message", [
    ((1, 4, 4, 2), 64, (3, 3), "c = 64 channels take 1 words, got 2"),
    ((1, 2, 4, 1), 64, (3, 3), "a 3x3 kernel does not fit a 2x4 image"),
])
def test_sign_patches_reject_inconsistent_shapes(shape, channels, kernel, message):
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        dispatch.ops().sign_patches(np.zeros(shape, np.int64), kernel, (1, 1), channels)


def _sign_matmul_case(rng, m, q, p, along_m):
    """±1 ``s`` (m, q), integer ``f`` (q, p) (every sum exact), and ``s`` packed along q, or
    along m (``rows=m``)."""
    s = _signs(rng, (m, q))
    f = rng.integers(-8, 9, (q, p)).astype(np.float32)
    signs = (pack_bits(s.T, axis=1).reshape(q, -1).T.copy() if along_m
             else pack_bits(s, axis=1).reshape(m, -1))
    return s, f, signs


@needs_native
@pytest.mark.parametrize("variant", _variants())
@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 140), q=st.integers(1, 300), p=st.integers(1, 300),
       along_m=st.booleans(), transpose_f=st.booleans(), transpose_output=st.booleans(),
       seed=st.integers(0, 2**16))
def test_sign_matmul_equals_numpy(variant, m, q, p, along_m, transpose_f, transpose_output,
                                  seed):
    """Ragged sizes: partial byte groups and column blocks, one to ten blocks (split by blocks
    or by byte groups), signs packed either way."""
    s, f, signs = _sign_matmul_case(np.random.default_rng(seed), m, q, p, along_m)
    got = dispatch.ops(variant).sign_matmul(signs, f.T.copy() if transpose_f else f,
                                           rows=m if along_m else None, transpose_f=transpose_f,
                                           transpose_output=transpose_output)
    expected = s @ f
    np.testing.assert_array_equal(got.numpy(), expected.T if transpose_output else expected)


@needs_native
@pytest.mark.parametrize("variant", _variants())
def test_sign_matmul_of_real_values_is_the_product_up_to_rounding(variant):
    """A binary dense layer's gradient shapes: 2048 sums of normal values."""
    rng = np.random.default_rng(21)
    s = _signs(rng, (300, 2048))
    f = rng.normal(0, 1, (2048, 100)).astype(np.float32)
    got = dispatch.ops(variant).sign_matmul(pack_bits(s, axis=1).reshape(300, -1), f)
    # float32 rounding of sums of magnitude ~45 (1.2e-4 on two threads); a wrong sign costs 2|f|
    np.testing.assert_allclose(got.numpy(), s @ f.astype(np.float64), rtol=0, atol=5e-4)


@needs_native
@pytest.mark.parametrize("shape, f_shape, rows, message", [
    ((3, 1), (65, 4), None, "f has 65 rows, whose signs take 2 words per row; signs have 1"),
    ((1, 5), (4, 2), 65, r"signs of 65 rows by 4 packed along the rows take \(2, 4\) words"),
])
def test_sign_matmul_rejects_inconsistent_shapes(shape, f_shape, rows, message):
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        dispatch.ops().sign_matmul(np.zeros(shape, np.int64), np.zeros(f_shape, np.float32),
                                  rows=rows)


@needs_native
def test_sign_matmul_with_no_terms_is_zero():
    got = dispatch.ops().sign_matmul(np.zeros((3, 0), np.int64), np.zeros((0, 5), np.float32))
    np.testing.assert_array_equal(got.numpy(), np.zeros((3, 5)))


def _packed_signs(x, along_rows, transpose_output):
    """numpy reference of :meth:`bnn.native.ops.Ops.pack_signs`: ``x >= 0`` packed as
    ``pack_bits`` packs, along the last axis or the second-last."""
    signs = np.where(np.asarray(x, np.float32) >= 0, 1.0, -1.0)
    if not along_rows:
        return pack_bits(signs.reshape(-1, signs.shape[-1]), axis=1).reshape(
            *signs.shape[:-1], -1)
    columns = np.swapaxes(signs, -1, -2)  # (..., c, r)
    words = pack_bits(columns.reshape(-1, columns.shape[-1]), axis=1).reshape(
        *columns.shape[:-1], -1)  # (..., c, words)
    return words if transpose_output else np.swapaxes(words, -1, -2)


@needs_native
@pytest.mark.parametrize("variant", _variants())
@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
@settings(max_examples=25, deadline=None)
@given(outer=st.lists(st.integers(1, 3), max_size=2), rows=st.integers(1, 150),
       cols=st.integers(1, 200), along_rows=st.booleans(), transpose_output=st.booleans(),
       specials=st.integers(0, 3), seed=st.integers(0, 2**16))
def test_pack_signs_equals_numpy(variant, dtype, outer, rows, cols, along_rows, transpose_output,
                                 specials, seed):
    """Ragged tiles and words, leading axes, and -0.0 (+1), +0.0 (+1) and NaN (-1) among the
    values."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 1, (*outer, rows, cols)).astype(np.float32)
    flat = x.reshape(-1)
    flat[rng.integers(0, flat.size, specials)] = [-0.0, 0.0, np.nan][:specials]
    got = dispatch.ops(variant).pack_signs(tf.cast(x, dtype), along_rows=along_rows,
                                          transpose_output=transpose_output)
    np.testing.assert_array_equal(got.numpy(), _packed_signs(x, along_rows,
                                                             along_rows and transpose_output))


@needs_native
@pytest.mark.parametrize("variant", _variants())
@pytest.mark.parametrize("shape", [(70, 2100), (2, 130, 1025)])
def test_pack_signs_along_the_rows_of_wide_matrices(variant, shape):
    """Rows wider than one task's chunk of columns (1024): whole and partial chunks."""
    x = np.random.default_rng(7).normal(0, 1, shape).astype(np.float32)
    for transpose_output in (False, True):
        got = dispatch.ops(variant).pack_signs(x, along_rows=True,
                                              transpose_output=transpose_output)
        np.testing.assert_array_equal(got.numpy(), _packed_signs(x, True, transpose_output))


@needs_native
def test_pack_signs_of_an_empty_batch_is_empty():
    got = dispatch.ops().pack_signs(np.zeros((0, 130), np.float32), along_rows=True,
                                   transpose_output=True)
    assert got.shape == (130, 0)


@needs_native
@pytest.mark.parametrize("shape, along_rows, message", [
    ((), False, "rank >= 1, got \\[\\]"), ((5,), True, "along the rows needs a tensor of rank >= 2"),
])
def test_pack_signs_rejects_too_few_axes(shape, along_rows, message):
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=message):
        dispatch.ops().pack_signs(tf.zeros(shape), along_rows=along_rows)


@needs_native
@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
@settings(max_examples=10, deadline=None)
@given(shape=st.sampled_from([(1,), (7,), (3, 37), (130, 70)]), step=st.integers(1, 50),
       clip=st.sampled_from([0.05, 1.0, float("inf")]), seed=st.integers(0, 2**16))
def test_adam_update_equals_numpy_and_tensorflows_adam_then_clip(dtype, shape, step, clip, seed):
    rng = np.random.default_rng(seed)
    var, m, grad = (rng.normal(0, 0.1, shape).astype(np.float32) for _ in range(3))
    v = (rng.random(shape) * 0.01).astype(np.float32)
    grad = tf.cast(grad, dtype)  # the bfloat16 case widens exactly what it holds
    b1, b2, eps, lr = 0.9, 0.999, 1e-7, 0.05
    powers = [np.float32(b) ** np.float32(step) for b in (b1, b2)]
    alpha = tf.constant(lr, tf.float32) * tf.sqrt(1 - powers[1]) / (1 - powers[0])
    ours = [tf.Variable(a) for a in (var, m, v)]
    dispatch.ops().adam_update(*ours, grad, alpha, b1, b2, eps, clip)
    expected = adam_reference(var, m, v, tf.cast(grad, tf.float32).numpy(),
                                      alpha.numpy(), b1, b2, eps, clip)
    for got, want in zip(ours, expected):
        np.testing.assert_array_equal(got.numpy(), want)
    theirs = [tf.Variable(a) for a in (var, m, v)]
    tf.raw_ops.ResourceApplyAdam(var=theirs[0].handle, m=theirs[1].handle, v=theirs[2].handle,
                                 beta1_power=powers[0], beta2_power=powers[1], lr=lr, beta1=b1,
                                 beta2=b2, epsilon=eps, grad=tf.cast(grad, tf.float32))
    theirs[0].assign(tf.clip_by_value(theirs[0], -clip, clip))
    for got, want in zip(ours, theirs):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    if clip == 0.05 and len(shape) == 2:  # the clip was exercised
        assert np.abs(ours[0].numpy()).max() == np.float32(0.05)


@needs_native
def test_adam_update_keeps_an_earlier_read_of_the_variable():
    var = tf.Variable(np.ones(5, np.float32))
    m, v = tf.Variable(np.zeros(5, np.float32)), tf.Variable(np.zeros(5, np.float32))

    @tf.function
    def step():
        before = var.read_value()
        with tf.control_dependencies([before]):
            dispatch.ops().adam_update(var, m, v, tf.ones(5), 0.5, 0.9, 0.999, 1e-7, 10.0)
        with tf.control_dependencies([var.read_value()]):
            return tf.identity(before)

    np.testing.assert_array_equal(step().numpy(), np.ones(5, np.float32))
    assert np.all(var.numpy() < 1)


@needs_native
def test_adam_update_rejects_mismatched_shapes():
    var, m, v = (tf.Variable(np.zeros(4, np.float32)) for _ in range(3))
    with pytest.raises(tf.errors.InvalidArgumentError, match="one shape"):
        dispatch.ops().adam_update(var, m, v, tf.zeros(5), 0.1, 0.9, 0.999, 1e-7)


@needs_native
def test_conv_kernel_rejects_a_kernel_of_the_wrong_depth():
    with pytest.raises(tf.errors.InvalidArgumentError, match="needs 9 rows of w, got 8"):
        dispatch.ops().xor_popcount_conv2d(np.zeros((1, 4, 4, 1), np.int64),
                                          np.zeros((8, 3), np.int64), (3, 3), (1, 1), 27)


def _chain_layers(rng, widths):
    """Random ±1 layers between ``widths`` (pixels first), as numpy references and as the
    packed arguments of ``Ops.packed_dense_chain``: thresholds and flips for every layer but
    the last, the last a scale and shift."""
    weights = [_signs(rng, (n, units)) for n, units in zip(widths, widths[1:])]
    thresholds = [_thresholds(rng, units, bound) for units, bound in zip(
        widths[1:-1], [255 * widths[0] // 8, *widths[1:-2]])]
    scale, shift = (rng.normal(0, 0.1, widths[-1]).astype(np.float32) for _ in range(2))
    first = (table_kernel(pack_bits(weights[0], axis=0), widths[0]), thresholds[0][0],
             _flip_words(thresholds[0][1]))
    hidden = [(pack_bits(w, axis=0), t, _flip_words(f))
              for w, (t, f) in zip(weights[1:-1], thresholds[1:])]
    last = (pack_bits(weights[-1], axis=0), scale, shift)
    return weights, thresholds, (scale, shift), (first, hidden, last)


@needs_native
@pytest.mark.parametrize("variant", _variants())
@settings(max_examples=25, deadline=None)
@given(batch=st.integers(0, 45), widths=st.lists(st.integers(1, 150), min_size=3, max_size=6),
       seed=st.integers(0, 2**16))
def test_packed_dense_chain_equals_numpy_layer_by_layer(variant, batch, widths, seed):
    rng = np.random.default_rng(seed)
    weights, thresholds, (scale, shift), args = _chain_layers(rng, widths)
    pixels = rng.integers(0, 256, (batch, widths[0])).astype(np.uint8)
    a = pixels.astype(np.int64)
    for w, (threshold, flip) in zip(weights, thresholds):  # numpy: every layer's ±1 output
        a = np.where(((a @ w.astype(np.int64)) >= threshold) ^ flip, 1, -1)
    dots = (a @ weights[-1].astype(np.int64)).astype(np.float64)
    expected = (dots * scale.astype(np.float64) + shift.astype(np.float64)).astype(np.float32)
    ops = dispatch.ops(variant)
    logits = ops.packed_dense_chain(pixels, *args).numpy()
    assert logits.shape == (batch, widths[-1]) and logits.dtype == np.float32
    np.testing.assert_array_equal(logits, expected)  # exact integers, one rounding
    scale_in, offset = 1 / 127.5, -1.0  # float inputs on the pixel grid encode to the pixels
    x = (pixels.astype(np.float32) * np.float32(scale_in) + np.float32(offset)).reshape(
        batch, widths[0], 1)
    np.testing.assert_array_equal(ops.packed_dense_chain(
        x, *args, encoding={"scale": scale_in, "offset": offset}).numpy(), expected)


@needs_native
@pytest.mark.parametrize("variant", _variants())
def test_packed_dense_chain_equals_the_ops_one_after_the_other(variant):
    rng = np.random.default_rng(7)
    widths = [784, 2048, 2048, 2048, 10]  # the BinaryNet MLP, batch 1 and a row tail
    _, _, _, (first, hidden, last) = _chain_layers(rng, widths)
    ops = dispatch.ops(variant)
    for batch in (1, 37):
        pixels = rng.integers(0, 256, (batch, 28, 28, 1)).astype(np.uint8)
        words = ops.pixel_table_sign(pixels, *first)
        for layer, n in zip(hidden, widths[1:]):
            words = ops.xor_popcount_sign(words, *layer, n)
        expected = ops.xor_popcount_affine(words, *last, widths[-2]).numpy()
        np.testing.assert_array_equal(
            ops.packed_dense_chain(pixels, first, hidden, last).numpy(), expected)


@needs_native
@pytest.mark.parametrize("layer, replacement, message", [
    ("hidden", lambda h: [(h[0][0][:-1], *h[0][1:])], "kernels[0] must have 1 rows of words "
                                                      "for 40 inputs, got [0,30]"),
    ("hidden", lambda h: [(h[0][0], h[0][1][:-1], h[0][2])], "threshold must have shape (30)"),
    ("last", lambda last: (last[0][:, :2], *last[1:]), "scale must have shape (2)"),
    ("last", lambda last: (np.zeros((2, 3), np.int64), *last[1:]), "w must have 1 rows"),
])
def test_packed_dense_chain_rejects_inconsistent_layers(layer, replacement, message):
    rng = np.random.default_rng(1)
    _, _, _, (first, hidden, last) = _chain_layers(rng, [20, 40, 30, 3])
    args = {"first": first, "hidden": hidden, "last": last}
    args[layer] = replacement(args[layer])
    with pytest.raises(tf.errors.InvalidArgumentError, match=message.replace(
            "(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")):
        dispatch.ops().packed_dense_chain(np.zeros((2, 20), np.uint8), **args)


@needs_native
def test_kernels_run_inside_a_tf_function_with_unknown_batch():
    rng = np.random.default_rng(0)
    w = pack_bits(_signs(rng, (128, 64)), axis=0)
    fn = tf.function(lambda x: dispatch.ops().xor_popcount(x, w),
                     input_signature=[tf.TensorSpec([None, 2], tf.int64)])
    assert fn.get_concrete_function().output_shapes.as_list() == [None, 64]
    x = pack_bits(_signs(rng, (5, 128)), axis=1)
    np.testing.assert_array_equal(fn(x).numpy(), dispatch.ops().xor_popcount(x, w).numpy())


@needs_native
@pytest.mark.parametrize("call, message", [
    (lambda: dispatch.ops().xor_popcount(np.zeros((2, 3), np.int64), np.zeros((4, 5), np.int64)),
     "3 words per row but w has 4"),
    (lambda: dispatch.ops().xor_popcount_sign(np.zeros((2, 1), np.int64), np.zeros((1, 5), np.int64),
                                       np.zeros(4, np.int32), np.zeros(1, np.int64), 64),
     "threshold must have shape (5)"),
    (lambda: dispatch.ops().threshold_pack(np.zeros((2, 70), np.int32), np.zeros(70, np.int32),
                                    np.zeros(1, np.int64)), "flip must have shape (2)"),
])
def test_kernels_reject_inconsistent_shapes(call, message):
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=message.replace(
            "(", r"\(").replace(")", r"\)")):
        call()


@pytest.fixture
def fresh_state(monkeypatch):
    """Native kernels not yet resolved for any setting (restored afterwards)."""
    monkeypatch.setattr(dispatch, "_native_by_setting", {})
    return monkeypatch


@needs_native
def test_kernels_first_asked_while_tracing_build_and_check_eagerly(fresh_state):
    traced = tf.function(lambda: tf.constant(dispatch.available()))
    assert bool(traced().numpy())
    assert dispatch.unavailable_reason() is None


def test_disabled_by_environment_gives_a_reason_and_packed_model_falls_back(fresh_state,
                                                                          tmp_path):
    model = models.build("binarynet_mlp", hidden_units=(70,), input_shape=(6,))
    export_model(model, tmp_path / "m.bnn")
    fresh_state.setenv("BNN_NATIVE_KERNELS", "0")
    assert not dispatch.available()
    assert dispatch.unavailable_reason() == "disabled by BNN_NATIVE_KERNELS"
    packed = load_packed(tmp_path / "m.bnn")
    assert packed.native is False
    x = np.random.default_rng(1).normal(size=(20, 6)).astype(np.float32)
    np.testing.assert_allclose(packed(x).numpy(), model(x, training=False).numpy(),
                               rtol=1e-5, atol=1e-4)
    with pytest.raises(NativeKernelsUnavailable, match="disabled by BNN_NATIVE_KERNELS"):
        load_packed(tmp_path / "m.bnn", native=True)


@pytest.mark.parametrize("chosen, machine_is_x86, setting, expected", [
    ("avx512", True, None, True),
    ("avx2", True, None, True),
    ("generic", True, None, False),
    ("generic", True, "1", True),
    ("generic", True, "generic", True),
    ("generic", False, None, True),
], ids=["avx512", "avx2", "x86 without avx2", "x86 without avx2, forced",
        "generic forced by name", "not x86"])
def test_native_kernels_are_preferred_only_where_they_beat_xla(monkeypatch, chosen,
                                                               machine_is_x86, setting,
                                                               expected):
    monkeypatch.setattr(dispatch, "_native",
                        lambda: dispatch._Native(object(), chosen, (chosen,)))
    monkeypatch.setattr(dispatch, "is_x86", lambda: machine_is_x86)
    if setting is None:
        monkeypatch.delenv("BNN_NATIVE_KERNELS", raising=False)
    else:
        monkeypatch.setenv("BNN_NATIVE_KERNELS", setting)
    assert dispatch.preferred() is expected


@pytest.mark.parametrize("value, read", [
    (None, "auto"), ("auto", "auto"), (" AUTO ", "auto"), ("0", "off"), ("off", "off"),
    ("1", "on"), ("yes", "on"), ("avx2", "avx2"), ("AVX512", "avx512"), ("generic", "generic"),
])
def test_kernel_setting_reads_every_documented_value(monkeypatch, value, read):
    if value is None:
        monkeypatch.delenv("BNN_NATIVE_KERNELS", raising=False)
    else:
        monkeypatch.setenv("BNN_NATIVE_KERNELS", value)
    assert dispatch.setting() == read


@pytest.mark.parametrize("value", ["sse", "2", "avx-2"])
def test_an_unreadable_kernel_setting_is_a_one_line_error(fresh_state, tmp_path, value):
    fresh_state.setenv("BNN_NATIVE_KERNELS", value)
    with pytest.raises(SettingError, match="BNN_NATIVE_KERNELS must be auto, 0, 1, generic, "
                                           "avx2, avx512") as error:
        dispatch.available()
    assert "\n" not in str(error.value) and repr(value) in str(error.value)
    model = models.build("binarynet_mlp", hidden_units=(8,), input_shape=(6,))
    export_model(model, tmp_path / "m.bnn")
    with pytest.raises(SettingError, match="^BNN_NATIVE_KERNELS must be"):
        load_packed(tmp_path / "m.bnn")


def test_a_failing_compiler_is_reported_not_raised(fresh_state, tmp_path):
    fresh_state.setenv("BNN_NATIVE_KERNELS", "1")
    fresh_state.setenv("BNN_CACHE_DIR", str(tmp_path))
    fresh_state.setenv("CXX", "false")  # a "compiler" that always fails
    assert not dispatch.available()
    assert dispatch.unavailable_reason().startswith("compiling the native kernels in ")
    assert " failed" in dispatch.unavailable_reason()
    assert list(tmp_path.iterdir()) == []  # nothing half-written is left behind


@needs_native
def test_build_is_cached_and_reused_by_later_processes(tmp_path):
    env = {**os.environ, "BNN_CACHE_DIR": str(tmp_path), "TF_CPP_MIN_LOG_LEVEL": "3"}
    probe = [sys.executable, "-c",
             "from bnn.native import dispatch; print(dispatch.available())"]
    first = subprocess.run(probe, env=env, capture_output=True, text=True, timeout=600)
    assert first.stdout.split()[-1] == "True", first.stderr[-2000:]
    built = list(tmp_path.glob("kernels-*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    second = subprocess.run(probe, env=env, capture_output=True, text=True, timeout=600)
    assert second.stdout.split()[-1] == "True", second.stderr[-2000:]
    assert [p.stat().st_mtime_ns for p in tmp_path.glob("kernels-*.so")] == [stamp]


@needs_native
@pytest.mark.parametrize("forced", _variants())
@pytest.mark.parametrize("encoding", [None, (1 / 127.5, -1.0)])
def test_native_and_xla_paths_give_identical_logits(fresh_state, tmp_path, encoding, forced):
    fresh_state.setenv("BNN_NATIVE_KERNELS", forced)
    assert dispatch.variant() == forced and dispatch.preferred()
    rng = np.random.default_rng(3)
    model = models.build("binarynet_mlp", hidden_units=(96, 70), input_shape=(28, 28, 1))
    for layer in model.layers:
        if hasattr(layer, "moving_mean"):
            layer.moving_mean.assign(rng.normal(0, 3, layer.moving_mean.shape))
    export_model(model, tmp_path / "m.bnn", input_encoding=encoding)
    native = load_packed(tmp_path / "m.bnn", native=True)
    xla = load_packed(tmp_path / "m.bnn", native=False)
    assert native.native and not xla.native
    pixels = rng.integers(0, 256, (45, 28, 28, 1)).astype(np.uint8)
    x = (pixels * np.float32(1 / 127.5) - 1.0).astype(np.float32)
    np.testing.assert_array_equal(native(x).numpy(), xla(x).numpy())
    many = rng.integers(0, 256, (EAGER_BATCH + 6, 28, 28, 1)).astype(np.float32) / 127.5 - 1.0
    eager_calls = []
    eager = native._eager
    native._eager = lambda v: eager_calls.append(len(v)) or eager(v)
    # the eager chain, or one native graph where the first layer takes the int8 product
    np.testing.assert_array_equal(native(many).numpy(), xla(many).numpy())
    native._eager = eager
    chain_for_many = native._chain is not None and not native._int8_large
    assert eager_calls == ([len(many)] if chain_for_many else [])
    np.testing.assert_array_equal(native(x).numpy(), native.predict(x, batch_size=7))
    np.testing.assert_allclose(native(x).numpy(), model(x, training=False).numpy(),
                               rtol=1e-5, atol=1e-4)
    for i in range(3):  # one example: eager native ops (integer first layer) or one XLA call
        np.testing.assert_array_equal(native(x[i:i + 1]).numpy(), xla(x[i:i + 1]).numpy())
    assert (native._chain is not None) == bool(encoding)
    if encoding:
        np.testing.assert_array_equal(native(pixels).numpy(), native(x).numpy())
        np.testing.assert_array_equal(native(pixels[:1]).numpy(), xla(x[:1]).numpy())


@needs_native
@pytest.mark.parametrize("forced, native", [("avx2", True), ("generic", False)])
def test_packed_convolutions_run_natively_with_the_avx2_kernels(fresh_state, tmp_path, forced,
                                                                native):
    if forced not in dispatch.variants():
        pytest.skip(f"this CPU does not run the {forced} kernels")
    fresh_state.setenv("BNN_NATIVE_KERNELS", forced)
    model = models.build("vgg_small", input_shape=(8, 8, 3), filters=(8,) * 6,
                         dense_units=(16, 16))
    export_model(model, tmp_path / "v.bnn")
    assert load_packed(tmp_path / "v.bnn").native is native
    assert load_packed(tmp_path / "v.bnn", native=True).native