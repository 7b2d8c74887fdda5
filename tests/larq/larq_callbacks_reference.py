"""What Larq's ``HyperparameterScheduler`` does, for tests/larq/test_larq_callbacks.py.

Larq needs tf-keras, so this script runs in Larq's own environment and never imports bnn::

    TF_USE_LEGACY_KERAS=1 larq-env/bin/python tests/larq/larq_callbacks_reference.py OUT_DIR

It writes into OUT_DIR:

* ``callbacks.json``: per case of Larq's ``callbacks_test.py`` (``normal_optimizer``,
  ``per_step``, ``case_optimizer``) and for ``trace`` (below): the lines the schedulers print
  with ``verbose=1``, the epoch logs of what they schedule, and the hyperparameters' final
  values; ``errors``: the class and message of Larq's error for a wrong ``update_freq`` and for
  a hyperparameter the optimizer does not have; versions.
* ``trace.npz``: a training run of a QuantDense (``ste_sign`` kernel, 10 -> 8, ReLU) and a Dense
  (8 -> 2, softmax) under ``CaseOptimizer((Bop.is_binary_variable, Bop), SGD)`` on 40 samples in
  batches of 8 for 3 epochs, unshuffled, with Bop's ``gamma`` and ``threshold`` scheduled per
  step and SGD's learning rate per epoch (``schedule(epoch, lr)``): its data (``x``, ``y``),
  initial weights (``init/<i>``) and, after every step ``s``, the weights (``step<s>/<i>``) and
  Bop's momentum of the binary kernel (``step<s>/m``). Its schedules (``TRACE_SCHEDULES``) are
  in callbacks.json, under ``cases/trace/schedules``, for the test to use the same.
"""

import contextlib
import io
import json
import os
import sys
from pathlib import Path

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import larq as lq  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from larq.callbacks import HyperparameterScheduler  # noqa: E402

keras = tf.keras
legacy = keras.optimizers.legacy


def scheduler(x):
    """Larq's test schedule."""
    return 1.0 / (1.0 + x)


#: The trace's schedules: gamma and threshold per step (``VALUES[t % 5]``), SGD's learning rate
#: per epoch (``schedule(epoch, lr) = lr * factor``). The threshold alternates between values
#: that stop every flip and values that let many through, and gamma moves by orders of
#: magnitude, so a value kept from an earlier step shows. Written to callbacks.json for the test.
TRACE_SCHEDULES = {"gamma": [1.0, 0.5, 0.05, 0.9, 0.01], "threshold": [1e6, 0.0, 2e-3, 1e6, 1e-4],
                   "lr_factor": 0.5}


def cycle(values):
    return lambda t: values[t % len(values)]


def test_data(samples):
    """Larq's test data shape: 10 features, 2 one-hot classes."""
    rng = np.random.default_rng(1337)
    templates = 4 * rng.random((2, 10))
    y = rng.integers(0, 2, samples)
    x = (templates[y] + rng.normal(size=(samples, 10))).astype("float32")
    return x, keras.utils.to_categorical(y, 2)


def small_bnn():
    """Larq's testing_utils.get_small_bnn_model(10, 20, 2)."""
    return keras.Sequential([
        lq.layers.QuantDense(20, kernel_quantizer="ste_sign", kernel_constraint="weight_clip",
                             activation="relu", input_shape=(10,), use_bias=False),
        keras.layers.BatchNormalization(),
        lq.layers.QuantDense(2, kernel_quantizer="ste_sign", kernel_constraint="weight_clip",
                             input_quantizer="ste_sign", activation="softmax", use_bias=False),
    ])


def fit(model, x, y, callbacks, **kwargs):
    """Fits as Larq's tests do; returns (printed lines, history)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        history = model.fit(x, y, callbacks=callbacks, verbose=0, **kwargs)
    return out.getvalue().splitlines(), history.history


def value(hp) -> float:
    return float(keras.backend.get_value(hp))


def logs(history, names):
    return {name: [float(v) for v in history[name]] for name in names}


def normal_optimizer():
    x, y = test_data(1000)
    model = small_bnn()
    model.compile(loss="categorical_crossentropy", optimizer=keras.optimizers.Adam(0.01))
    lines, history = fit(model, x, y, [HyperparameterScheduler(scheduler, "lr", verbose=1)],
                         epochs=2, batch_size=16)
    return {"printed": lines, "logs": logs(history, ["lr"]),
            "final": {"lr": value(model.optimizer.lr)}}


def per_step():
    x, y = test_data(20)
    model = small_bnn()
    model.compile(loss="categorical_crossentropy", optimizer=keras.optimizers.Adam(0.01))
    lines, history = fit(model, x, y, [HyperparameterScheduler(scheduler, "lr",
                                                               update_freq="step", verbose=1)],
                         epochs=1, batch_size=16)
    return {"printed": lines, "logs": logs(history, ["lr"]),
            "final": {"lr": value(model.optimizer.lr)}}


def case_optimizer():
    x, y = test_data(1000)
    model = small_bnn()
    bop = lq.optimizers.Bop(threshold=1e-6, gamma=1e-3)
    model.compile(loss="categorical_crossentropy", optimizer=lq.optimizers.CaseOptimizer(
        (lq.optimizers.Bop.is_binary_variable, bop), default_optimizer=legacy.Adam(0.01)))
    bop, adam = model.optimizer.optimizers
    callbacks = [HyperparameterScheduler(scheduler, "gamma", bop, verbose=1),
                 HyperparameterScheduler(scheduler, "lr", adam, verbose=1),
                 HyperparameterScheduler(scheduler, "threshold", bop, verbose=1)]
    lines, history = fit(model, x, y, callbacks, epochs=3, batch_size=16)
    return {"printed": lines, "logs": logs(history, ["gamma", "lr", "threshold"]),
            "final": {"gamma": value(bop.gamma), "threshold": value(bop.threshold),
                      "lr": value(adam.lr)}}


def errors():
    found = {}
    try:
        HyperparameterScheduler(scheduler, "lr", update_freq="wrong")
    except Exception as error:  # noqa: BLE001 -- the error is the result
        found["update_freq"] = [type(error).__name__, str(error)]
    x, y = test_data(32)
    model = small_bnn()
    model.compile(loss="categorical_crossentropy", optimizer=keras.optimizers.Adam(0.01))
    try:
        model.fit(x, y, epochs=1, batch_size=16, verbose=0,
                  callbacks=[HyperparameterScheduler(scheduler, "invalid_param", verbose=1)])
    except Exception as error:  # noqa: BLE001
        found["invalid_param"] = [type(error).__name__, str(error)]
    return found


def trace(out_dir: Path):
    x, y = test_data(40)
    rng = np.random.default_rng(7)
    init = [rng.uniform(-1, 1, (10, 8)), 0.3 * rng.normal(size=(8, 2)), np.zeros(2)]
    init = [w.astype("float32") for w in init]
    model = keras.Sequential([
        lq.layers.QuantDense(8, kernel_quantizer="ste_sign", kernel_constraint="weight_clip",
                             activation="relu", input_shape=(10,), use_bias=False),
        keras.layers.Dense(2, activation="softmax"),
    ])
    model.set_weights(init)
    bop = lq.optimizers.Bop(threshold=1e-6, gamma=1e-3)
    model.compile(loss="categorical_crossentropy", optimizer=lq.optimizers.CaseOptimizer(
        (lq.optimizers.Bop.is_binary_variable, bop), default_optimizer=legacy.SGD(0.1)))
    bop, sgd = model.optimizer.optimizers
    arrays = {"x": x, "y": y, **{f"init/{i}": w for i, w in enumerate(init)}}

    def record(batch, logs=None):
        step = int(keras.backend.get_value(bop.iterations)) - 1
        for i, w in enumerate(model.get_weights()):
            arrays[f"step{step}/{i}"] = w
        arrays[f"step{step}/m"] = bop.get_slot(model.layers[0].kernel, "m").numpy()

    callbacks = [
        HyperparameterScheduler(cycle(TRACE_SCHEDULES["gamma"]), "gamma", bop,
                                update_freq="step", verbose=1),
        HyperparameterScheduler(cycle(TRACE_SCHEDULES["threshold"]), "threshold", bop,
                                update_freq="step", verbose=1),
        HyperparameterScheduler(lambda epoch, lr: lr * TRACE_SCHEDULES["lr_factor"], "lr", sgd,
                                verbose=1, log_name="sgd_lr"),
        keras.callbacks.LambdaCallback(on_train_batch_end=record),
    ]
    lines, history = fit(model, x, y, callbacks, epochs=3, batch_size=8, shuffle=False)
    np.savez(out_dir / "trace.npz", **arrays)
    return {"printed": lines, "logs": logs(history, ["gamma", "threshold", "sgd_lr"]),
            "final": {"gamma": value(bop.gamma), "threshold": value(bop.threshold),
                      "lr": value(sgd.lr)},
            "steps": int(keras.backend.get_value(bop.iterations)), "schedules": TRACE_SCHEDULES}


def main(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tf.keras.utils.set_random_seed(1337)
    import importlib.metadata
    result = {"larq": importlib.metadata.version("larq"), "tensorflow": tf.__version__,
              "cases": {"normal_optimizer": normal_optimizer(), "per_step": per_step(),
                        "case_optimizer": case_optimizer(), "trace": trace(out_dir)},
              "errors": errors()}
    (out_dir / "callbacks.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
