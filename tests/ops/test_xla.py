"""bnn.ops.xla: compiled helpers shared by every binary layer trace per shape without warnings;
computed_once leaves values unchanged."""

import logging

import numpy as np
import pytest
import tensorflow as tf

from bnn import models
from bnn.native import dispatch
from bnn.ops import xnor
from bnn.ops.sign import sign
from bnn.ops.xla import compiled, computed_once


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _tensorflow_warnings(fn):
    """Runs fn; returns the warnings TensorFlow's logger received meanwhile."""
    records, logger = _Records(), tf.get_logger()
    logger.addHandler(records)
    try:
        fn()
    finally:
        logger.removeHandler(records)
    return records.messages


def test_compiled_helper_traces_per_shape_and_computes_under_xla():
    square = compiled(lambda x: x * x)

    def calls():
        for n in range(1, 9):
            np.testing.assert_array_equal(square(tf.range(n, dtype=tf.float32)).numpy(),
                                          np.arange(n, dtype=np.float32) ** 2)

    warnings = _tensorflow_warnings(calls)
    assert square.experimental_get_tracing_count() == 8
    assert not [m for m in warnings if "retracing" in m], warnings


def test_plain_tf_function_would_warn_in_the_same_calls():
    """The condition the helpers avoid: one tf.function traced for 8 shapes in a row warns."""
    square = tf.function(lambda x: x * x, jit_compile=True)
    warnings = _tensorflow_warnings(
        lambda: [square(tf.range(n, dtype=tf.float32)) for n in range(1, 9)])
    assert [m for m in warnings if "retracing" in m]


def test_eager_calls_of_binary_models_with_new_batch_sizes_do_not_warn():
    mlp = models.build("binarynet_mlp", "binary", input_shape=(8, 8, 1), hidden_units=(32, 48))
    vgg = models.build("vgg_small", "binary", input_shape=(8, 8, 3),
                       filters=(4, 4, 8, 8, 8, 8), dense_units=(16, 16))
    before = xnor._packed_matmul.experimental_get_tracing_count()
    sign_before = sign.experimental_get_tracing_count()
    rng = np.random.default_rng(0)

    def calls():
        for batch in (1, 2, 3, 5):
            mlp(rng.uniform(-1, 1, (batch, 8, 8, 1)).astype(np.float32), training=False)
            vgg(rng.uniform(-1, 1, (batch, 8, 8, 3)).astype(np.float32), training=False)

    warnings = _tensorflow_warnings(calls)
    if dispatch.packed_forward():
        assert xnor._packed_matmul.experimental_get_tracing_count() - before >= 6
    assert sign.experimental_get_tracing_count() - sign_before >= 6
    assert not [m for m in warnings if "retracing" in m], warnings


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("jit", [False, True])
def test_computed_once_leaves_values_unchanged(dtype, jit):
    rng = np.random.default_rng(3)
    t = tf.cast(rng.integers(-300, 300, (5, 7, 3)), dtype)
    got = tf.function(computed_once, jit_compile=jit)(t)
    assert got.dtype == t.dtype
    np.testing.assert_array_equal(got.numpy(), t.numpy())
