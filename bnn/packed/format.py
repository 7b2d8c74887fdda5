"""The packed model file (``.bnn``): its layout, written and read back with every field checked.

Layout (all integers little-endian; see docs/export.md)::

    magic      8 bytes   b"BNNPACK\\0"
    version    uint32    FORMAT_VERSION
    length     uint64    byte length of the manifest
    manifest   JSON      UTF-8: input shape, stages, and where each array lies in the blobs
    blobs      bytes     the arrays, back to back, little-endian, C order
    checksum   32 bytes  SHA-256 of every byte before it

A file that is truncated, altered, of another version or not a packed model raises
:class:`bnn.errors.ExportError`; it never loads into a model that predicts something else.
"""

from __future__ import annotations

import hashlib
import json
import struct
from typing import Any

import numpy as np

from bnn.errors import ExportError

__all__ = ["FORMAT_VERSION", "READABLE_VERSIONS", "MAGIC", "serialize", "deserialize"]

_fail = ExportError.at  # "<where>: <problem>; <fix>"

FORMAT_VERSION = 3
#: Versions this bnn reads: version 1 files are version 2 files without an input encoding, and
#: version 2 files are version 3 files without a real-valued first layer.
READABLE_VERSIONS = (1, 2, 3)
MAGIC = b"BNNPACK\x00"
_HEADER = struct.Struct("<8sIQ")
_DIGEST = 32
_DTYPES = ("int64", "int32", "float32")


def serialize(manifest: dict[str, Any], arrays: list[dict[str, np.ndarray]]) -> bytes:
    """The file's bytes: header, ``manifest`` with the arrays' places added, the arrays, and the
    checksum."""
    blobs, entries, offset = [], [], 0
    for index, stage_arrays in enumerate(arrays):
        for name, array in stage_arrays.items():
            array = np.ascontiguousarray(array)
            data = array.astype(array.dtype.newbyteorder("<")).tobytes()
            entries.append({"stage": index, "name": name, "dtype": array.dtype.name,
                            "shape": list(array.shape), "offset": offset, "nbytes": len(data)})
            blobs.append(data)
            offset += len(data)
    manifest = {**manifest, "arrays": entries, "blob_bytes": offset}
    text = json.dumps(manifest, sort_keys=True).encode("utf-8")
    body = _HEADER.pack(MAGIC, FORMAT_VERSION, len(text)) + text + b"".join(blobs)
    return body + hashlib.sha256(body).digest()


def deserialize(data: bytes, where: str) -> tuple[dict[str, Any], list[dict[str, np.ndarray]]]:
    """The manifest and the stages' arrays of a file's bytes, every field checked.

    Raises:
        ExportError: for a truncated, altered, foreign or unreadable file, naming ``where``.
    """
    if len(data) < _HEADER.size + _DIGEST:
        raise _fail(where, f"file is only {len(data)} bytes (truncated)", "re-export the model")
    magic, version, length = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise _fail(where, "not a bnn packed model (bad magic bytes)",
                    "give a file written by bnn export")
    if version not in READABLE_VERSIONS:
        newer = version > FORMAT_VERSION
        raise _fail(where, f"format version {version}, this bnn reads versions "
                    f"{', '.join(map(str, READABLE_VERSIONS))}",
                    "upgrade bnn to read it" if newer else
                    "re-export the model with this version of bnn")
    if hashlib.sha256(data[:-_DIGEST]).digest() != data[-_DIGEST:]:
        raise _fail(where, "checksum mismatch (the file is truncated or corrupted)",
                    "re-export or re-copy the model")
    start = _HEADER.size + length
    try:
        manifest = json.loads(data[_HEADER.size:start].decode("utf-8"))
        blobs = data[start:-_DIGEST]
        if len(blobs) != manifest["blob_bytes"]:
            raise ValueError(f"{len(blobs)} blob bytes, manifest says {manifest['blob_bytes']}")
        arrays: list[dict[str, np.ndarray]] = [{} for _ in manifest["stages"]]
        for entry in manifest["arrays"]:
            if entry["dtype"] not in _DTYPES:
                raise ValueError(f"array dtype {entry['dtype']!r}")
            dtype = np.dtype(entry["dtype"]).newbyteorder("<")
            count = int(np.prod(entry["shape"], dtype=np.int64))
            if count * dtype.itemsize != entry["nbytes"] or \
                    entry["offset"] + entry["nbytes"] > len(blobs):
                raise ValueError(f"array {entry['name']!r} of stage {entry['stage']} does not "
                                 "fit its declared size")
            array = np.frombuffer(blobs, dtype, count, entry["offset"]).reshape(entry["shape"])
            arrays[entry["stage"]][entry["name"]] = array.astype(dtype.newbyteorder("="))
    except (ValueError, KeyError, TypeError, IndexError, UnicodeDecodeError) as error:
        raise _fail(where, f"malformed manifest ({error})", "re-export the model") from None
    return manifest, arrays
