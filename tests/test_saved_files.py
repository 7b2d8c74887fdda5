"""Files saved by an earlier bnn (tests/fixtures/v0.1.0) load without custom objects and give the
outputs they gave when they were written."""

from pathlib import Path

import keras
import numpy as np
import pytest

import bnn  # noqa: F401  (registers bnn's Keras objects)
from bnn.packed import export

FIXTURES = Path(__file__).parent / "fixtures" / "v0.1.0"
RECORDED = np.load(FIXTURES / "outputs.npz")
KERAS_FILES = sorted(path.name for path in FIXTURES.glob("*.keras"))
# Float rounding may differ between CPUs (oneDNN or Eigen kernels); binary layers' products are
# exact, so outputs agree to rounding.
TOLERANCE = dict(rtol=1e-4, atol=1e-4)


def test_every_fixture_has_recorded_outputs():
    assert len(KERAS_FILES) == 8
    for name in KERAS_FILES + ["binarynet_mlp_uint8.bnn", "vgg_small.bnn"]:
        assert f"{name.removesuffix('.keras')}/y" in RECORDED or f"{name}/y" in RECORDED


@pytest.mark.parametrize("name", KERAS_FILES)
def test_a_saved_keras_file_loads_with_its_optimizer_and_gives_its_recorded_outputs(name):
    model = keras.saving.load_model(FIXTURES / name)
    stem = name.removesuffix(".keras")
    outputs = np.asarray(model(RECORDED[f"{stem}/x"], training=False))
    np.testing.assert_allclose(outputs, RECORDED[f"{stem}/y"], **TOLERANCE)
    if stem != "vgg_small_float":  # trained, so saved with its optimizer's state
        assert model.optimizer is not None and int(model.optimizer.iterations) > 0


def test_a_reloaded_file_saves_again_to_the_same_model(tmp_path):
    model = keras.saving.load_model(FIXTURES / "every_layer.keras")
    model.save(tmp_path / "again.keras")
    again = keras.saving.load_model(tmp_path / "again.keras")
    assert again.get_config() == model.get_config()
    x = RECORDED["every_layer/x"]
    np.testing.assert_array_equal(np.asarray(again(x, training=False)),
                                  np.asarray(model(x, training=False)))


@pytest.mark.parametrize("name", ["binarynet_mlp_uint8.bnn", "vgg_small.bnn"])
def test_a_packed_file_loads_and_gives_its_recorded_logits(name):
    packed = export.load_packed(FIXTURES / name)
    logits = packed.predict(RECORDED[f"{name}/x"])
    np.testing.assert_allclose(logits, RECORDED[f"{name}/packed"], **TOLERANCE)
    keras_logits = RECORDED[f"{name}/y"]
    assert (logits.argmax(-1) == keras_logits.argmax(-1)).all()
