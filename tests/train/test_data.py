"""bnn.data: file lookup, reading and validation, download, normalization, deterministic pipelines."""

import functools
import gzip
import http.server
import io
import pickle
import tarfile
import threading
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from bnn.train import data
from bnn.errors import DataError
from support import ROOT

SHARED = ROOT.parent / "shared" / "datasets"


# ---------------------------------------------------------------------------------------------
# Synthetic files


def images(n, shape, offset=0):
    """Distinct uint8 images: example i is filled from a generator seeded with i + offset."""
    return np.stack([np.random.default_rng(i + offset).integers(0, 256, shape, dtype=np.uint8)
                     for i in range(n)]) if n else np.zeros((0, *shape), np.uint8)


def labels(n):
    return (np.arange(n) % 10).astype(np.uint8)


def write_mnist(folder, n_train=60, n_test=10, **replace):
    arrays = {"x_train": images(n_train, (28, 28)), "y_train": labels(n_train),
              "x_test": images(n_test, (28, 28), 1000), "y_test": labels(n_test)}
    arrays.update(replace)
    arrays = {k: v for k, v in arrays.items() if v is not None}
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / "mnist.npz", **arrays)
    return folder / "mnist.npz"


def idx_bytes(array, magic=None, dims=None):
    magic = 0x800 + array.ndim if magic is None else magic
    dims = array.shape if dims is None else dims
    header = magic.to_bytes(4, "big") + b"".join(int(d).to_bytes(4, "big") for d in dims)
    return header + array.astype(np.uint8).tobytes()


FASHION = {"x_train": "train-images-idx3-ubyte.gz", "y_train": "train-labels-idx1-ubyte.gz",
           "x_test": "t10k-images-idx3-ubyte.gz", "y_test": "t10k-labels-idx1-ubyte.gz"}


def write_fashion(folder, n_train=60, n_test=10, sub=True, raw=None):
    """Writes the four gzipped IDX files; ``raw`` maps array names to replacement file contents."""
    target = folder / "fashion-mnist" if sub else folder
    target.mkdir(parents=True, exist_ok=True)
    arrays = {"x_train": images(n_train, (28, 28)), "y_train": labels(n_train),
              "x_test": images(n_test, (28, 28), 1000), "y_test": labels(n_test)}
    for key, fname in FASHION.items():
        content = (raw or {}).get(key)
        if content is None:
            content = gzip.compress(idx_bytes(arrays[key]))
        (target / fname).write_bytes(content)
    return target


def cifar_pickle(n, offset=0, **replace):
    batch = {b"batch_label": b"synthetic", b"data": images(n, (3072,), offset),
             b"labels": [int(v) for v in labels(n)]}
    batch.update({k.encode(): v for k, v in replace.items()})
    batch = {k: v for k, v in batch.items() if v is not None}
    return pickle.dumps(batch, protocol=2)


def cifar_members(n_per_batch=12, n_test=10, replace=None):
    members = {f"data_batch_{i}": cifar_pickle(n_per_batch, 100 * i) for i in range(1, 6)}
    members["test_batch"] = cifar_pickle(n_test, 1000)
    members["batches.meta"] = pickle.dumps({b"label_names": [b"c%d" % i for i in range(10)]})
    for name, content in (replace or {}).items():
        if content is None:
            members.pop(name)
        else:
            members[name] = content
    return members


def write_cifar_dir(folder, **kwargs):
    target = folder / "cifar-10-batches-py"
    target.mkdir(parents=True, exist_ok=True)
    for name, content in cifar_members(**kwargs).items():
        (target / name).write_bytes(content)
    return target


def write_cifar_tar(folder, **kwargs):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "cifar-10-python.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, content in cifar_members(**kwargs).items():
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return path


def expected_cifar_train(n_per_batch=12):
    x = np.concatenate([images(n_per_batch, (3072,), 100 * i) for i in range(1, 6)])
    return x.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """No real cache, no BNN_DATA_DIR, and downloads pointed at an empty local folder."""
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras"))
    monkeypatch.delenv("BNN_DATA_DIR", raising=False)
    (tmp_path / "empty_server").mkdir()
    monkeypatch.setenv("BNN_DATA_URL", (tmp_path / "empty_server").as_uri() + "/")


def cache_dir(tmp_path):
    return tmp_path / "keras" / "datasets"


# ---------------------------------------------------------------------------------------------
# Good files


def test_mnist_npz_loads_with_channel_axis_and_int64_labels(tmp_path):
    write_mnist(tmp_path / "d")
    a = data.load_arrays("mnist", tmp_path / "d")
    assert a.x_train.shape == (60, 28, 28, 1) and a.x_train.dtype == np.uint8
    assert a.x_test.shape == (10, 28, 28, 1)
    assert a.y_train.dtype == np.int64 and a.y_test.dtype == np.int64
    np.testing.assert_array_equal(a.x_train[..., 0], images(60, (28, 28)))
    np.testing.assert_array_equal(a.y_test, labels(10))
    assert a.num_classes == 10 and a.input_shape == (28, 28, 1)
    assert not a.x_train.flags.writeable


@pytest.mark.parametrize("sub", [True, False], ids=["fashion-mnist-subfolder", "flat-folder"])
def test_fashion_idx_gz_loads_from_subfolder_or_folder(tmp_path, sub):
    write_fashion(tmp_path / "d", sub=sub)
    a = data.load_arrays("fashion_mnist", tmp_path / "d")
    assert a.x_train.shape == (60, 28, 28, 1) and a.x_test.shape == (10, 28, 28, 1)
    np.testing.assert_array_equal(a.x_test[..., 0], images(10, (28, 28), 1000))
    np.testing.assert_array_equal(a.y_train, labels(60))
    assert a.y_train.dtype == np.int64 and a.input_shape == (28, 28, 1)


@pytest.mark.parametrize("writer", [write_cifar_tar, write_cifar_dir], ids=["tar.gz", "extracted"])
def test_cifar_loads_from_tar_or_extracted_folder_in_hwc_layout(tmp_path, writer):
    writer(tmp_path / "d")
    a = data.load_arrays("cifar10", tmp_path / "d")
    assert a.x_train.shape == (60, 32, 32, 3) and a.x_train.dtype == np.uint8
    assert a.x_test.shape == (10, 32, 32, 3) and a.input_shape == (32, 32, 3)
    np.testing.assert_array_equal(a.x_train, expected_cifar_train())
    # Row layout is 1024 red, then 1024 green, then 1024 blue values, each row-major.
    row = images(1, (3072,), 100)[0]
    assert a.x_train[0, 0, 1, 2] == row[2 * 1024 + 1]
    np.testing.assert_array_equal(a.y_train, np.tile(labels(12), 5))


def test_cifar_arrays_are_decoded_once_per_process(tmp_path):
    path = write_cifar_tar(tmp_path / "d")
    first = data.load_arrays("cifar10", tmp_path / "d")
    path.write_bytes(b"")  # a re-read would now fail; the size changed, so the cache must miss
    with pytest.raises(DataError):
        data.load_arrays("cifar10", tmp_path / "d")
    write_cifar_tar(tmp_path / "e")
    a = data.load_arrays("cifar10", tmp_path / "e")
    b = data.load_arrays("cifar10", tmp_path / "e")
    assert a.x_train is b.x_train
    np.testing.assert_array_equal(a.x_train, first.x_train)


# ---------------------------------------------------------------------------------------------
# Damaged files


def good_npz_bytes(tmp_path):
    return write_mnist(tmp_path / "good").read_bytes()


def damage_mnist(tmp_path, kind):
    folder = tmp_path / "d"
    if kind == "not-a-zip":
        folder.mkdir()
        (folder / "mnist.npz").write_text("<html>404 not found</html>")
    elif kind == "truncated":
        folder.mkdir()
        (folder / "mnist.npz").write_bytes(good_npz_bytes(tmp_path)[:5000])
    elif kind == "missing-key":
        write_mnist(folder, y_test=None)
    elif kind == "wrong-dtype":
        write_mnist(folder, x_train=images(60, (28, 28)).astype(np.float32))
    elif kind == "wrong-shape":
        write_mnist(folder, x_train=np.zeros((100, 28), np.uint8))
    elif kind == "label-out-of-range":
        write_mnist(folder, y_train=np.full(60, 10, np.uint8))
    elif kind == "count-mismatch":
        write_mnist(folder, y_train=labels(59))
    elif kind == "labels-2d":
        write_mnist(folder, y_test=labels(10)[:, None])
    return folder


MNIST_DAMAGE = {
    "not-a-zip": "cannot be read as a .npz file",
    "truncated": "cannot be read as a .npz file",
    "missing-key": "missing arrays y_test",
    "wrong-dtype": "x_train has shape (60, 28, 28) and dtype float32 but (N, 28, 28) uint8 is expected",
    "wrong-shape": "x_train has shape (100, 28)",
    "label-out-of-range": "y_train has labels in [10, 10] but [0, 9] is expected",
    "count-mismatch": "y_train has 59 labels but x_train has 60 images",
    "labels-2d": "y_test has shape (10, 1)",
}


def assert_helpful(exc_info, path_fragment, problem):
    msg = str(exc_info.value)
    assert "\n" not in msg
    assert path_fragment in msg
    assert problem in msg
    assert "BNN_DATA_DIR" in msg


@pytest.mark.parametrize("kind", sorted(MNIST_DAMAGE))
def test_damaged_mnist_npz_is_a_one_line_data_error(tmp_path, kind):
    folder = damage_mnist(tmp_path, kind)
    with pytest.raises(DataError) as e:
        data.load_arrays("mnist", folder)
    assert_helpful(e, str(folder / "mnist.npz"), MNIST_DAMAGE[kind])
    assert "delete it and download it again" in str(e.value)


def fashion_damage(kind):
    return {
        "truncated-gz": ({"x_train": gzip.compress(idx_bytes(images(60, (28, 28))))[:3000]},
                         "train-images-idx3-ubyte.gz", "cannot be read as a gzip file"),
        "not-gzip": ({"y_test": idx_bytes(labels(10))}, "t10k-labels-idx1-ubyte.gz",
                     "cannot be read as a gzip file"),
        "wrong-magic": ({"x_test": gzip.compress(idx_bytes(images(10, (28, 28)), magic=0x801))},
                        "t10k-images-idx3-ubyte.gz", "magic number 0x00000801 but IDX magic number "
                                                     "0x00000803"),
        "header-count": ({"y_train": gzip.compress(idx_bytes(labels(60), dims=(61,)))},
                         "train-labels-idx1-ubyte.gz", "holds 60 data bytes but its header (61,)"),
        "wrong-image-size": ({"x_train": gzip.compress(idx_bytes(images(60, (27, 29))))},
                             "train-images-idx3-ubyte.gz", "shape (60, 27, 29)"),
        "count-mismatch": ({"y_train": gzip.compress(idx_bytes(labels(50)))},
                           "train-labels-idx1-ubyte.gz", "has 50 labels but "
                                                         "train-images-idx3-ubyte.gz has 60 images"),
        "label-out-of-range": ({"y_train": gzip.compress(idx_bytes(labels(60) + 5))},
                               "train-labels-idx1-ubyte.gz", "labels in [5, 14]"),
        "empty": ({"y_test": gzip.compress(b"")}, "t10k-labels-idx1-ubyte.gz", "a too short file"),
    }[kind]


@pytest.mark.parametrize("kind", ["truncated-gz", "not-gzip", "wrong-magic", "header-count",
                                  "wrong-image-size", "count-mismatch", "label-out-of-range", "empty"])
def test_damaged_fashion_idx_is_a_one_line_data_error(tmp_path, kind):
    raw, fname, problem = fashion_damage(kind)
    folder = write_fashion(tmp_path / "d", raw=raw)
    with pytest.raises(DataError) as e:
        data.load_arrays("fashion_mnist", tmp_path / "d")
    assert_helpful(e, str(folder / fname), problem)


class Evil:
    def __reduce__(self):
        return (Path.touch, (Path("/tmp/bnn-data-test-pwned"),))


CIFAR_DAMAGE = {
    "missing-test-batch": ({"test_batch": None}, "missing batches test_batch"),
    "missing-labels": ({"data_batch_2": cifar_pickle(12, labels=None)}, "missing keys labels"),
    "wrong-data-shape": ({"data_batch_3": cifar_pickle(12, data=np.zeros((12, 1024), np.uint8))},
                         "data has shape (12, 1024) and dtype uint8 but (N, 3072) uint8"),
    "wrong-data-dtype": ({"test_batch": cifar_pickle(10, data=np.zeros((10, 3072), np.int32))},
                         "dtype int32"),
    "label-count": ({"data_batch_1": cifar_pickle(12, labels=[1, 2, 3])},
                    "labels has 3 labels but data has 12 images"),
    "label-range": ({"data_batch_5": cifar_pickle(12, labels=[-1] * 12)}, "labels in [-1, -1]"),
    "garbage-pickle": ({"data_batch_4": b"\x80\x02garbage"}, "cannot be unpickled"),
    "code-in-pickle": ({"test_batch": pickle.dumps({b"data": Evil()})}, "refusing to load"),
    "not-a-dict": ({"data_batch_1": pickle.dumps([1, 2, 3])}, "holds a list, not a dict"),
}


@pytest.mark.parametrize("layout", ["tar", "dir"])
@pytest.mark.parametrize("kind", sorted(CIFAR_DAMAGE))
def test_damaged_cifar_is_a_one_line_data_error(tmp_path, kind, layout):
    replace, problem = CIFAR_DAMAGE[kind]
    writer = write_cifar_tar if layout == "tar" else write_cifar_dir
    path = writer(tmp_path / "d", replace=replace)
    with pytest.raises(DataError) as e:
        data.load_arrays("cifar10", tmp_path / "d")
    assert_helpful(e, str(path), problem)
    assert not Path("/tmp/bnn-data-test-pwned").exists()


@pytest.mark.parametrize("cut", [0, 100, 20000], ids=["empty", "header-only", "mid-member"])
def test_truncated_cifar_tar_is_a_data_error(tmp_path, cut):
    path = write_cifar_tar(tmp_path / "d")
    path.write_bytes(path.read_bytes()[:cut])
    with pytest.raises(DataError) as e:
        data.load_arrays("cifar10", tmp_path / "d")
    assert_helpful(e, str(path), "cifar-10-python.tar.gz at")


# ---------------------------------------------------------------------------------------------
# Lookup order and download


def test_relative_data_dirs_are_read_as_absolute_paths_from_the_working_folder(tmp_path,
                                                                                  monkeypatch):
    write_mnist(tmp_path / "data", n_train=20)
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.setenv("BNN_DATA_DIR", "../data")
    assert data.search_dirs()[0] == tmp_path / "data"
    assert data.search_dirs("../data")[0].is_absolute()
    assert len(data.load_arrays("mnist").x_train) == 20
    assert len(data.load_arrays("mnist", "../data").x_train) == 20


def test_lookup_order_data_dir_then_env_then_keras_cache(tmp_path, monkeypatch):
    write_mnist(tmp_path / "arg", n_train=20)
    write_mnist(tmp_path / "env", n_train=30)
    write_mnist(cache_dir(tmp_path), n_train=40)
    monkeypatch.setenv("BNN_DATA_DIR", str(tmp_path / "env"))
    assert len(data.load_arrays("mnist", tmp_path / "arg").x_train) == 20
    assert len(data.load_arrays("mnist").x_train) == 30
    monkeypatch.delenv("BNN_DATA_DIR")
    assert len(data.load_arrays("mnist").x_train) == 40
    # A folder without the file falls through to the cache.
    assert len(data.load_arrays("mnist", tmp_path / "nothing-here").x_train) == 40
    assert data.search_dirs(tmp_path / "arg") == [tmp_path / "arg", cache_dir(tmp_path)]


def test_download_from_file_url_lands_atomically_in_keras_cache(tmp_path, monkeypatch):
    write_mnist(tmp_path / "server", n_train=25)
    monkeypatch.setenv("BNN_DATA_URL", (tmp_path / "server").as_uri())
    a = data.load_arrays("mnist", tmp_path / "empty")
    assert len(a.x_train) == 25
    assert sorted(p.name for p in cache_dir(tmp_path).iterdir()) == ["mnist.npz"]


@pytest.fixture
def http_server(tmp_path):
    root = tmp_path / "http"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}/datasets"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("name", ["fashion_mnist", "cifar10"])
def test_download_over_http_from_loopback_server(tmp_path, monkeypatch, http_server, name):
    root, url = http_server
    if name == "fashion_mnist":
        for f in write_fashion(tmp_path / "src").iterdir():
            (root / "datasets").mkdir(exist_ok=True)
            (root / "datasets" / f.name).write_bytes(f.read_bytes())
        expected = [f"fashion-mnist/{f}" for f in FASHION.values()]
    else:
        write_cifar_tar(root / "datasets")
        expected = ["cifar-10-python.tar.gz"]
    monkeypatch.setenv("BNN_DATA_URL", url)
    a = data.load_arrays(name)
    assert len(a.x_train) == 60 and len(a.y_test) == 10
    files = sorted(str(p.relative_to(cache_dir(tmp_path))) for p in cache_dir(tmp_path).rglob("*")
                   if p.is_file())
    assert files == sorted(expected)


@pytest.mark.parametrize("name, looked_for", [
    ("mnist", "mnist.npz"),
    ("fashion_mnist", "train-images-idx3-ubyte.gz"),
    ("cifar10", "cifar-10-python.tar.gz or cifar-10-batches-py/"),
])
def test_failed_download_names_files_folders_and_fix(tmp_path, monkeypatch, name, looked_for):
    monkeypatch.setenv("BNN_DATA_DIR", str(tmp_path / "env"))
    with pytest.raises(DataError) as e:
        data.load_arrays(name)
    msg = str(e.value)
    assert "\n" not in msg
    assert looked_for in msg
    assert str(tmp_path / "env") in msg and str(cache_dir(tmp_path)) in msg
    assert "download of file://" in msg
    assert "BNN_DATA_DIR" in msg and "--data-dir" in msg
    leftovers = [p for p in cache_dir(tmp_path).rglob("*") if p.is_file()]
    assert leftovers == []


# ---------------------------------------------------------------------------------------------
# Normalization


def test_normalize_mnist_maps_0_255_to_minus1_1_for_numpy_and_tensors():
    x = np.array([0, 51, 127, 255], np.uint8)
    out = data.normalize("mnist", x)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    np.testing.assert_allclose(out, x / 127.5 - 1, atol=1e-6)
    assert out[0] == -1.0 and out[-1] == 1.0
    t = data.normalize("fashion_mnist", tf.constant(x))
    assert isinstance(t, tf.Tensor) and t.dtype == tf.float32
    np.testing.assert_allclose(t.numpy(), out, atol=1e-6)


def test_normalize_cifar_standardizes_each_channel_with_fixed_constants():
    x = np.random.default_rng(0).integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)
    expected = (x / 255.0 - np.array(data.CIFAR10_MEAN)) / np.array(data.CIFAR10_STD)
    out = data.normalize("cifar10", x)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, expected, atol=1e-5)
    np.testing.assert_allclose(data.normalize("cifar10", tf.constant(x)).numpy(), expected, atol=1e-5)
    mean_image = np.round(np.array(data.CIFAR10_MEAN) * 255).astype(np.uint8)
    assert np.abs(data.normalize("cifar10", mean_image)).max() < 0.01


# ---------------------------------------------------------------------------------------------
# Pipelines


def batches(ds):
    return [(x.numpy(), y.numpy()) for x, y in ds]


def test_pipeline_shapes_dtypes_steps_and_splits(tmp_path):
    write_mnist(tmp_path / "d", n_train=60, n_test=10)
    d = data.make_datasets("mnist", 16, epochs=2, data_dir=tmp_path / "d", test_batch_size=4)
    assert (d.steps_per_epoch, d.train_size, d.validation_size, d.test_size) == (3, 60, 0, 10)
    assert d.validation is None and d.num_classes == 10 and d.input_shape == (28, 28, 1)
    train = batches(d.train)
    assert len(train) == 2 * 3 == d.train.cardinality().numpy()
    for x, y in train:
        assert x.shape == (16, 28, 28, 1) and x.dtype == np.float32 and y.dtype == np.int64
        assert x.min() >= -1 and x.max() <= 1
    test = batches(d.test)
    assert [len(y) for _, y in test] == [4, 4, 2]
    a = data.load_arrays("mnist", tmp_path / "d")
    np.testing.assert_allclose(np.concatenate([x for x, _ in test]), data.normalize("mnist", a.x_test))
    np.testing.assert_array_equal(np.concatenate([y for _, y in test]), a.y_test)


def test_validation_split_comes_from_the_end_before_limit_train(tmp_path):
    write_mnist(tmp_path / "d", n_train=60, n_test=10)
    d = data.make_datasets("mnist", 4, validation_split=0.25, limit_train=20, limit_test=6,
                           data_dir=tmp_path / "d")
    assert (d.train_size, d.validation_size, d.test_size, d.steps_per_epoch) == (20, 15, 6, 5)
    a = data.load_arrays("mnist", tmp_path / "d")
    val = batches(d.validation)
    np.testing.assert_allclose(np.concatenate([x for x, _ in val]), data.normalize("mnist", a.x_train[45:]))
    seen = np.concatenate([y for _, y in batches(d.train)])
    assert sorted(seen) == sorted(a.y_train[:20])
    assert sum(len(y) for _, y in batches(d.test)) == 6


def test_epoch_order_is_the_numpy_permutation_of_seed_and_epoch(tmp_path):
    write_mnist(tmp_path / "d", n_train=50)
    d = data.make_datasets("mnist", 8, seed=7, epochs=2, augment=False, data_dir=tmp_path / "d")
    a = data.load_arrays("mnist", tmp_path / "d")
    train = batches(d.train)
    for epoch in range(2):
        order = np.random.default_rng([7, epoch]).permutation(50)[:6 * 8]
        x = np.concatenate([x for x, _ in train[6 * epoch:6 * epoch + 6]])
        np.testing.assert_allclose(x, data.normalize("mnist", a.x_train[order]))
    assert not np.array_equal(train[0][0], train[6][0])


def test_resumed_pipeline_yields_the_same_batches_as_an_uninterrupted_one(tmp_path):
    write_cifar_tar(tmp_path / "d")
    full = batches(data.make_datasets("cifar10", 8, seed=3, epochs=4, data_dir=tmp_path / "d").train)
    resumed = data.make_datasets("cifar10", 8, seed=3, epochs=4, initial_epoch=2, data_dir=tmp_path / "d")
    assert resumed.steps_per_epoch == 7 and len(full) == 28
    again = batches(resumed.train)
    assert len(again) == 14
    for (x1, y1), (x2, y2) in zip(full[14:], again):
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)
    other_seed = batches(data.make_datasets("cifar10", 8, seed=4, epochs=1, data_dir=tmp_path / "d").train)
    assert not np.array_equal(other_seed[0][0], full[0][0])


def test_cifar_augmentation_is_a_padded_crop_or_flip_of_each_image(tmp_path):
    write_cifar_tar(tmp_path / "d")
    kw = dict(seed=5, epochs=1, data_dir=tmp_path / "d")
    (xa, ya), = batches(data.make_datasets("cifar10", 32, augment=True, **kw).train.take(1))
    (xp, yp), = batches(data.make_datasets("cifar10", 32, augment=False, **kw).train.take(1))
    np.testing.assert_array_equal(ya, yp)
    assert xa.shape == xp.shape == (32, 32, 32, 3) and xa.dtype == np.float32
    assert not np.allclose(xa, xp)
    mean, std = np.array(data.CIFAR10_MEAN), np.array(data.CIFAR10_STD)
    pixels = lambda z: np.round((z * std + mean) * 255).astype(np.int64)  # noqa: E731
    aug, plain = pixels(xa), pixels(xp)
    shifted = 0
    for a, p in zip(aug, plain):
        padded = np.pad(p, [(4, 4), (4, 4), (0, 0)])
        crops = {(dy, dx, flip) for dy in range(9) for dx in range(9) for flip in (0, 1)
                 if np.array_equal(a, (lambda c: c[:, ::-1] if flip else c)(padded[dy:dy + 32, dx:dx + 32]))}
        assert crops, "augmented image is not a crop/flip of its source"
        shifted += (4, 4, 0) not in crops
    assert shifted > 16


def test_mnist_augmentation_is_a_shift_of_at_most_two_pixels_without_flip(tmp_path):
    write_mnist(tmp_path / "d", n_train=64)
    kw = dict(seed=2, epochs=1, data_dir=tmp_path / "d")
    (xa, ya), = batches(data.make_datasets("mnist", 64, augment=True, **kw).train.take(1))
    (xp, yp), = batches(data.make_datasets("mnist", 64, augment=False, **kw).train.take(1))
    np.testing.assert_array_equal(ya, yp)
    assert xa.shape == xp.shape and not np.allclose(xa, xp)
    aug, plain = (np.round((z + 1) * 127.5).astype(np.int64) for z in (xa, xp))
    shifted = 0
    for a, p in zip(aug, plain):
        padded = np.pad(p, [(2, 2), (2, 2), (0, 0)])
        crops = {(dy, dx) for dy in range(5) for dx in range(5)
                 if np.array_equal(a, padded[dy:dy + 28, dx:dx + 28])}
        assert crops, "augmented image is not a shifted copy of its source"
        shifted += (2, 2) not in crops
    assert shifted > 32


def test_keras_fit_with_initial_epoch_consumes_each_epoch_once(tmp_path):
    write_mnist(tmp_path / "d", n_train=40)
    d = data.make_datasets("mnist", 10, seed=1, epochs=3, initial_epoch=1, data_dir=tmp_path / "d")
    expected = [y for _, y in batches(d.train)]
    seen = []

    class Recorder(keras.Model):
        def train_step(self, batch):
            seen.append(batch[1].numpy())
            return {"seen": len(seen)}

    inputs = keras.Input((28, 28, 1))
    model = Recorder(inputs, keras.layers.Flatten()(inputs))
    model.compile(run_eagerly=True)
    model.fit(d.train, epochs=3, initial_epoch=1, steps_per_epoch=d.steps_per_epoch, shuffle=False, verbose=0)
    assert len(seen) == 2 * d.steps_per_epoch
    for got, want in zip(seen, expected):
        np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------------------------------------
# Bad arguments


@pytest.mark.parametrize("kwargs, problem", [
    (dict(name="svhn"), "unknown dataset 'svhn'; known datasets: mnist, fashion_mnist, cifar10"),
    (dict(batch_size=61), "batch_size 61 is larger than the 60 mnist training examples"),
    (dict(batch_size=16, validation_split=0.8), "batch_size 16 is larger than the 12"),
    (dict(validation_split=1.0), "validation_split must be in [0, 1), got 1.0"),
    (dict(validation_split=-0.1), "validation_split must be in [0, 1)"),
    (dict(validation_split=0.001), "is empty; raise validation_split"),
    (dict(batch_size=0), "batch_size must be an integer >= 1, got 0"),
    (dict(epochs=2, initial_epoch=2), "initial_epoch (2) must be smaller than epochs (2)"),
])
def test_bad_arguments_are_one_line_data_errors(tmp_path, kwargs, problem):
    write_mnist(tmp_path / "d", n_train=60)
    args = dict(name="mnist", batch_size=8, data_dir=tmp_path / "d") | kwargs
    with pytest.raises(DataError) as e:
        data.make_datasets(**args)
    assert problem in str(e.value) and "\n" not in str(e.value)


def test_unknown_name_in_load_arrays_and_normalize():
    with pytest.raises(DataError, match="known datasets: mnist, fashion_mnist, cifar10"):
        data.load_arrays("imagenet")
    with pytest.raises(DataError, match="unknown dataset 'MNIST'"):
        data.normalize("MNIST", np.zeros(3, np.uint8))


# ---------------------------------------------------------------------------------------------
# Real files (skipped where absent)

REAL_COUNTS = {
    "mnist": ([5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949],
              [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]),
    "fashion_mnist": ([6000] * 10, [1000] * 10),
    "cifar10": ([5000] * 10, [1000] * 10),
}


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared dataset folder absent")
@pytest.mark.parametrize("name", data.DATASETS)
def test_real_files_have_the_published_class_counts(name):
    a = data.load_arrays(name, SHARED)
    train, test = REAL_COUNTS[name]
    np.testing.assert_array_equal(np.bincount(a.y_train, minlength=10), train)
    np.testing.assert_array_equal(np.bincount(a.y_test, minlength=10), test)
    assert a.x_train.shape[1:] == a.input_shape == ((32, 32, 3) if name == "cifar10" else (28, 28, 1))
