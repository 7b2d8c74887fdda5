"""Files written whole or not at all (no TensorFlow): a crash leaves the old file or the new
one, never a partial one."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["atomic_write", "write_json"]


def atomic_write(path: Path, data: bytes | str) -> None:
    """Writes ``data`` to a temporary file beside ``path``, syncs it, then renames it over
    ``path``: readers see the old file or the new one, never a partial one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, obj: Any) -> None:
    """``obj`` as indented JSON with sorted keys, written by :func:`atomic_write`."""
    atomic_write(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")
