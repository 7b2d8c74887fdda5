"""Larq's BinaryNet CIFAR-10 tutorial (larq/docs, docs/larq/tutorials/binarynet_cifar10.ipynb),
cell by cell as a Larq user runs it, with two changes only: ``import bnn.larq as lq`` in place of
``import larq as lq``, and Keras 3's optimizer arguments (``learning_rate=`` for ``lr=``, and the
``decay=`` that Keras 3 no longer takes written as the schedule it stood for).

For the test's time, the data are cut to a few hundred images and the 100 epochs to 2; both are
marked below and substituted into the tutorial's own lines. The CIFAR-10 download becomes the
copy in ``$BNN_DATA_DIR`` (no network here). The model cell is the one
``larq_summary_reference.py`` builds with Larq itself.
"""

import importlib.util
from pathlib import Path

import matplotlib
import numpy as np
import pytest

from support import DATA_DIR

matplotlib.use("Agg")

N_TRAIN, N_TEST, EPOCHS = 600, 200, 2

# The tutorial's model cell, as tests/larq/larq_summary_reference.py holds it for Larq itself.
_spec = importlib.util.spec_from_file_location(
    "larq_summary_reference", Path(__file__).with_name("larq_summary_reference.py"))
_reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_reference)
MODEL = _reference.source("binarynet_cifar10")

# Cell by cell; the sizes and epochs are the tutorial's (50000, 10000, 100) until substituted.
TUTORIAL = '''
import tensorflow as tf
import bnn.larq as lq
import numpy as np
import matplotlib.pyplot as plt

num_classes = 10

(train_images, train_labels), (test_images, test_labels) = tf.keras.datasets.cifar10.load_data()

train_images = train_images.reshape((50000, 32, 32, 3)).astype("float32")
test_images = test_images.reshape((10000, 32, 32, 3)).astype("float32")

# Normalize pixel values to be between -1 and 1
train_images, test_images = train_images / 127.5 - 1, test_images / 127.5 - 1

train_labels = tf.keras.utils.to_categorical(train_labels, num_classes)
test_labels = tf.keras.utils.to_categorical(test_labels, num_classes)

{model}
lq.models.summary(model)

model.compile(
    tf.keras.optimizers.Adam(learning_rate=tf.keras.optimizers.schedules.InverseTimeDecay(
        0.01, decay_steps=1, decay_rate=0.0001)),
    loss="categorical_crossentropy",
    metrics=["accuracy"],
)

trained_model = model.fit(
    train_images,
    train_labels,
    batch_size=50,
    epochs=100,
    validation_data=(test_images, test_labels),
    shuffle=True
)

plt.plot(trained_model.history['accuracy'])
plt.plot(trained_model.history['val_accuracy'])
plt.title('model accuracy')
plt.ylabel('accuracy')
plt.xlabel('epoch')
plt.legend(['train', 'test'], loc='upper left')

print(np.max(trained_model.history['accuracy']))
print(np.max(trained_model.history['val_accuracy']))

plt.plot(trained_model.history['loss'])
plt.plot(trained_model.history['val_loss'])
plt.title('model loss')
plt.ylabel('loss')
plt.xlabel('epoch')
plt.legend(['train', 'test'], loc='upper left')

print(np.min(trained_model.history['loss']))
print(np.min(trained_model.history['val_loss']))
'''


@pytest.fixture
def cifar_subset(monkeypatch):
    """``tf.keras.datasets.cifar10.load_data`` answering with the first images of the shared
    copy, in Keras' format (uint8 images, labels of shape (N, 1))."""
    if not (DATA_DIR / "cifar-10-python.tar.gz").exists():
        pytest.skip(f"needs cifar-10-python.tar.gz in {DATA_DIR} (set BNN_DATA_DIR)")
    import tensorflow as tf

    from bnn.train import data

    arrays = data.load_arrays("cifar10", DATA_DIR)
    subset = ((arrays.x_train[:N_TRAIN], arrays.y_train[:N_TRAIN, None]),
              (arrays.x_test[:N_TEST], arrays.y_test[:N_TEST, None]))
    monkeypatch.setattr(tf.keras.datasets.cifar10, "load_data", lambda: subset)


def test_binarynet_cifar10_tutorial_runs_unchanged_but_for_the_import(cifar_subset, capsys):
    source = (TUTORIAL.replace("{model}", MODEL).replace("(50000,", f"({N_TRAIN},").replace("(10000,", f"({N_TEST},")
              .replace("epochs=100", f"epochs={EPOCHS}"))
    namespace: dict = {}
    exec(compile(source, "binarynet_cifar10", "exec"), namespace)  # noqa: S102 - the tutorial
    printed = capsys.readouterr().out

    # The summary prints the totals Larq's tutorial shows for this model.
    assert "10352000" in printed.replace(",", "") and "7700" in printed.replace(",", "")
    history = namespace["trained_model"].history
    for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
        assert len(history[key]) == EPOCHS and np.isfinite(history[key]).all(), key
    assert history["loss"][-1] < history["loss"][0]  # it learns
    assert history["accuracy"][-1] > 0.2  # chance is 0.1

    model = namespace["model"]
    for layer in model.layers:  # binary kernels are +-1, the latent ones clipped to [-1, 1]
        if hasattr(layer, "binary_kernel"):
            kernel = np.asarray(layer.binary_kernel())
            assert set(np.unique(kernel)) <= {-1.0, 1.0}
            assert np.abs(np.asarray(layer.kernel)).max() <= 1.0
