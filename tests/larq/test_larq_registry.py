"""Larq's names in Keras 3, and Larq's tests of constraints, activations, math and metrics, on
bnn.larq.

``tests/larq/larq_registry_reference.py`` runs in Larq's own environment (Larq needs tf-keras,
which must not share a process with bnn): it lists every name ``import larq`` registers with
Keras, what tf-keras' lookups give for each, and the values Larq's objects give. Here each name
must resolve after ``import bnn.larq`` through Keras 3's lookups, as layer arguments and in
saved models, to objects that give Larq's values. Without the Larq environment those tests skip,
saying so; the ports of Larq's tests check Larq's documented values without it.
"""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import bnn.larq as lq
from bnn import quantizers as bq
from bnn.layers import constraints as bc
from bnn.larq import keras_names
from support import larq_script_output, load_with_bnn_alone

RNG = np.random.default_rng(1337)
#: Larq's ``weight_clip`` is an empty subclass of its ``WeightClip``; bnn.larq's is the class.
SAME_CLASS = {"weight_clip": "WeightClip"}


@pytest.fixture(scope="module")
def larq_registry(request):
    """Runs larq_registry_reference.py in Larq's environment; returns (registry, values).

    The output is kept in pytest's cache, keyed by the script and the Larq python, so later
    sessions reuse it (``pytest --cache-clear`` rebuilds it)."""
    out = larq_script_output(request, "larq_registry_reference.py", "registry.json")
    registry = json.loads((out / "registry.json").read_text())
    assert registry["larq"] == "0.14.0", registry["larq"]
    return registry, np.load(out / "values.npz")


def real_values_with_zeros(shape=(4, 10)):
    """Uniform values in [-2, 2) with a column of zeros (Larq's test inputs)."""
    return np.insert(RNG.uniform(-2, 2, shape), 1, 0, axis=1).astype("float32")


def value_and_gradient(fn, x):
    x = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
    return np.asarray(y), tape.gradient(y, x).numpy()


def larq_name(obj) -> str:
    return getattr(obj, "__qualname__", None) or obj.__name__


def kind_of(obj) -> str:
    """The kind of a registered object, as the reference script names it."""
    for kind, base in (("quantizer", lq.quantizers.Quantizer), ("quantizer", bq.Quantizer),
                       ("metric", keras.metrics.Metric),
                       ("layer", keras.layers.Layer), ("constraint", keras.constraints.Constraint),
                       ("optimizer", keras.optimizers.Optimizer)):
        if isinstance(obj, type) and issubclass(obj, base):
            return kind
    return "activation"


NAMES_OF = {kind: sorted(name for name, obj in keras_names.CUSTOM_OBJECTS.items()
                         if kind_of(obj) == kind)
            for kind in ("quantizer", "metric", "layer", "constraint", "optimizer", "activation")}


# -- every name Larq registers ----------------------------------------------------------------


def test_every_name_larq_registers_with_keras_is_registered_by_bnn_larq(larq_registry):
    registry, _ = larq_registry
    larq_names = registry["names"]
    assert set(larq_names) == set(keras_names.CUSTOM_OBJECTS) | set(lq.layers.UNSUPPORTED)
    custom = keras.saving.get_custom_objects()
    for name, obj in keras_names.CUSTOM_OBJECTS.items():
        assert custom[name] is obj, name
        assert kind_of(obj) == larq_names[name]["kind"], name
        assert larq_name(obj) == SAME_CLASS.get(larq_names[name]["object"],
                                                larq_names[name]["object"]), name


def test_larqs_layers_bnn_has_not_are_named_when_asked_for():
    for name in lq.layers.UNSUPPORTED:
        assert name not in keras.saving.get_custom_objects()
        with pytest.raises(AttributeError, match=f"no {name}: bnn supports"):
            getattr(lq.layers, name)


# -- constraints (larq/constraints_test.py) ---------------------------------------------------


@pytest.mark.parametrize("name", NAMES_OF["constraint"])
def test_constraint_names_resolve_in_keras_lookups_and_layer_arguments(larq_registry, name):
    registry, values = larq_registry
    constraint = keras.constraints.get(name)
    assert larq_name(type(constraint)) == SAME_CLASS.get(registry["lookups"][name],
                                                         registry["lookups"][name])
    assert isinstance(constraint, lq.constraints.WeightClip) and constraint.clip_value == 1
    y, dx = value_and_gradient(constraint, values["x"])
    np.testing.assert_array_equal(y, values[f"{name}/y"])
    np.testing.assert_array_equal(dx, values[f"{name}/dx"])
    dense = keras.layers.Dense(3, kernel_constraint=name)
    assert type(dense.kernel_constraint) is type(constraint)


@pytest.mark.parametrize("name", ["weight_clip", "WeightClip"])
def test_constraint_serialization(name):
    """constraints_test.test_serialization: by name, and through serialize/deserialize (which
    gives bnn's WeightClip, the class bnn.larq's saves as)."""
    constraint = keras.constraints.get(name)
    assert type(constraint) is type(lq.constraints.weight_clip())
    restored = keras.constraints.deserialize(keras.constraints.serialize(constraint))
    assert type(restored) is bc.WeightClip and restored.clip_value == 1
    # a config as Larq saves it (tf-keras: no "bnn>" registered name)
    larqs = {"module": "larq.constraints", "class_name": name, "config": {"clip_value": 0.5},
             "registered_name": name}
    assert keras.constraints.deserialize(larqs).clip_value == 0.5


def test_clip():
    """constraints_test.test_clip."""
    real = real_values_with_zeros()
    clipped = lq.constraints.weight_clip(clip_value=0.75)(keras.Variable(real))
    np.testing.assert_allclose(np.asarray(clipped), np.clip(real, -0.75, 0.75))


# -- activations (larq/activations_test.py) ---------------------------------------------------


@pytest.mark.parametrize("name", ["hard_tanh", "leaky_tanh"])
def test_activation_serialization(name):
    """activations_test.test_serialization: the name gives lq.activations' function, and it
    serializes and deserializes to itself."""
    fn = keras.activations.get(name)
    assert fn is getattr(lq.activations, name)
    assert keras.activations.deserialize(keras.activations.serialize(fn)) is fn


@pytest.mark.parametrize("name", NAMES_OF["activation"])
def test_activations_give_larqs_values_and_gradients(larq_registry, name):
    registry, values = larq_registry
    assert registry["lookups"][name] == name
    y, dx = value_and_gradient(keras.activations.get(name), values["x"])
    np.testing.assert_allclose(y, values[f"{name}/y"], rtol=1e-6)
    np.testing.assert_array_equal(dx, values[f"{name}/dx"])


def test_hard_tanh():
    real = real_values_with_zeros()
    np.testing.assert_allclose(np.asarray(lq.activations.hard_tanh(real)),
                               np.clip(real, -1, 1))


def test_leaky_tanh():
    """activations_test.test_leaky_tanh: identity inside [-1, 1], slope alpha outside."""
    real = real_values_with_zeros()
    expected = np.where(real > 1, 1 + 0.2 * (real - 1),
                        np.where(real < -1, -1 + 0.2 * (real + 1), real))
    np.testing.assert_allclose(np.asarray(lq.activations.leaky_tanh(real)), expected, rtol=1e-6)
    expected = np.where(real > 1, 1 + 0.5 * (real - 1),
                        np.where(real < -1, -1 + 0.5 * (real + 1), real))
    np.testing.assert_allclose(np.asarray(lq.activations.leaky_tanh(real, alpha=0.5)), expected,
                               rtol=1e-6)


# -- quantizers by name -----------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES_OF["quantizer"])
def test_quantizer_names_deserialize_to_quantizers_with_larqs_values(larq_registry, name):
    """A config naming one of Larq's quantizers (by class or alias) gives the bnn.larq quantizer,
    whose values and gradients are Larq's; ``NoOp`` needs its ``precision`` in both."""
    registry, values = larq_registry
    config = {"class_name": name, "config": {}}
    if registry["lookups"][name].startswith("error:"):
        with pytest.raises(TypeError):
            keras.saving.deserialize_keras_object(config)
        return
    quantizer = keras.saving.deserialize_keras_object(config)
    assert isinstance(quantizer, keras_names.CUSTOM_OBJECTS[name])
    assert larq_name(type(quantizer)) == registry["lookups"][name]
    y, dx = value_and_gradient(quantizer, values["x"])
    np.testing.assert_allclose(y, values[f"{name}/y"], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(dx, values[f"{name}/dx"], rtol=1e-5, atol=1e-6)


QUANTIZER_ALIASES = [name for name in NAMES_OF["quantizer"] if name.islower()]


@pytest.mark.parametrize("name", QUANTIZER_ALIASES)
def test_quantizer_aliases_are_activations_with_larqs_values(larq_registry, name):
    """Larq's ``tf.keras.activations.get("ste_sign")`` gives the class, which fails as an
    activation; here the name is an activation computing what Larq's quantizer computes."""
    _, values = larq_registry
    y, dx = value_and_gradient(keras.layers.Activation(name), values["x"])
    np.testing.assert_allclose(y, values[f"{name}/y"], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(dx, values[f"{name}/dx"], rtol=1e-5, atol=1e-6)


# -- metrics, optimizers and layers by name ---------------------------------------------------


@pytest.mark.parametrize("name", NAMES_OF["metric"])
def test_metric_names_resolve(larq_registry, name):
    """tf-keras' lookup gives Larq's class; Keras 3's makes an instance of it, as for its own
    metrics."""
    registry, _ = larq_registry
    assert registry["lookups"][name] == "type:FlipRatio"
    metric = keras.metrics.get(name)
    assert type(metric) is lq.metrics.FlipRatio
    restored = keras.metrics.deserialize(keras.metrics.serialize(metric))
    assert type(restored) is lq.metrics.FlipRatio
    assert restored.get_config() == metric.get_config()
    larqs = {"module": "larq.metrics", "class_name": name, "registered_name": name,
             "config": registry["configs"]["flip_ratio"]}  # a config as Larq saves it
    assert keras.metrics.deserialize(larqs).get_config() == {**larqs["config"]}


def test_optimizer_names_resolve_to_larqs_defaults(larq_registry):
    registry, _ = larq_registry
    assert registry["lookups"]["Bop"] == "Bop"
    bop = keras.optimizers.get("Bop")
    assert type(bop) is lq.optimizers.Bop
    config, larqs = bop.get_config(), registry["configs"]["bop_default"]
    assert config["name"] == larqs["name"]
    for key in ("gamma", "threshold"):  # float32 variables here, as Larq's once it has trained
        assert config[key] == pytest.approx(larqs[key], rel=1e-7)
    # Larq's lookup fails with a KeyError; here a one-line error says what to do
    assert registry["lookups"]["CaseOptimizer"].startswith("error:")
    with pytest.raises(ValueError, match="cannot be made from its name alone"):
        keras.optimizers.get("CaseOptimizer")


@pytest.mark.parametrize("name, config", [
    ("QuantDense", {"units": 3, "kernel_quantizer": "ste_sign"}),
    ("QuantConv2D", {"filters": 2, "kernel_size": 3}),
    ("QuantDepthwiseConv2D", {"kernel_size": 3}),
    ("QuantSeparableConv2D", {"filters": 2, "kernel_size": 3}),
])
def test_layer_names_resolve(larq_registry, name, config):
    registry, _ = larq_registry
    assert registry["lookups"][name] == name
    layer = keras.layers.deserialize({"class_name": name, "config": config})
    assert type(layer) is getattr(lq.layers, name)


# -- saving -----------------------------------------------------------------------------------


def _model_with_larqs_names():
    return keras.Sequential([
        keras.Input((5,)),
        keras.layers.Dense(4, kernel_constraint="weight_clip", activation="leaky_tanh"),
        keras.layers.Activation("ste_sign"),
        lq.layers.QuantDense(3, kernel_quantizer="ste_sign", kernel_constraint="WeightClip",
                             activation="hard_tanh"),
        keras.layers.Dense(2, activation="dorefa_quantizer"),
    ])


def test_a_model_built_from_larqs_names_saves_and_loads(tmp_path):
    model = _model_with_larqs_names()
    model.compile(optimizer="Bop", loss="mse", metrics=["flip_ratio"])
    x = RNG.normal(size=(8, 5)).astype("float32")
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    np.testing.assert_array_equal(np.asarray(loaded(x)), np.asarray(model(x)))
    assert type(loaded.layers[0].kernel_constraint) is bc.WeightClip
    assert loaded.layers[0].activation is lq.activations.leaky_tanh
    assert loaded.layers[1].activation is bq.ste_sign
    assert loaded.layers[3].activation is bq.dorefa
    assert type(loaded.optimizer) is lq.optimizers.Bop


def test_larqs_names_outside_bnn_larq_save_as_bnn_and_load_after_import_bnn(tmp_path):
    """``weight_clip`` and the quantizer names save as bnn's WeightClip and functions:
    ``import bnn`` alone loads them (``leaky_tanh`` and Larq's optimizers need
    ``import bnn.larq``)."""
    model = keras.Sequential([
        keras.Input((5,)),
        keras.layers.Dense(4, kernel_constraint="weight_clip", activation="ste_tern"),
        keras.layers.Activation("approx_sign"), keras.layers.Dense(2),
    ])
    x = RNG.normal(size=(8, 5)).astype("float32")
    described = load_with_bnn_alone(
        model, x, tmp_path, "type(model.layers[0].kernel_constraint).__name__, "
                            "model.layers[1].activation.__name__")
    assert described == ["WeightClip", "approx_sign"]


# -- math (larq/math_test.py) -----------------------------------------------------------------


def test_sign():
    binarized = RNG.choice([-1.0, 1.0], size=(2, 5)).astype("float32")
    np.testing.assert_array_equal(lq.math.sign(binarized).numpy(), binarized)
    real = real_values_with_zeros()
    result = lq.math.sign(real).numpy()
    assert not np.any(result == 0)
    assert np.all(result[real < 0] == -1) and np.all(result[real >= 0] == 1)
    assert np.all(lq.math.sign(np.zeros((2, 5))).numpy() == 1)


def test_heaviside():
    binarized = RNG.choice([0.0, 1.0], size=(2, 5)).astype("float32")
    np.testing.assert_array_equal(lq.math.heaviside(binarized).numpy(), binarized)
    real = real_values_with_zeros()
    result = lq.math.heaviside(real).numpy()
    assert np.all(result[real <= 0] == 0) and np.all(result[real > 0] == 1)


def test_math_gives_larqs_values(larq_registry):
    _, values = larq_registry
    np.testing.assert_array_equal(lq.math.sign(values["x"]).numpy(), values["math/sign"])
    np.testing.assert_array_equal(lq.math.heaviside(values["x"]).numpy(),
                                  values["math/heaviside"])


# -- metrics (larq/metrics_test.py) -----------------------------------------------------------


def test_flip_ratio_config(larq_registry):
    """metrics_test.test_config, and the config holds Larq's entries."""
    registry, _ = larq_registry
    mcv = lq.metrics.FlipRatio(values_dtype="int16", name="mcv", dtype=tf.float16)
    mcv2 = lq.metrics.FlipRatio.from_config(mcv.get_config())
    for metric in (mcv, mcv2):
        assert metric.name == "mcv" and metric.dtype == "float16"
        assert metric.values_dtype == tf.int16
    larqs = registry["configs"]["flip_ratio"]
    assert {key: mcv.get_config()[key] for key in larqs} == larqs


def test_flip_ratio_arguments_are_larqs_in_larqs_order():
    metric = lq.metrics.FlipRatio("int16", "mcv")
    assert metric.values_dtype == tf.int16 and metric.name == "mcv"


SEQUENCE = ((1, 1), (2, 2), (1, 2))


def _states(metric, update=None):
    update = update or metric.update_state
    states = []
    for values in SEQUENCE:
        update(np.array(values))
        states.append({"result": float(metric.result()), "total": float(metric.total.numpy()),
                       "count": float(metric.count.numpy()),
                       "previous": metric._previous_values.numpy().tolist()})
    return states


LARQS_DOCUMENTED = [  # metrics_test.test_metric
    {"result": 0.0, "total": 0.0, "count": 1.0, "previous": [1, 1]},
    {"result": 1.0, "total": 1.0, "count": 2.0, "previous": [2, 2]},
    {"result": 0.75, "total": 1.5, "count": 3.0, "previous": [1, 2]},
]


@pytest.mark.parametrize("build", [True, False], ids=["built", "implicit_build"])
def test_flip_ratio_metric(build):
    """metrics_test.test_metric and test_metric_implicit_build."""
    metric = lq.metrics.FlipRatio()
    if build:
        metric.build((2,))
        assert float(metric.result()) == 0 and float(metric.total.numpy()) == 0
        assert float(metric.count.numpy()) == 0
    assert _states(metric) == LARQS_DOCUMENTED


def test_flip_ratio_metric_in_a_graph():
    """metrics_test.test_metric_in_graph_mode, as a tf.function."""
    metric = lq.metrics.FlipRatio()
    metric.build((2,))
    update = tf.function(lambda values: metric.update_state(tf.cast(values, tf.float32)))
    assert _states(metric, update) == LARQS_DOCUMENTED


def test_flip_ratio_metric_gives_larqs_states(larq_registry):
    registry, _ = larq_registry
    assert _states(lq.metrics.FlipRatio()) == registry["flip_ratio"]


def test_flip_ratio_metric_wrong_shape():
    metric = lq.metrics.FlipRatio()
    metric.build((3,))
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError)):
        metric.update_state(np.array([1, 1]))
