"""Test set-up: quiet TensorFlow, and two logical CPU devices for tf.distribute tests."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

_cpus = tf.config.list_physical_devices("CPU")
try:
    tf.config.set_logical_device_configuration(
        _cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2
    )
except RuntimeError:  # already initialised by an earlier import; tests that need 2 devices skip
    pass
