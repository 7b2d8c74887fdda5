"""Test set-up: quiet TensorFlow, two logical CPU devices for tf.distribute tests, and op
determinism left off after each test."""

import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402
from tensorflow.python.framework import config as tf_config  # noqa: E402

_cpus = tf.config.list_physical_devices("CPU")
try:
    tf.config.set_logical_device_configuration(
        _cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2
    )
except RuntimeError:  # already initialised by an earlier import; tests that need 2 devices skip
    pass


@pytest.fixture(autouse=True)
def _op_determinism_left_off():
    """TensorFlow's op determinism is process-wide, and Keras trains without XLA while it is on:
    a test that trains with ``deterministic: true`` turns it off again, so later tests that
    compile with XLA do."""
    yield
    if tf_config.is_op_determinism_enabled():  # not public API; Keras reads the same function
        tf_config.disable_op_determinism()
