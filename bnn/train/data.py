"""Dataset files -> validated arrays -> tf.data pipelines.

Three datasets are known: MNIST, Fashion-MNIST and CIFAR-10. Files are read directly (never through
``keras.datasets``, whose hash check deletes files it does not recognise) and validated by structure:
keys, shapes, dtypes, counts, label range and IDX magic numbers. Every problem with a file or an
argument is a :class:`DataError` with a one-line message that names the file, the problem and the fix.

Where files are looked for, in order:

1. the ``data_dir`` argument, or else the ``BNN_DATA_DIR`` environment variable;
2. the Keras cache folder, ``$KERAS_HOME/datasets`` (``~/.keras/datasets`` when ``KERAS_HOME`` is unset);
3. a download from ``BNN_DATA_URL`` (a base URL; default: the official locations) into the Keras cache.

Training pipelines are deterministic per epoch: the order of epoch ``e`` is
``np.random.default_rng([seed, e]).permutation(n)``, and CIFAR-10 augmentation of step ``s`` of epoch
``e`` uses stateless random ops seeded from ``(seed, e, s)``. A run resumed at epoch ``k`` therefore
sees exactly the batches an uninterrupted run sees from epoch ``k`` on.
"""

from __future__ import annotations

import gzip
import io
import os
import pickle
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import tensorflow as tf

from bnn import settings
from bnn.catalog import DATASETS
from bnn.errors import DataError

__all__ = [
    "DataError", "DATASETS", "Arrays", "Datasets", "load_arrays", "normalize", "make_datasets",
    "CIFAR10_MEAN", "CIFAR10_STD", "DEFAULT_URL_BASES", "search_dirs",
]


#: Official download locations (base URLs; the file names are appended). ``BNN_DATA_URL`` replaces
#: the base for all three datasets.
DEFAULT_URL_BASES: dict[str, str] = {
    "mnist": "https://storage.googleapis.com/tensorflow/tf-keras-datasets/",
    "fashion_mnist": "https://storage.googleapis.com/tensorflow/tf-keras-datasets/",
    "cifar10": "https://www.cs.toronto.edu/~kriz/",
}

#: Per-channel (R, G, B) mean and standard deviation of the original CIFAR-10 training set, with
#: pixels scaled to [0, 1]. ``normalize`` computes ``(x / 255 - mean) / std``.
CIFAR10_MEAN: tuple[float, float, float] = (0.4914, 0.4822, 0.4465)
CIFAR10_STD: tuple[float, float, float] = (0.2470, 0.2435, 0.2616)

_NUM_CLASSES = 10
_IMAGE_SHAPE = {"mnist": (28, 28), "fashion_mnist": (28, 28), "cifar10": (32, 32, 3)}
_INPUT_SHAPE = {"mnist": (28, 28, 1), "fashion_mnist": (28, 28, 1), "cifar10": (32, 32, 3)}

_MNIST_FILE = "mnist.npz"
_FASHION_DIR = "fashion-mnist"
_FASHION_FILES = {  # array name -> file name
    "x_train": "train-images-idx3-ubyte.gz",
    "y_train": "train-labels-idx1-ubyte.gz",
    "x_test": "t10k-images-idx3-ubyte.gz",
    "y_test": "t10k-labels-idx1-ubyte.gz",
}
_CIFAR_TAR = "cifar-10-python.tar.gz"
_CIFAR_DIR = "cifar-10-batches-py"
_CIFAR_TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
_CIFAR_TEST_BATCH = "test_batch"

_FIX_FILE = ("the file is damaged: delete it and download it again, "
             "or set BNN_DATA_DIR to a folder with a good copy")
_FIX_MISSING = "set BNN_DATA_DIR or pass --data-dir to a folder that holds it"


@dataclass(frozen=True)
class Arrays:
    """A dataset as read-only numpy arrays: images uint8 (N, H, W, C), labels int64 (N,)."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    input_shape: tuple[int, int, int]


@dataclass
class Datasets:
    """tf.data pipelines yielding ``(x float32 normalized, y int64)`` batches.

    ``train`` holds ``steps_per_epoch`` batches for each epoch in ``range(initial_epoch, epochs)``,
    concatenated, ready for ``model.fit(train, epochs=epochs, initial_epoch=initial_epoch,
    steps_per_epoch=steps_per_epoch)``. ``validation`` and ``test`` are in file order, with the last
    partial batch kept. ``prepare`` is set for ``on_device`` pipelines, whose ``train`` yields the
    indices that ``prepare`` turns into batches.
    """

    train: tf.data.Dataset
    validation: tf.data.Dataset | None
    test: tf.data.Dataset
    steps_per_epoch: int
    num_classes: int
    input_shape: tuple[int, int, int]
    train_size: int
    validation_size: int
    test_size: int
    prepare: Callable[[dict], tuple[tf.Tensor, tf.Tensor]] | None = None


# ----------------------------------------------------------------------------------------------
# Where files are looked for


def _keras_cache_dir() -> Path:
    """``$KERAS_HOME/datasets``, or ``~/.keras/datasets`` when ``KERAS_HOME`` is unset."""
    return settings.keras_home() / "datasets"


def search_dirs(data_dir: str | os.PathLike | None = None) -> list[Path]:
    """Folders searched for dataset files, in order: ``data_dir`` (else ``BNN_DATA_DIR``), Keras
    cache; each an absolute path, a relative one taken from the working folder of this call."""
    first = data_dir if data_dir is not None else settings.data_dir()
    dirs = [Path(os.path.abspath(os.path.expanduser(first)))] if first is not None else []
    cache = _keras_cache_dir()
    if cache not in dirs:
        dirs.append(cache)
    return dirs


def _url_base(name: str) -> str:
    base = settings.data_url() or DEFAULT_URL_BASES[name]
    return base if base.endswith("/") else base + "/"


def _find(name: str, folder: Path) -> Path | dict[str, Path] | None:
    """The dataset's file(s) in ``folder``, or None. CIFAR-10: an extracted folder or the tar.gz."""
    if name == "mnist":
        path = folder / _MNIST_FILE
        return path if path.is_file() else None
    if name == "fashion_mnist":
        for sub in (folder / _FASHION_DIR, folder):
            paths = {key: sub / fname for key, fname in _FASHION_FILES.items()}
            if all(p.is_file() for p in paths.values()):
                return paths
        return None
    for extracted in (folder / _CIFAR_DIR, folder / f"{_CIFAR_DIR}-target" / _CIFAR_DIR):
        if extracted.is_dir():
            return extracted
    path = folder / _CIFAR_TAR
    return path if path.is_file() else None


def _looked_for(name: str) -> str:
    if name == "mnist":
        return _MNIST_FILE
    if name == "fashion_mnist":
        return f"{_FASHION_DIR}/{{{', '.join(_FASHION_FILES.values())}}}"
    return f"{_CIFAR_TAR} or {_CIFAR_DIR}/"


def _download(url: str, dest: Path) -> None:
    """Streams ``url`` to a temporary file next to ``dest``, then renames it (atomic)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    try:
        with urllib.request.urlopen(url, timeout=60) as response, os.fdopen(fd, "wb") as out:
            total = int(response.headers.get("Content-Length") or 0)
            done = 0
            show = sys.stderr.isatty()
            while chunk := response.read(1 << 20):
                out.write(chunk)
                done += len(chunk)
                if show:
                    of = f" / {total / 1e6:.1f}" if total else ""
                    print(f"\rdownloading {url}: {done / 1e6:.1f}{of} MB", end="", file=sys.stderr)
            if show:
                print(file=sys.stderr)
        if total and done != total:
            raise OSError(f"got {done} of {total} bytes")
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _fetch(name: str, data_dir: str | os.PathLike | None) -> Path | dict[str, Path]:
    """Finds the dataset's file(s) in the search folders, or downloads them into the Keras cache."""
    dirs = search_dirs(data_dir)
    for folder in dirs:
        found = _find(name, folder)
        if found is not None:
            return found
    cache = _keras_cache_dir()
    base = _url_base(name)
    if name == "mnist":
        targets = {_MNIST_FILE: cache / _MNIST_FILE}
    elif name == "fashion_mnist":
        targets = {f: cache / _FASHION_DIR / f for f in _FASHION_FILES.values()}
    else:
        targets = {_CIFAR_TAR: cache / _CIFAR_TAR}
    for fname, dest in targets.items():
        if dest.is_file():
            continue
        try:
            _download(base + fname, dest)
        except (OSError, urllib.error.URLError, ValueError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise DataError(
                f"{name}: {_looked_for(name)} not found in {', '.join(map(str, dirs))}, and the "
                f"download of {base + fname} failed ({reason}); {_FIX_MISSING}"
            ) from None
    found = _find(name, cache)
    assert found is not None  # every target file now exists
    return found


# ----------------------------------------------------------------------------------------------
# Reading and validating files


def _check_images(what: str, x: np.ndarray, shape: tuple[int, ...]) -> None:
    expected = f"(N, {', '.join(map(str, shape))}) uint8"
    if x.dtype != np.uint8 or x.ndim != len(shape) + 1 or x.shape[1:] != shape:
        raise DataError(f"{what} has shape {x.shape} and dtype {x.dtype} but {expected} is expected; "
                        f"{_FIX_FILE}")


def _check_labels(what: str, y: np.ndarray, n: int, x_what: str) -> np.ndarray:
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise DataError(f"{what} has shape {y.shape} and dtype {y.dtype} but (N,) integers are "
                        f"expected; {_FIX_FILE}")
    if len(y) != n:
        raise DataError(f"{what} has {len(y)} labels but {x_what} has {n} images; {_FIX_FILE}")
    if len(y) and (y.min() < 0 or y.max() >= _NUM_CLASSES):
        raise DataError(f"{what} has labels in [{y.min()}, {y.max()}] but [0, {_NUM_CLASSES - 1}] "
                        f"is expected; {_FIX_FILE}")
    return y.astype(np.int64)


def _read_mnist(path: Path) -> dict[str, np.ndarray]:
    where = f"{_MNIST_FILE} at {path}"
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = [k for k in ("x_train", "y_train", "x_test", "y_test") if k not in npz.files]
            if missing:
                raise DataError(f"{where}: missing arrays {', '.join(missing)} (has "
                                f"{', '.join(npz.files) or 'none'}); {_FIX_FILE}")
            arrays = {k: npz[k] for k in ("x_train", "y_train", "x_test", "y_test")}
    except DataError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise DataError(f"{where} cannot be read as a .npz file ({exc}); {_FIX_FILE}") from None
    for split in ("train", "test"):
        x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
        _check_images(f"{where}: x_{split}", x, (28, 28))
        arrays[f"y_{split}"] = _check_labels(f"{where}: y_{split}", y, len(x), f"x_{split}")
    return arrays


def _read_idx(path: Path, ndim: int) -> np.ndarray:
    """A gzipped IDX file of unsigned bytes: magic ``0x0000 08 ndim``, ndim big-endian int32 sizes."""
    try:
        with gzip.open(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"{path} cannot be read as a gzip file ({exc}); {_FIX_FILE}") from None
    header = 4 + 4 * ndim
    magic = int.from_bytes(data[:4], "big") if len(data) >= 4 else None
    if magic != 0x800 + ndim:
        found = "a too short file" if magic is None else f"magic number {magic:#010x}"
        raise DataError(f"{path} has {found} but IDX magic number {0x800 + ndim:#010x} (unsigned "
                        f"bytes, {ndim} dimensions) is expected; {_FIX_FILE}")
    dims = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    if len(data) != header + int(np.prod(dims)):
        raise DataError(f"{path} holds {len(data) - header} data bytes but its header {dims} "
                        f"announces {int(np.prod(dims))}; {_FIX_FILE}")
    return np.frombuffer(data, np.uint8, offset=header).reshape(dims)


def _read_fashion(paths: dict[str, Path]) -> dict[str, np.ndarray]:
    arrays = {key: _read_idx(path, 3 if key.startswith("x") else 1) for key, path in paths.items()}
    for split in ("train", "test"):
        x_key, y_key = f"x_{split}", f"y_{split}"
        _check_images(str(paths[x_key]), arrays[x_key], (28, 28))
        arrays[y_key] = _check_labels(str(paths[y_key]), arrays[y_key], len(arrays[x_key]),
                                      paths[x_key].name)
    return arrays


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles CIFAR batches: dicts, lists, bytes and numpy arrays, nothing that runs code."""

    _ALLOWED = {("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
                ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct")}

    def find_class(self, module: str, name: str):
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        return super().find_class(module, name)


def _parse_cifar_batch(where: str, raw: bytes) -> tuple[np.ndarray, np.ndarray]:
    """One pickled batch: ``{b'data': uint8 (N, 3072) rows R, G, B planes, b'labels': N ints}``."""
    try:
        batch = _ArrayUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except Exception as exc:  # a damaged pickle can fail in many ways; all mean the same to the user
        raise DataError(f"{where} cannot be unpickled ({type(exc).__name__}: {exc}); "
                        f"{_FIX_FILE}") from None
    if not isinstance(batch, dict):
        raise DataError(f"{where} holds a {type(batch).__name__}, not a dict; {_FIX_FILE}")
    batch = {k.decode() if isinstance(k, bytes) else k: v for k, v in batch.items()}
    missing = [k for k in ("data", "labels") if k not in batch]
    if missing:
        raise DataError(f"{where}: missing keys {', '.join(missing)}; {_FIX_FILE}")
    data = batch["data"]
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 \
            or data.shape[1] != 3072:
        shape, dtype = getattr(data, "shape", "?"), getattr(data, "dtype", type(data).__name__)
        raise DataError(f"{where}: data has shape {shape} and dtype {dtype} but (N, 3072) uint8 is "
                        f"expected; {_FIX_FILE}")
    try:
        labels = np.asarray(batch["labels"])
    except (ValueError, TypeError):
        labels = np.asarray([], dtype=object)
    labels = _check_labels(f"{where}: labels", labels, len(data), "data")
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels


def _read_cifar_raw(path: Path) -> dict[str, tuple[str, bytes]]:
    """Batch name -> (description for messages, pickled bytes), from the tar.gz or the folder."""
    wanted = (*_CIFAR_TRAIN_BATCHES, _CIFAR_TEST_BATCH)
    raw: dict[str, tuple[str, bytes]] = {}
    if path.is_dir():
        for name in wanted:
            member = path / name
            if member.is_file():
                raw[name] = (str(member), member.read_bytes())
        where = str(path)
    else:
        where = f"{_CIFAR_TAR} at {path}"
        try:
            with tarfile.open(path, "r:gz") as tar:
                for member in tar:
                    name = member.name.rsplit("/", 1)[-1]
                    if member.isfile() and name in wanted and name not in raw:
                        f = tar.extractfile(member)
                        raw[name] = (f"{where}: {member.name}", f.read())
        except (OSError, EOFError, zlib.error, tarfile.TarError) as exc:
            raise DataError(f"{where} cannot be read as a .tar.gz file ({exc}); {_FIX_FILE}") from None
    missing = [n for n in wanted if n not in raw]
    if missing:
        raise DataError(f"{where}: missing batches {', '.join(missing)} (in {_CIFAR_DIR}/); "
                        f"{_FIX_FILE}")
    return raw


_CIFAR_CACHE: dict[tuple, dict[str, np.ndarray]] = {}


def _read_cifar(path: Path) -> dict[str, np.ndarray]:
    """CIFAR-10 arrays, decoded once per process for each (path, file mtimes and sizes)."""
    files = [path / n for n in (*_CIFAR_TRAIN_BATCHES, _CIFAR_TEST_BATCH)] if path.is_dir() else [path]
    key = (str(path.resolve()), tuple((f.stat().st_mtime_ns, f.stat().st_size) if f.is_file() else None
                                      for f in files))
    if key not in _CIFAR_CACHE:
        raw = _read_cifar_raw(path)
        train = [_parse_cifar_batch(*raw.pop(name)) for name in _CIFAR_TRAIN_BATCHES]
        x_test, y_test = _parse_cifar_batch(*raw.pop(_CIFAR_TEST_BATCH))
        _CIFAR_CACHE.clear()  # one copy at a time: 180 MB each
        _CIFAR_CACHE[key] = {
            "x_train": np.concatenate([x for x, _ in train]),
            "y_train": np.concatenate([y for _, y in train]),
            "x_test": np.ascontiguousarray(x_test), "y_test": y_test,
        }
    return _CIFAR_CACHE[key]


def _check_name(name: str) -> None:
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r}; known datasets: {', '.join(DATASETS)}")


def load_arrays(name: str, data_dir: str | os.PathLike | None = None) -> Arrays:
    """Finds (or downloads), reads and validates a dataset; see the module docstring for the order.

    Images come back uint8 (N, H, W, C), with a channel axis of 1 for MNIST and Fashion-MNIST;
    labels int64 (N,) in [0, 10). The arrays are read-only. Raises :class:`DataError` on any problem.
    """
    _check_name(name)
    found = _fetch(name, data_dir)
    if name == "mnist":
        arrays = _read_mnist(found)
    elif name == "fashion_mnist":
        arrays = _read_fashion(found)
    else:
        arrays = _read_cifar(found)
    if name != "cifar10":
        arrays = {k: v[..., None] if k.startswith("x") else v for k, v in arrays.items()}
    for a in arrays.values():
        a.setflags(write=False)
    return Arrays(num_classes=_NUM_CLASSES, input_shape=_INPUT_SHAPE[name], **arrays)


# ----------------------------------------------------------------------------------------------
# Normalization and pipelines


def normalize(name: str, x: np.ndarray | tf.Tensor) -> np.ndarray | tf.Tensor:
    """Maps uint8 pixels to float32 network inputs; numpy in gives numpy out, tensor gives tensor.

    MNIST, Fashion-MNIST: ``x / 127.5 - 1``, range [-1, 1].
    CIFAR-10: ``(x / 255 - CIFAR10_MEAN[c]) / CIFAR10_STD[c]`` per channel ``c`` (last axis).
    """
    _check_name(name)
    if name == "cifar10":
        scale = 1.0 / (255.0 * np.asarray(CIFAR10_STD, np.float32))
        shift = -np.asarray(CIFAR10_MEAN, np.float32) / np.asarray(CIFAR10_STD, np.float32)
    else:
        scale, shift = np.float32(1.0 / 127.5), np.float32(-1.0)
    if isinstance(x, np.ndarray):
        return (x.astype(np.float32) * scale + shift).astype(np.float32)
    return tf.cast(x, tf.float32) * scale + shift


# Augmentation per dataset: (zero padding in pixels before a random crop back to size, random
# horizontal flip). MNIST digits are not mirror-symmetric, so they only shift.
AUGMENTATION: dict[str, tuple[int, bool]] = {
    "mnist": (2, False),
    "fashion_mnist": (2, False),
    "cifar10": (4, True),
}


def _augment(x: tf.Tensor, seed: tf.Tensor, pad: int, flip: bool) -> tf.Tensor:
    """Augmentation of a uint8 batch (B, H, W, C): zero-pad ``pad``, random HxW crop, and a random
    horizontal flip when ``flip``, each example independently; stateless, so the same ``seed``
    gives the same result."""
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    b, h, w = tf.shape(x)[0], x.shape[1], x.shape[2]
    padded = tf.pad(x, [[0, 0], [pad, pad], [pad, pad], [0, 0]])
    offsets = tf.random.stateless_uniform([b, 2], crop_seed, minval=0, maxval=2 * pad + 1,
                                          dtype=tf.int32)
    rows = offsets[:, :1] + tf.range(h)  # (B, H)
    cols = offsets[:, 1:] + tf.range(w)
    cropped = tf.gather(tf.gather(padded, rows, axis=1, batch_dims=1), cols, axis=2, batch_dims=1)
    if not flip:
        return cropped
    flips = tf.random.stateless_uniform([b], flip_seed) < 0.5
    return tf.where(flips[:, None, None, None], tf.reverse(cropped, axis=[2]), cropped)


def _cutout(x: tf.Tensor, seed: tf.Tensor, size: int) -> tf.Tensor:
    """Cutout (DeVries and Taylor 2017) of a normalized batch (B, H, W, C): in each image, the
    ``size`` x ``size`` square centred on a uniformly random pixel (cut off at the border) is set
    to 0, the mean pixel; stateless, so the same ``seed`` gives the same squares."""
    b, h, w = tf.shape(x)[0], x.shape[1], x.shape[2]
    row_seed, col_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    top = tf.random.stateless_uniform([b, 1], row_seed, 0, h, tf.int32) - size // 2
    left = tf.random.stateless_uniform([b, 1], col_seed, 0, w, tf.int32) - size // 2
    rows, cols = tf.range(h)[None, :] - top, tf.range(w)[None, :] - left  # (B, H), (B, W)
    inside = ((rows >= 0) & (rows < size))[:, :, None] & ((cols >= 0) & (cols < size))[:, None, :]
    return tf.where(inside[..., None], tf.zeros_like(x), x)


def _batch_maker(name: str, x: np.ndarray, y: np.ndarray, seed: int, augment: bool, cutout: int,
                 device: str | None = None) -> Callable[[dict], tuple[tf.Tensor, tf.Tensor]]:
    """The function that turns ``{"epoch", "step", "index"}`` into the normalized, augmented
    ``(images, labels)`` batch, from copies of ``x`` and ``y`` on ``device`` (default: where
    TensorFlow puts new tensors). Step ``s`` of epoch ``e`` draws its random numbers from
    ``fold_in((seed, e), s)``: crop and flip from its split, cutout from its ``fold_in(., 2)``."""
    with tf.device(device):
        x_all, y_all = tf.identity(tf.constant(x)), tf.identity(tf.constant(y))

    def make(batch: dict) -> tuple[tf.Tensor, tf.Tensor]:
        index = batch["index"]
        xb = tf.gather(x_all, index)
        step_seed = tf.random.experimental.stateless_fold_in(
            tf.stack([tf.constant(seed, tf.int64), batch["epoch"]]), batch["step"])
        if augment:
            xb = _augment(xb, step_seed, *AUGMENTATION[name])
        xb = normalize(name, xb)
        if cutout:
            xb = _cutout(xb, tf.random.experimental.stateless_fold_in(step_seed, 2), cutout)
        return xb, tf.gather(y_all, index)

    return make


def _eval_dataset(name: str, x: np.ndarray, y: np.ndarray, batch_size: int) -> tf.data.Dataset:
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size)
    return ds.map(lambda xb, yb: (normalize(name, xb), yb)).prefetch(tf.data.AUTOTUNE)


def _train_indices(n: int, batch_size: int, steps: int, seed: int, initial_epoch: int,
                   epochs: int) -> tf.data.Dataset:
    """``{"epoch", "step", "index"}`` for every step of epochs ``[initial_epoch, epochs)``: epoch
    ``e`` visits ``np.random.default_rng([seed, e]).permutation(n)`` in batches."""

    def permutation(epoch: np.int64) -> np.ndarray:
        order = np.random.default_rng([seed, int(epoch)]).permutation(n)
        return order[:steps * batch_size].reshape(steps, batch_size)

    def epoch_batches(epoch: tf.Tensor) -> tf.data.Dataset:
        order = tf.numpy_function(permutation, [epoch], tf.int64, stateful=False)
        order = tf.ensure_shape(order, [steps, batch_size])
        step = tf.range(steps, dtype=tf.int64)
        return tf.data.Dataset.from_tensor_slices(
            {"epoch": tf.fill([steps], epoch), "step": step, "index": order})

    ds = tf.data.Dataset.range(initial_epoch, epochs).flat_map(epoch_batches)
    return ds.apply(tf.data.experimental.assert_cardinality((epochs - initial_epoch) * steps))


def make_datasets(name: str, batch_size: int, seed: int = 0, *, epochs: int = 1, initial_epoch: int = 0,
                  validation_split: float = 0.0, augment: bool = True, limit_train: int | None = None,
                  limit_test: int | None = None, data_dir: str | os.PathLike | None = None,
                  test_batch_size: int | None = None, cutout: int = 0,
                  on_device: bool = False) -> Datasets:
    """Builds train / validation / test pipelines for a dataset.

    The last ``floor(N * validation_split)`` training examples form the validation set; then
    ``limit_train`` keeps the first examples of the rest and ``limit_test`` the first test examples.
    ``steps_per_epoch = train_size // batch_size`` (the last partial batch of each epoch is dropped).
    Epoch ``e`` visits ``np.random.default_rng([seed, e]).permutation(train_size)``; with
    ``augment``, batches are padded, cropped and (CIFAR-10) flipped as :data:`AUGMENTATION` says,
    with stateless ops seeded from ``(seed, e, step)``; ``cutout > 0`` then zeroes a random
    ``cutout`` x ``cutout`` square of each normalized image.
    Validation and test batches have ``test_batch_size`` examples (default ``batch_size``).

    ``on_device=True`` keeps the training images as one uint8 tensor where TensorFlow places new
    tensors (the GPU when there is one): ``train`` then yields only ``{"epoch", "step", "index"}``
    and ``Datasets.prepare`` turns each into the same ``(images, labels)`` batch as the host
    pipeline, with tensor ops meant to run inside the compiled train step
    (:class:`bnn.train.fitting.FitModel`).
    """
    _check_name(name)
    for arg, value, low in (("batch_size", batch_size, 1), ("epochs", epochs, 1),
                            ("initial_epoch", initial_epoch, 0), ("limit_train", limit_train, 1),
                            ("limit_test", limit_test, 1), ("test_batch_size", test_batch_size, 1),
                            ("cutout", cutout, 0)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer))
                                  or value < low):
            raise DataError(f"{arg} must be an integer >= {low}, got {value!r}")
    if initial_epoch >= epochs:
        raise DataError(f"initial_epoch ({initial_epoch}) must be smaller than epochs ({epochs}): "
                        f"nothing would be left to train")
    if not 0.0 <= validation_split < 1.0:
        raise DataError(f"validation_split must be in [0, 1), got {validation_split!r}")
    arrays = load_arrays(name, data_dir)
    n = len(arrays.x_train)
    n_val = int(n * validation_split)
    if validation_split > 0 and n_val == 0:
        raise DataError(f"validation_split {validation_split} of {n} {name} training examples is "
                        f"empty; raise validation_split or set it to 0")
    x_train, y_train = arrays.x_train[:n - n_val], arrays.y_train[:n - n_val]
    if limit_train is not None:
        x_train, y_train = x_train[:limit_train], y_train[:limit_train]
    x_test, y_test = arrays.x_test[:limit_test], arrays.y_test[:limit_test]
    if batch_size > len(x_train):
        raise DataError(f"batch_size {batch_size} is larger than the {len(x_train)} {name} training "
                        f"examples left after validation_split/limit_train; lower batch_size")
    steps = len(x_train) // batch_size
    eval_batch = test_batch_size or batch_size
    validation = None
    if n_val:
        validation = _eval_dataset(name, arrays.x_train[n - n_val:], arrays.y_train[n - n_val:],
                                   eval_batch)
    make_batch = _batch_maker(name, x_train, y_train, seed, augment, cutout,
                              device=None if on_device else "/cpu:0")
    train = _train_indices(len(x_train), batch_size, steps, seed, initial_epoch, epochs)
    if not on_device:
        train = train.map(make_batch, num_parallel_calls=tf.data.AUTOTUNE,
                          deterministic=True).prefetch(tf.data.AUTOTUNE)
    return Datasets(
        train=train,
        prepare=make_batch if on_device else None,
        validation=validation,
        test=_eval_dataset(name, x_test, y_test, eval_batch),
        steps_per_epoch=steps,
        num_classes=arrays.num_classes,
        input_shape=arrays.input_shape,
        train_size=len(x_train),
        validation_size=n_val,
        test_size=len(x_test),
    )
