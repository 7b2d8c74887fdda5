"""Larq's tests of ``HyperparameterScheduler`` (larq/callbacks_test.py) on bnn.larq, and the
scheduler against Larq itself.

``tests/larq/larq_callbacks_reference.py`` runs in Larq's own environment (Larq needs tf-keras,
which must not share a process with bnn): it runs the cases of Larq's test and a training run
whose Bop ``gamma`` and ``threshold`` change at every step, recording what the schedulers print
and log and the weights and Bop momentum after every step. Here the same runs on bnn.larq must
print and log the same, and train step by step to the same weights, eagerly, under
``tf.function`` and under XLA. Without the Larq environment those tests skip, saying so; the
ports of Larq's tests check Larq's assertions without it.
"""

import contextlib
import io
import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import bnn.larq as lq
from bnn.larq.callbacks import HyperparameterScheduler
from support import larq_script_output, run_events

Bop, CaseOptimizer = lq.optimizers.Bop, lq.optimizers.CaseOptimizer


@pytest.fixture(scope="module")
def larq_reference(request):
    """Runs larq_callbacks_reference.py in Larq's environment; returns (callbacks.json, trace).

    Kept in pytest's cache, keyed by the script and the Larq python (``pytest --cache-clear``
    rebuilds it)."""
    out = larq_script_output(request, "larq_callbacks_reference.py", "callbacks.json")
    reference = json.loads((out / "callbacks.json").read_text())
    assert reference["larq"] == "0.14.0", reference["larq"]
    return reference, np.load(out / "trace.npz")


def scheduler(x):
    """Larq's test schedule."""
    return 1.0 / (1.0 + x)


def _test_data(samples):
    """Larq's test data: 10 features, 2 one-hot classes (as the reference script makes it)."""
    rng = np.random.default_rng(1337)
    templates = 4 * rng.random((2, 10))
    y = rng.integers(0, 2, samples)
    x = (templates[y] + rng.normal(size=(samples, 10))).astype("float32")
    return x, keras.utils.to_categorical(y, 2)


def _small_bnn():
    """Larq's testing_utils.get_small_bnn_model(10, 20, 2)."""
    return keras.Sequential([
        keras.Input((10,)),
        lq.layers.QuantDense(20, kernel_quantizer="ste_sign", kernel_constraint="weight_clip",
                             activation="relu", use_bias=False),
        keras.layers.BatchNormalization(),
        lq.layers.QuantDense(2, kernel_quantizer="ste_sign", kernel_constraint="weight_clip",
                             input_quantizer="ste_sign", activation="softmax", use_bias=False),
    ])


def _fit(model, x, y, callbacks, **kwargs):
    """Fits as Larq's tests do; returns (printed lines, history)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        history = model.fit(x, y, callbacks=callbacks, verbose=0, **kwargs)
    return out.getvalue().splitlines(), history.history


def _logs(history, names):
    return {name: [float(v) for v in history[name]] for name in names}


# -- the cases of Larq's callbacks_test.py, run once for the ports and the comparisons --------


def _normal_optimizer():
    x, y = _test_data(1000)
    model = _small_bnn()
    model.compile(loss="categorical_crossentropy", optimizer=keras.optimizers.Adam(0.01),
                  metrics=["accuracy"])
    # we shouldn't need to specify the optimizer
    lines, history = _fit(model, x, y, [HyperparameterScheduler(scheduler, "lr", verbose=1)],
                          epochs=2, batch_size=16)
    return {"printed": lines, "logs": _logs(history, ["lr"]),
            "final": {"lr": float(model.optimizer.learning_rate)}}


def _per_step():
    x, y = _test_data(20)
    model = _small_bnn()
    model.compile(loss="categorical_crossentropy", optimizer=keras.optimizers.Adam(0.01),
                  metrics=["accuracy"])
    lines, history = _fit(model, x, y, [HyperparameterScheduler(scheduler, "lr",
                                                                update_freq="step", verbose=1)],
                          epochs=1, batch_size=16)
    return {"printed": lines, "logs": _logs(history, ["lr"]),
            "final": {"lr": float(model.optimizer.learning_rate)}}


def _case_optimizer():
    x, y = _test_data(1000)
    model = _small_bnn()
    bop = Bop(threshold=1e-6, gamma=1e-3)
    model.compile(loss="categorical_crossentropy",
                  optimizer=CaseOptimizer((Bop.is_binary_variable, bop),
                                          default_optimizer=keras.optimizers.Adam(0.01)),
                  metrics=["accuracy"])
    bop, adam = model.optimizer.optimizers
    callbacks = [HyperparameterScheduler(scheduler, "gamma", bop, verbose=1),
                 HyperparameterScheduler(scheduler, "lr", adam, verbose=1),
                 HyperparameterScheduler(scheduler, "threshold", bop, verbose=1)]
    lines, history = _fit(model, x, y, callbacks, epochs=3, batch_size=16)
    return {"printed": lines, "logs": _logs(history, ["gamma", "lr", "threshold"]),
            "final": {"gamma": float(bop.gamma), "threshold": float(bop.threshold),
                      "lr": float(adam.learning_rate)}}


CASES = {"normal_optimizer": _normal_optimizer, "per_step": _per_step,
         "case_optimizer": _case_optimizer}


@pytest.fixture(scope="module")
def bnn_cases():
    """Each case run once on bnn.larq, on first use."""
    runs = {}

    def run(name):
        if name not in runs:
            keras.utils.set_random_seed(1337)
            runs[name] = CASES[name]()
        return runs[name]

    return run


def test_normal_optimizer(bnn_cases):
    num_epochs = 2
    np.testing.assert_almost_equal(bnn_cases("normal_optimizer")["final"]["lr"],
                                   scheduler(num_epochs - 1), decimal=8)


def test_per_step(bnn_cases):
    # we don't accept an incorrect update_freq
    with pytest.raises(ValueError, match="update_freq can only be 'step' or 'epoch'"):
        HyperparameterScheduler(schedule=scheduler, hyperparameter="lr", update_freq="wrong")
    train_samples, batch_size = 20, 10  # Larq's test fits with batch_size=16: 2 steps
    np.testing.assert_almost_equal(bnn_cases("per_step")["final"]["lr"],
                                   scheduler(np.ceil(train_samples / batch_size) - 1), decimal=8)


def test_case_optimizer(bnn_cases):
    num_epochs = 3
    final = bnn_cases("case_optimizer")["final"]
    for name in ("gamma", "threshold", "lr"):
        np.testing.assert_almost_equal(final[name], scheduler(num_epochs - 1), decimal=8)


def test_wrong_param():
    x, y = _test_data(32)
    model = _small_bnn()
    model.compile(loss="categorical_crossentropy", optimizer=keras.optimizers.Adam(0.01))
    wrong = HyperparameterScheduler(schedule=scheduler, hyperparameter="invalid_param", verbose=1)
    with pytest.raises(ValueError, match='Optimizer must have a "invalid_param" attribute'):
        model.fit(x, y, epochs=1, batch_size=16, callbacks=[wrong], verbose=0)


@pytest.mark.parametrize("case", sorted(CASES))
def test_prints_and_logs_what_larq_does(larq_reference, bnn_cases, case):
    """The verbose lines (``Epoch 0: gamma is now 1.0.``, ``Batch 1: lr is now 0.5.``), the
    epoch logs under Larq's names, and the final values equal Larq's."""
    reference, _ = larq_reference
    larqs, ours = reference["cases"][case], bnn_cases(case)
    assert ours["printed"] == larqs["printed"]
    assert ours["logs"] == larqs["logs"]
    assert ours["final"] == larqs["final"]


def test_errors_are_larqs(larq_reference):
    """The same error classes, with Larq's messages (here followed by the fix)."""
    reference, _ = larq_reference
    kind, message = reference["errors"]["update_freq"]
    with pytest.raises(Exception) as error:
        HyperparameterScheduler(scheduler, "lr", update_freq="wrong")
    assert type(error.value).__name__ == kind and str(error.value) == message
    kind, message = reference["errors"]["invalid_param"]
    model = _small_bnn()
    model.compile(loss="categorical_crossentropy", optimizer=keras.optimizers.Adam(0.01))
    with pytest.raises(Exception) as error:
        model.fit(*_test_data(32), epochs=1, verbose=0,
                  callbacks=[HyperparameterScheduler(scheduler, "invalid_param")])
    assert type(error.value).__name__ == kind
    assert str(error.value).startswith(message.rstrip(".") + ": Adam has none;")


# -- the scheduled values are what training uses, step by step --------------------------------


def _cycle(values):
    return lambda t: values[t % len(values)]


def _trace_model(trace):
    model = keras.Sequential([
        keras.Input((10,)),
        lq.layers.QuantDense(8, kernel_quantizer="ste_sign", kernel_constraint="weight_clip",
                             activation="relu", use_bias=False),
        keras.layers.Dense(2, activation="softmax"),
    ])
    model.set_weights([trace[f"init/{i}"] for i in range(3)])
    return model


def _run_trace(trace, schedules, mode, scheduled=True):
    """The reference script's run on bnn.larq; returns (printed, history, {step: arrays})."""
    model = _trace_model(trace)
    bop = Bop(threshold=1e-6, gamma=1e-3)
    model.compile(loss="categorical_crossentropy",
                  optimizer=CaseOptimizer((Bop.is_binary_variable, bop),
                                          default_optimizer=keras.optimizers.SGD(0.1)),
                  run_eagerly=mode == "eager", jit_compile=mode == "xla")
    bop, sgd = model.optimizer.optimizers
    steps = {}

    def record(batch, logs=None):
        step = int(bop.iterations) - 1
        steps[step] = {**{str(i): w for i, w in enumerate(model.get_weights())},
                       "m": bop._momentums[0].numpy()}

    callbacks = [keras.callbacks.LambdaCallback(on_train_batch_end=record)]
    if scheduled:
        callbacks = [
            HyperparameterScheduler(_cycle(schedules["gamma"]), "gamma", bop,
                                    update_freq="step", verbose=1),
            HyperparameterScheduler(_cycle(schedules["threshold"]), "threshold", bop,
                                    update_freq="step", verbose=1),
            HyperparameterScheduler(lambda epoch, lr: lr * schedules["lr_factor"], "lr", sgd,
                                    verbose=1, log_name="sgd_lr"),
        ] + callbacks
    else:  # the first step's values, as a step traced with them and never updated would use
        bop.gamma, bop.threshold = schedules["gamma"][0], schedules["threshold"][0]
        sgd.learning_rate = 0.1 * schedules["lr_factor"]
    lines, history = _fit(model, trace["x"], trace["y"], callbacks, epochs=3, batch_size=8,
                          shuffle=False)
    return lines, history, steps


def _differences(trace, steps, count):
    """The steps whose weights or momentum differ from Larq's (ste_sign kernels exactly,
    the rest to float rounding)."""
    differ = []
    for step in range(count):
        ours = steps[step]
        same = (np.array_equal(ours["0"], trace[f"step{step}/0"])
                and np.allclose(ours["m"], trace[f"step{step}/m"], rtol=1e-5, atol=1e-7)
                and all(np.allclose(ours[str(i)], trace[f"step{step}/{i}"], rtol=1e-5, atol=1e-6)
                        for i in (1, 2)))
        if not same:
            differ.append(step)
    return differ


@pytest.mark.parametrize("mode", ["eager", "function", "xla"])
def test_scheduled_bop_trains_step_by_step_as_larqs(larq_reference, mode):
    """Bop's gamma and threshold set before every step, SGD's learning rate before every
    epoch: after each of the 15 steps, the ±1 kernel equals Larq's and Bop's momentum and the
    float layer's weights equal Larq's to float rounding; the printed lines and logs are
    Larq's."""
    reference, trace = larq_reference
    larqs = reference["cases"]["trace"]
    lines, history, steps = _run_trace(trace, larqs["schedules"], mode)
    assert len(steps) == larqs["steps"] == 15
    assert _differences(trace, steps, larqs["steps"]) == []
    assert lines == larqs["printed"]
    assert _logs(history, ["gamma", "threshold", "sgd_lr"]) == larqs["logs"]


def test_the_schedules_change_what_larq_trains(larq_reference):
    """The comparison above can fail: values fixed at the first step's (what a train step that
    read them once, when traced, would use) train differently from Larq's scheduled run, and
    in Larq's run the steps with a threshold of 1e6 flip nothing while the others flip."""
    reference, trace = larq_reference
    larqs = reference["cases"]["trace"]
    _, _, steps = _run_trace(trace, larqs["schedules"], "xla", scheduled=False)
    assert len(_differences(trace, steps, larqs["steps"])) >= 10
    before = np.sign(trace["init/0"])
    for step in range(larqs["steps"]):
        after = trace[f"step{step}/0"]
        flips = int((after != before).sum())
        threshold = larqs["schedules"]["threshold"][step % 5]
        assert (flips == 0) == (threshold == 1e6), (step, flips)
        before = after


# -- Bop's hyperparameters are variables that a compiled step reads ---------------------------


def _larq_bop_step(w, m, g, gamma, threshold):
    m = m + gamma * (g - m)
    inner = np.sign(w * m - threshold)
    return np.where(-inner * w >= 0, 1.0, -1.0).astype("float32"), m


def test_gamma_and_threshold_set_between_steps_reach_a_compiled_step():
    """One XLA-compiled step function, traced once; gamma and threshold set between its calls
    (attributes, as Larq's Bop has) give Larq's update with the new values."""
    rng = np.random.default_rng(5)
    w0 = rng.choice([-1.0, 1.0], size=(6, 4)).astype("float32")
    grads = rng.normal(size=(3, 6, 4)).astype("float32")
    w = keras.Variable(w0)
    bop = Bop(threshold=1e-6, gamma=1e-3)
    bop.build([w])
    step = tf.function(lambda g: bop.apply([g], [w]), jit_compile=True)
    want_w, want_m = w0, np.zeros_like(w0)
    for g, (gamma, threshold) in zip(grads, [(0.5, 0.0), (0.9, 0.3), (0.1, 1e6)]):
        bop.gamma, bop.threshold = gamma, threshold
        step(tf.constant(g))
        want_w, want_m = _larq_bop_step(want_w, want_m, g, np.float32(gamma),
                                        np.float32(threshold))
        np.testing.assert_allclose(bop._momentums[0].numpy(), want_m, rtol=1e-6)
        np.testing.assert_array_equal(w.numpy(), want_w)
    assert step.experimental_get_tracing_count() == 1
    assert float(bop.gamma) == pytest.approx(0.1) and float(bop.threshold) == 1e6
    config = bop.get_config()  # the current values, as Larq's config gives them
    assert config["gamma"] == pytest.approx(0.1) and config["threshold"] == 1e6


def test_a_scheduled_hyperparameter_cannot_be_set():
    schedule = keras.optimizers.schedules.ExponentialDecay(1e-3, 10, 0.5)
    bop = Bop(gamma=schedule, threshold=schedule)
    with pytest.raises(TypeError, match=r"Bop threshold is a schedule \(ExponentialDecay\), "
                                        "which cannot be set"):
        bop.threshold = 1e-6
    with pytest.raises(TypeError, match=r"Bop gamma is a schedule \(ExponentialDecay\)"):
        bop.gamma = 1e-3
    with pytest.raises(TypeError, match="pass the schedule as threshold= when creating it"):
        Bop().threshold = schedule


# -- bad arguments ----------------------------------------------------------------------------


def _compiled(optimizer):
    model = _small_bnn()
    model.compile(loss="categorical_crossentropy", optimizer=optimizer)
    return model


@pytest.mark.parametrize("optimizer, hyperparameter, match", [
    (lambda: Bop(gamma=keras.optimizers.schedules.ExponentialDecay(1e-3, 10, 0.5)), "gamma",
     ("Bop's gamma is a schedule, which HyperparameterScheduler cannot set; create the "
      "optimizer with a float gamma")),
    (lambda: keras.optimizers.Adam(keras.optimizers.schedules.ExponentialDecay(1e-3, 10, 0.5)),
     "lr", "Adam's learning_rate is a schedule"),
    (lambda: keras.optimizers.Adam(0.01), "beta_1",
     ("Adam's beta_1 is 0.9, not a variable: a compiled train step keeps the value it was "
      "traced with")),
], ids=["bop_schedule", "adam_schedule", "python_number"])
def test_an_unsettable_hyperparameter_is_refused_when_training_starts(optimizer, hyperparameter,
                                                                     match):
    model = _compiled(optimizer())
    with pytest.raises(TypeError, match=match):
        model.fit(*_test_data(16), verbose=0,
                  callbacks=[HyperparameterScheduler(scheduler, hyperparameter)])


def test_a_schedule_must_be_callable_and_give_a_number():
    with pytest.raises(TypeError, match="schedule must be callable, got float"):
        HyperparameterScheduler(0.5, "lr")
    model = _compiled(keras.optimizers.Adam(0.01))
    with pytest.raises(ValueError, match=r"schedule gave 'fast' for lr at epoch 0; it must "
                                         "return a number"):
        model.fit(*_test_data(16), verbose=0,
                  callbacks=[HyperparameterScheduler(lambda t: "fast", "lr")])


def test_an_uncompiled_model_has_no_optimizer_to_schedule():
    with pytest.raises(ValueError, match="the model is not compiled; compile it, or pass "
                                         "optimizer="):
        HyperparameterScheduler(scheduler, "lr").set_model(_small_bnn())


# -- the logs reach TensorBoard -----------------------------------------------------------------


def test_the_logged_value_reaches_tensorboard_under_log_name(tmp_path):
    """Larq: "log_name: under which name to log this hyperparameter to Tensorboard"."""
    bop = Bop(threshold=1e-6, gamma=1e-3)
    model = _compiled(CaseOptimizer((Bop.is_binary_variable, bop),
                                    default_optimizer=keras.optimizers.Adam(0.01)))
    model.fit(*_test_data(32), epochs=2, batch_size=16, verbose=0, callbacks=[
        HyperparameterScheduler(scheduler, "gamma", bop, log_name="bop_gamma"),
        keras.callbacks.TensorBoard(str(tmp_path))])
    events = run_events(tmp_path / "train")
    assert [step for step, _ in events["epoch_bop_gamma"]] == [0, 1]
    assert [value for _, value in events["epoch_bop_gamma"]] == pytest.approx([1.0, 0.5])
