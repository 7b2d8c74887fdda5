"""Every error bnn raises on purpose, one class each, all known without importing TensorFlow.

A :class:`UserError` is a mistake the user can fix: its message is one line that says what is
wrong, where, and what to do. The ``bnn`` command prints it as ``bnn: error: <message>`` and
exits with code 2.
"""

from __future__ import annotations

import re

__all__ = ["UserError", "ConfigError", "DataError", "ExportError", "ModelFileError",
           "RunDirError", "SettingError", "TrainingError", "ConversionError",
           "NativeKernelsUnavailable", "Interrupted"]


class UserError(Exception):
    """A problem the user can fix; the message is one line naming the problem and the fix."""

    @classmethod
    def at(cls, where: object, problem: str, fix: str) -> "UserError":
        """The error ``<where>: <problem>; <fix>``."""
        return cls(f"{where}: {problem}; {fix}")


class ConfigError(UserError):
    """A mistake in an experiment file or override, as one line:
    ``<source>: <key>: <problem>; <hint>`` (``<key>`` is left out for whole-file problems)."""

    def __init__(self, source: str, key: str, problem: str, hint: str):
        self.source, self.key, self.problem, self.hint = source, key, problem, hint
        parts = [source, key, f"{problem}; {hint}"] if key else [source, f"{problem}; {hint}"]
        super().__init__(re.sub(r"\s*[\r\n]+\s*", " ", ": ".join(parts)))


class DataError(UserError):
    """A dataset file or a data argument is wrong; the message says where, what and how to fix it."""


class ExportError(UserError):
    """A model that cannot be exported, or a packed file that cannot be loaded."""


class ModelFileError(UserError):
    """A saved model that bnn cannot train (``model: {name: keras_file}``): the file, the problem
    and the fix."""


class RunDirError(UserError):
    """A problem with the run directory (locked, finished, damaged checkpoint)."""


class SettingError(UserError):
    """A ``BNN_*`` environment variable bnn cannot read (see :mod:`bnn.settings`)."""


class TrainingError(UserError):
    """Training could not go on (non-finite loss, missing device, damaged checkpoint)."""


class ConversionError(UserError):
    """A Larq model that cannot be converted; the message is one line naming the file, the
    problem and the fix."""


class NativeKernelsUnavailable(RuntimeError):
    """The native kernels were asked for (``PackedModel(..., native=True)``) where they cannot
    run: not built here, or the model has layers they do not cover."""


class Interrupted(Exception):
    """Training stopped on SIGINT or SIGTERM after saving; ``--resume`` continues it."""
