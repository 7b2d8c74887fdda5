"""Larq's tests of Bop and CaseOptimizer (larq/optimizers_test.py) on bnn.larq, and their saving:
configs that round-trip before and after training, Larq's configs read, and a model saved with
its optimizer's state that trains on after loading exactly as it would have."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import bnn.larq as lq
from bnn import layers as bl
from bnn import optimizers as bo
import test_larq_registry

larq_registry = test_larq_registry.larq_registry  # the fixture: Larq's values
Bop, CaseOptimizer = lq.optimizers.Bop, lq.optimizers.CaseOptimizer
is_binary = Bop.is_binary_variable


def _test_data(samples=1000, classes=2, dim=10, seed=1337):
    """Larq's optimizer test data (tf.keras testing_utils.get_test_data): one Gaussian cluster
    per class around a random template; one-hot labels."""
    rng = np.random.default_rng(seed)
    templates = 2 * classes * rng.random((classes, dim))
    y = rng.integers(0, classes, samples)
    x = (templates[y] + rng.normal(size=(samples, dim))).astype("float32")
    return x, keras.utils.to_categorical(y, classes)


def _small_bnn(trainable_bn=True):
    """Larq's testing_utils.get_small_bnn_model(10, 20, 2)."""
    return keras.Sequential([
        keras.Input((10,)),
        lq.layers.QuantDense(20, kernel_quantizer="ste_sign", kernel_constraint="weight_clip",
                             activation="relu", use_bias=False),
        keras.layers.BatchNormalization(trainable=trainable_bn),
        lq.layers.QuantDense(2, kernel_quantizer="ste_sign", kernel_constraint="weight_clip",
                             input_quantizer="ste_sign", activation="softmax", use_bias=False),
    ])


def _test_optimizer(optimizer, target=0.75, trainable_bn=True):
    """optimizers_test._test_optimizer: every trainable variable moves, the binary kernels are
    ±1, and the accuracy reaches ``target`` in two epochs."""
    keras.utils.set_random_seed(1337)
    x, y = _test_data()
    model = _small_bnn(trainable_bn)
    model.compile(loss="categorical_crossentropy", optimizer=optimizer, metrics=["acc"])
    initial = [v.numpy().copy() for v in model.trainable_variables]
    history = model.fit(x, y, epochs=2, batch_size=16, verbose=0)
    for before, variable in zip(initial, model.trainable_variables, strict=True):
        assert not np.all(before == variable.numpy()), variable.path
    for layer in model.layers:
        if isinstance(layer, bl.BinaryDense):
            assert np.all(np.isin(layer.kernel.numpy(), [-1, 1])), layer.name
    assert history.history["acc"][-1] >= target
    return model


def _bop_and_adam(**bop):
    return CaseOptimizer((is_binary, Bop(**bop)), default_optimizer=keras.optimizers.Adam(0.01))


def _mnist_like_model(binary=True):
    """The Flatten-QuantDense(NoOp(precision=1))-Dense model of Larq's CaseOptimizer tests."""
    return keras.Sequential([
        keras.Input((28, 28)), keras.layers.Flatten(),
        lq.layers.QuantDense(64, input_quantizer="ste_sign",
                             kernel_quantizer=lq.quantizers.NoOp(precision=1) if binary else None,
                             activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])


def _fit_once(model, optimizer):
    rng = np.random.default_rng(0)
    model.compile(loss="sparse_categorical_crossentropy", optimizer=optimizer)
    model.fit(rng.integers(0, 255, (1, 28, 28)).astype("float32"), np.array([3]), verbose=0)


# -- TestCaseOptimizer ------------------------------------------------------------------------


def test_type_check_predicate():
    with pytest.raises(TypeError):
        CaseOptimizer((False, Bop()))


def test_type_check_optimizer():
    with pytest.raises(TypeError):
        CaseOptimizer((is_binary, False))


def test_type_check_default():
    with pytest.raises(TypeError):
        CaseOptimizer((is_binary, Bop()), default_optimizer=False)


def test_overlapping_predicates():
    naughty = CaseOptimizer((lambda var: True, Bop()), (lambda var: True, Bop()))
    with pytest.raises(ValueError, match="claimed by optimizers"):
        _test_optimizer(naughty)


def test_missing_default():
    with pytest.warns(UserWarning, match="no default_optimizer"):
        _fit_once(_mnist_like_model(), CaseOptimizer((is_binary, Bop())))


def test_wrong_predicate():
    """An optimizer that claims no variable is an error at the first step."""
    naughty = CaseOptimizer((lambda var: False, Bop()),
                            default_optimizer=keras.optimizers.Adam(0.01))
    with pytest.raises(ValueError, match="did not claim any variables"):
        _fit_once(_mnist_like_model(binary=False), naughty)


def test_variables_hold_every_optimizers_state():
    """optimizers_test.test_weights, on Keras 3 (``variables``; Keras 3 optimizers have no
    ``weights``): the case optimizer's own variables, then each optimizer's in order. Bop and SGD
    with momentum each keep one momentum per variable they train, besides their step count and
    learning rate."""
    model = _mnist_like_model()
    _fit_once(model, CaseOptimizer((is_binary, Bop()),
                                   default_optimizer=keras.optimizers.SGD(0.1, momentum=0.9)))
    optimizer = model.optimizer
    variables = optimizer.variables
    own = [variables[0], variables[1]]
    assert own[0] is optimizer.iterations
    checked = len(own)
    for sub in optimizer.optimizers:
        for variable in sub.variables:
            assert variable is variables[checked]
            checked += 1
    assert checked == len(variables)
    per_optimizer = len(own)  # a step count and a learning rate each
    assert len(variables) == len(model.weights) + per_optimizer * (1 + len(optimizer.optimizers))
    assert int(optimizer.optimizers[0].iterations) == int(optimizer.iterations) == 1


def test_checkpoint(tmp_path):
    """optimizers_test.test_checkpoint: a tf.train.Checkpoint of the case optimizer restores its
    optimizers' state."""
    var = keras.Variable([2.0])
    sgd = keras.optimizers.SGD(1.0, momentum=1.0)
    optimizer = CaseOptimizer((lambda var: True, sgd))

    def step():
        with tf.GradientTape() as tape:
            loss = var + 1.0
        optimizer.apply(tape.gradient(loss, [var.value]), [var])

    step()
    [slot] = [v for v in optimizer.variables if "momentum" in v.path]
    slot_value = slot.numpy().item()
    checkpoint = tf.train.Checkpoint(optimizer=optimizer, var=var)
    save_path = checkpoint.save(tmp_path / "ckpt")
    step()
    assert slot.numpy().item() != slot_value
    status = checkpoint.restore(save_path)
    status.assert_consumed()
    assert slot.numpy().item() == slot_value


# -- TestBopOptimizer -------------------------------------------------------------------------


def test_bop_accuracy():
    _test_optimizer(_bop_and_adam())
    # only binary variables trainable: low accuracy
    _test_optimizer(_bop_and_adam(), trainable_bn=False, target=0)


@pytest.mark.parametrize("strategy", [None, "mirrored"])
def test_mixed_precision(strategy):
    """optimizers_test.test_mixed_precision: the case optimizer inside Keras 3's
    LossScaleOptimizer, also under a distribution strategy (Larq's distribute_scope)."""
    if strategy is None:
        _test_optimizer(keras.optimizers.LossScaleOptimizer(_bop_and_adam()))
        return
    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        _test_optimizer(keras.optimizers.LossScaleOptimizer(_bop_and_adam()))


def test_bop_schedules():
    """optimizers_test.test_bop_tf_1_14_schedules: threshold and gamma as schedules."""
    def schedule():
        return keras.optimizers.schedules.InverseTimeDecay(3.0, decay_steps=1.0, decay_rate=0.5)

    _test_optimizer(_bop_and_adam(threshold=schedule(), gamma=schedule()))


def test_bop_serialization():
    """optimizers_test.test_bop_serialization: a case optimizer that has not trained serializes,
    deserializes, and serializes again to the same config."""
    optimizer = _bop_and_adam()
    config = keras.optimizers.serialize(optimizer)
    restored = keras.optimizers.deserialize(config)
    assert keras.optimizers.serialize(restored) == config
    assert restored.predicates == [is_binary]
    assert [type(o) for o in restored.optimizers] == [Bop, keras.optimizers.Adam]


@pytest.mark.parametrize("hyper", [5e-4, keras.optimizers.schedules.PolynomialDecay(5e-4, 100)])
def test_bop_serialization_schedule(hyper):
    bop = Bop(gamma=hyper, threshold=hyper)
    restored = Bop.from_config(bop.get_config())
    assert type(restored.threshold) is type(bop.threshold)
    assert type(restored._learning_rate) is type(bop._learning_rate)  # gamma
    assert restored.get_config() == bop.get_config()


# -- configs: Larq's values, and Larq's configs read ------------------------------------------


@pytest.mark.parametrize("case, make", [
    ("bop_default", lambda: Bop()),
    ("bop_arguments", lambda: Bop(threshold=1e-6, gamma=1e-3, name="bop")),
])
def test_bop_config_holds_larqs_entries_and_reads_larqs(larq_registry, case, make):
    registry, _ = larq_registry
    larqs = registry["configs"][case]
    config = make().get_config()
    assert config["name"] == larqs["name"]
    for key in ("gamma", "threshold"):  # float32 variables here, as Larq's once it has trained
        assert config[key] == pytest.approx(larqs[key], rel=1e-7)
    assert Bop.from_config(larqs).get_config() == config


def test_bop_reads_larqs_config_with_schedules(larq_registry):
    registry, _ = larq_registry
    larqs = registry["configs"]["bop_schedules"]
    bop = Bop.from_config(larqs)
    for schedule in (bop.threshold, bop._learning_rate):  # gamma
        assert isinstance(schedule, keras.optimizers.schedules.PolynomialDecay)
        config = schedule.get_config()
        assert {key: config[key] for key in larqs["gamma"]["config"] if key != "name"} == {
            key: value for key, value in larqs["gamma"]["config"].items() if key != "name"}
        assert float(schedule(10)) == pytest.approx(0.9 * 4e-4 + 1e-4)  # it runs
    assert float(bop.learning_rate) == pytest.approx(5e-4)


def test_an_unsaveable_predicate_is_left_out_as_larq_does_and_named_when_used():
    optimizer = CaseOptimizer((lambda var: var.path.endswith("kernel"), Bop()),
                              default_optimizer=keras.optimizers.Adam(0.01))
    config = keras.optimizers.serialize(optimizer)
    assert config["config"]["cases"][0]["predicate"] is None
    restored = keras.optimizers.deserialize(config)
    assert keras.optimizers.serialize(restored) == config
    with pytest.raises(ValueError, match="has no predicate: it was not saved"):
        _fit_once(_mnist_like_model(), restored)


def test_a_deserialized_case_optimizer_trains_as_the_original():
    x, y = _test_data(64)

    def train(optimizer):
        keras.utils.set_random_seed(3)
        model = _small_bnn()
        model.compile(loss="categorical_crossentropy", optimizer=optimizer)
        model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
        return [v.numpy() for v in model.weights]

    original = _bop_and_adam(threshold=1e-6, gamma=1e-2)
    copy = keras.optimizers.deserialize(keras.optimizers.serialize(original))
    for a, b in zip(train(original), train(copy), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_trained_case_optimizer_saves_which_variables_each_optimizer_trains():
    model = _mnist_like_model()
    _fit_once(model, _bop_and_adam())
    config = keras.optimizers.serialize(model.optimizer)
    predicate = config["config"]["cases"][0]["predicate"]
    assert predicate["config"] == {"paths": [f"{model.layers[1].name}/kernel"]}
    assert keras.optimizers.serialize(keras.optimizers.deserialize(config)) == config


# -- a saved model trains on as it would have -------------------------------------------------


def _schedule():
    return keras.optimizers.schedules.InverseTimeDecay(1e-2, decay_steps=1.0, decay_rate=0.5)


@pytest.mark.parametrize("make", [
    lambda: _bop_and_adam(threshold=1e-6, gamma=1e-2),
    lambda: _bop_and_adam(threshold=_schedule(), gamma=_schedule()),
    lambda: CaseOptimizer((is_binary, Bop(threshold=1e-6, gamma=1e-2)),
                          default_optimizer=keras.optimizers.SGD(0.1, momentum=0.9)),
], ids=["bop_adam", "bop_schedules_adam", "bop_sgd"])
def test_a_saved_model_trains_on_after_loading_as_it_would_have(tmp_path, make):
    """Saved after some training with its optimizer's state (the step counts, Bop's momentum, the
    default optimizer's moments), a model loads and trains on to the same weights as the model
    that was not saved."""
    x, y = _test_data(96)
    keras.utils.set_random_seed(5)
    model = _small_bnn()
    model.compile(loss="categorical_crossentropy", optimizer=make())
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    model.save(tmp_path / "m.keras")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every optimizer variable loads
        loaded = keras.saving.load_model(tmp_path / "m.keras")
    assert type(loaded.optimizer) is CaseOptimizer
    assert int(loaded.optimizer.iterations) == int(model.optimizer.iterations) == 6
    for a, b in zip(model.optimizer.variables, loaded.optimizer.variables, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=a.path)
    model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    loaded.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    for a, b in zip(model.weights, loaded.weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)
    assert int(loaded.optimizer.optimizers[0].iterations) == 18


def test_a_model_compiled_with_bop_saves_before_training_and_loads(tmp_path):
    """Saving before the first step keeps the optimizer's predicates (here Larq's
    ``Bop.is_binary_variable``). The loaded model's layers are bnn's, whose kernels carry no
    1-bit tags: training it says what predicate to use instead, which trains it."""
    model = _small_bnn()
    model.compile(loss="categorical_crossentropy", optimizer=_bop_and_adam(gamma=1e-3))
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    assert loaded.optimizer.predicates == [is_binary]
    assert loaded.optimizer.optimizers[0].get_config() == model.optimizer.optimizers[0].get_config()
    x, y = _test_data(32)
    with pytest.raises(ValueError, match=r"use bnn.optimizers.is_binary_variable_of\(model\)"):
        loaded.fit(x, y, verbose=0)
    loaded.compile(loss="categorical_crossentropy", optimizer=CaseOptimizer(
        (bo.is_binary_variable_of(loaded), Bop()), default_optimizer=keras.optimizers.Adam()))
    loaded.fit(x, y, verbose=0)
    assert np.all(np.isin(loaded.layers[0].kernel.numpy(), [-1, 1]))
