"""bnn.data: cutout and the on-device pipeline (batches made from indices inside the step) are
deterministic in (seed, epoch) and equal to the host pipeline's batches."""

import numpy as np
import pytest
import tensorflow as tf

from bnn.train import data
from test_data import batches, write_cifar_tar


@pytest.fixture
def cifar(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras"))
    write_cifar_tar(tmp_path / "d")
    return tmp_path / "d"


def prepared(ds):
    """The on-device pipeline's batches, made eagerly by ``ds.prepare``."""
    return [tuple(t.numpy() for t in ds.prepare(element)) for element in ds.train]


@pytest.mark.parametrize("cutout", [0, 8])
def test_on_device_batches_equal_the_host_pipeline_batches(cifar, cutout):
    kw = dict(seed=2, epochs=2, data_dir=cifar, cutout=cutout)
    host = data.make_datasets("cifar10", 8, **kw)
    device = data.make_datasets("cifar10", 8, on_device=True, **kw)
    assert host.prepare is None and device.prepare is not None
    assert device.train.cardinality().numpy() == host.train.cardinality().numpy() == 14
    first = next(iter(device.train))
    assert set(first) == {"epoch", "step", "index"} and first["index"].dtype == tf.int64
    for (x1, y1), (x2, y2) in zip(batches(host.train), prepared(device)):
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)


def test_on_device_pipeline_resumed_at_an_epoch_yields_the_same_batches(cifar):
    kw = dict(seed=3, epochs=3, data_dir=cifar, cutout=6, on_device=True)
    full = prepared(data.make_datasets("cifar10", 8, **kw))
    resumed = prepared(data.make_datasets("cifar10", 8, initial_epoch=2, **kw))
    assert len(full) == 21 and len(resumed) == 7
    for (x1, y1), (x2, y2) in zip(full[14:], resumed):
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)


def test_cutout_zeroes_one_clipped_square_per_image_and_leaves_the_rest(cifar):
    kw = dict(seed=4, epochs=1, data_dir=cifar)
    (plain, y1), = batches(data.make_datasets("cifar10", 32, **kw).train.take(1))
    (cut, y2), = batches(data.make_datasets("cifar10", 32, cutout=8, **kw).train.take(1))
    np.testing.assert_array_equal(y1, y2)
    changed = np.any(cut != plain, axis=-1)  # (B, H, W)
    for image, mask, source in zip(cut, changed, plain):
        rows, cols = np.nonzero(mask)
        assert (image[mask] == 0).all()
        if len(rows):
            box = (slice(rows.min(), rows.max() + 1), slice(cols.min(), cols.max() + 1))
            assert (image[box] == 0).all()  # the zeros form one rectangle
            assert rows.max() - rows.min() < 8 and cols.max() - cols.min() < 8
            # a square cut off by the border only: inside the image it is 8 wide
            assert rows.max() - rows.min() == 7 or rows.min() == 0 or rows.max() == 31
            assert cols.max() - cols.min() == 7 or cols.min() == 0 or cols.max() == 31
        np.testing.assert_array_equal(image[~mask], source[~mask])
    assert changed.any(axis=(1, 2)).sum() >= 30  # a square can only hide in zero pixels


def test_cutout_squares_depend_on_seed_epoch_and_step(cifar):
    kw = dict(epochs=2, augment=False, data_dir=cifar, cutout=8)
    a = batches(data.make_datasets("cifar10", 16, seed=1, **kw).train)
    b = batches(data.make_datasets("cifar10", 16, seed=1, **kw).train)
    c = batches(data.make_datasets("cifar10", 16, seed=9, **kw).train)
    for (xa, _), (xb, _) in zip(a, b):
        np.testing.assert_array_equal(xa, xb)
    assert not np.array_equal(a[0][0] == 0, c[0][0] == 0)


def test_negative_cutout_is_a_data_error(cifar):
    with pytest.raises(data.DataError, match="cutout must be an integer >= 0"):
        data.make_datasets("cifar10", 8, data_dir=cifar, cutout=-1)
