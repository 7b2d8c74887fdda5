"""The ``bnn`` command (:mod:`~bnn.cli.main`) and its quiet start of TensorFlow
(:mod:`~bnn.cli.startup`). Importing it imports no TensorFlow."""

from bnn.cli.main import main

__all__ = ["main"]
