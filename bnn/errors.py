"""The mistakes a user can fix, one class each, all known without importing TensorFlow.

Every error here is a :class:`UserError`: its message is one line that says what is wrong, where,
and what to do. The ``bnn`` command prints it as ``bnn: error: <message>`` and exits with code 2.
"""

from __future__ import annotations

__all__ = ["UserError", "DataError", "ExportError", "ModelFileError", "RunDirError", "SettingError",
           "TrainingError", "Interrupted"]


class UserError(Exception):
    """A problem the user can fix; the message is one line naming the problem and the fix."""


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


class Interrupted(Exception):
    """Training stopped on SIGINT or SIGTERM after saving; ``--resume`` continues it."""
