"""Bit packing, xor-popcount dot products and threshold folding against plain numpy."""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from bnn.ops.bitpack import pack_bits, unpack_bits
from bnn.ops.xnor import xor_popcount_matmul
from bnn.packed.fold import fold_sign_threshold

SETTINGS = settings(max_examples=25, deadline=None)


def _signs(rng, shape):
    return np.where(rng.normal(size=shape) >= 0, 1.0, -1.0).astype(np.float32)


@SETTINGS
@given(shape=st.lists(st.integers(1, 9), min_size=1, max_size=3), n=st.integers(1, 150),
       word_bits=st.sampled_from([8, 16, 32, 64]), seed=st.integers(0, 2**16))
def test_pack_unpack_round_trip_for_any_length_and_axis(shape, n, word_bits, seed):
    rng = np.random.default_rng(seed)
    axis = int(rng.integers(0, len(shape) + 1))
    full = list(shape)
    full.insert(axis, n)
    a = rng.normal(size=full).astype(np.float32)
    words = pack_bits(a, axis=axis, word_bits=word_bits)
    assert words.shape[axis] == -(-n // word_bits)
    assert words.dtype.itemsize * 8 == word_bits
    np.testing.assert_array_equal(unpack_bits(words, n, axis=axis, word_bits=word_bits),
                                  np.where(a >= 0, 1.0, -1.0))


def test_pack_bits_sets_bit_i_for_element_i_and_clears_padding():
    a = -np.ones(70)
    a[[0, 3, 64, 69]] = 1.0
    words = pack_bits(a)
    assert words.tolist() == [0b1001, 0b100001]
    assert pack_bits(np.ones(3)).tolist() == [0b111]  # bits past n stay 0
    assert pack_bits(np.zeros(1)).tolist() == [1]  # 0 counts as +1


def test_unpack_rejects_a_word_count_that_does_not_fit_n():
    with pytest.raises(ValueError, match="expected 2 words"):
        unpack_bits(np.zeros(1, np.int64), 100)


@SETTINGS
@given(batch=st.integers(1, 6), n=st.integers(1, 300), units=st.integers(1, 9),
       seed=st.integers(0, 2**16))
def test_xor_popcount_matmul_equals_sign_matmul(batch, n, units, seed):
    rng = np.random.default_rng(seed)
    x, w = _signs(rng, (batch, n)), _signs(rng, (n, units))
    got = xor_popcount_matmul(tf.constant(pack_bits(x)), tf.constant(pack_bits(w, axis=0)), n)
    assert got.dtype == tf.int32
    np.testing.assert_array_equal(got.numpy(), (x @ w).astype(np.int32))


def test_xor_popcount_matmul_under_xla_is_exact():
    rng = np.random.default_rng(1)
    x, w = _signs(rng, (4, 2048)), _signs(rng, (2048, 33))
    fn = tf.function(lambda a, b: xor_popcount_matmul(a, b, 2048), jit_compile=True)
    got = fn(tf.constant(pack_bits(x)), tf.constant(pack_bits(w, axis=0)))
    np.testing.assert_array_equal(got.numpy(), (x @ w).astype(np.int32))


@SETTINGS
@given(seed=st.integers(0, 2**16), n=st.integers(1, 60))
def test_fold_sign_threshold_reproduces_affine_signs_of_either_direction(seed, n):
    rng = np.random.default_rng(seed)
    values = np.arange(-n, n + 1)
    scale = rng.normal(size=8) * rng.integers(0, 2, size=8)  # some zero scales: constant sign
    shift = rng.normal(scale=n / 2, size=8)
    positive = (values[:, None] * scale + shift) >= 0
    threshold, flip = fold_sign_threshold(values, positive)
    np.testing.assert_array_equal((values[:, None] >= threshold) ^ flip, positive)
    assert not flip[scale > 0].any()


def test_fold_sign_threshold_rejects_a_non_monotone_decision():
    positive = np.array([[True], [False], [True]])
    with pytest.raises(ValueError, match="channel 0.*not monotone"):
        fold_sign_threshold(np.arange(3), positive)
