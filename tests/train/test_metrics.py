import keras
import numpy as np
import pytest

import bnn
from bnn import models
from bnn.train.metrics import FlipRatio, flip_ratio


def test_flip_ratio_counts_sign_changes_with_zero_as_positive():
    before = np.array([[0.5, -0.2], [0.0, -1.0], [0.3, 0.1]])
    after = np.array([[-0.5, -0.1], [-0.0, 0.0], [0.3, -0.1]])
    # flips: 0.5->-0.5, -1.0->0.0 (0 counts as +), 0.1->-0.1; 0.0->-0.0 is no flip (both >= 0)
    assert flip_ratio(before, after) == pytest.approx(3 / 6)
    assert flip_ratio(before, before) == 0.0


def test_flip_ratio_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="one shape"):
        flip_ratio(np.zeros((2, 3)), np.zeros((3, 2)))


def two_layer_model():
    model = keras.Sequential([
        keras.Input((4,)),
        bnn.BinaryDense(5, input_quantizer=None, name="a"),
        keras.layers.BatchNormalization(name="bn"),
        bnn.BinaryDense(2, name="b"),
        bnn.BinaryDense(3, precision="float", name="float_layer"),
    ])
    model.get_layer("a").kernel.assign(np.ones((4, 5), "float32"))
    model.get_layer("b").kernel.assign(-np.ones((5, 2), "float32"))
    return model


def test_callback_reports_known_flips_overall_and_per_layer():
    model = two_layer_model()
    callback = FlipRatio()
    callback.set_model(model)
    callback.on_train_begin()
    a, b = model.get_layer("a").kernel, model.get_layer("b").kernel
    a.assign(np.where(np.arange(20).reshape(4, 5) < 3, -1.0, 1.0).astype("float32"))  # 3 of 20
    b.assign(np.ones((5, 2), "float32"))  # all 10 flip
    model.get_layer("float_layer").kernel.assign(np.zeros((2, 3), "float32"))  # not watched
    logs = {}
    callback.on_epoch_end(0, logs)
    assert logs == {"flip_ratio": pytest.approx(13 / 30), "flip_ratio/a": pytest.approx(3 / 20),
                    "flip_ratio/b": pytest.approx(1.0)}
    logs = {}
    callback.on_epoch_end(1, logs)  # compared with the previous measurement: nothing changed
    assert logs["flip_ratio"] == 0.0
    assert [h["flip_ratio"] for h in callback.history] == pytest.approx([13 / 30, 0.0])


def test_callback_rejects_models_without_binary_kernels():
    callback = FlipRatio()
    callback.set_model(models.binarynet_mlp("float", input_shape=(4,), hidden_units=(3,)))
    with pytest.raises(ValueError, match="no binary kernels"):
        callback.on_train_begin()
    with pytest.raises(ValueError, match="every must be one of"):
        FlipRatio(every="step")


@pytest.mark.parametrize("every", ["epoch", "batch"])
def test_callback_inside_fit_writes_flip_ratio_into_history(every):
    keras.utils.set_random_seed(1)
    model = models.binarynet_mlp(input_shape=(8, 8), hidden_units=(16,), num_classes=3)
    model.compile(optimizer=keras.optimizers.SGD(0.5), jit_compile=True,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(128, 8, 8)).astype("float32")
    y = rng.integers(0, 3, size=128)
    callback = FlipRatio(every=every)
    history = model.fit(x, y, epochs=2, batch_size=32, verbose=0, callbacks=[callback])
    ratios = history.history["flip_ratio"]
    assert len(ratios) == 2 and 0 < ratios[0] <= 1
    assert len(history.history["flip_ratio/dense0"]) == 2
    assert len(callback.history) == (2 if every == "epoch" else 8)
    if every == "batch":
        assert ratios[0] == pytest.approx(np.mean([h["flip_ratio"] for h in callback.history[:4]]))


def test_tensorboard_after_the_callback_logs_the_flip_ratios(tmp_path):
    import tensorflow as tf

    model = models.binarynet_mlp(input_shape=(4,), hidden_units=(8,), num_classes=2)
    model.compile(optimizer=keras.optimizers.SGD(0.5),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.default_rng(2).normal(size=(32, 4)).astype("float32")
    model.fit(x, (x[:, 0] > 0).astype("int32"), epochs=1, verbose=0,
              callbacks=[FlipRatio(), keras.callbacks.TensorBoard(str(tmp_path))])
    tags = {value.tag for path in (tmp_path / "train").iterdir()
            for event in tf.compat.v1.train.summary_iterator(str(path))
            for value in event.summary.value}
    assert {"epoch_flip_ratio", "epoch_flip_ratio/dense0", "epoch_flip_ratio/dense_out"} <= tags
