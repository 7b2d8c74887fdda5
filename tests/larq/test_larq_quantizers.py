"""bnn.larq's quantizers as Larq's: Larq's own quantizer tests (larq/quantizers_test.py)
re-expressed against ``bnn.larq`` on Keras 3, and values computed by Larq itself.

``tests/larq/larq_quantizers_reference.py`` runs once per session in Larq's own environment
(``BNN_LARQ_PYTHON``, else ``larq-env/bin/python`` beside the repository): the quantizers' values
and gradients at their decision points (``SteTern``'s thresholds, clip values, zero), their
configs, and layers with the custom quantizer of Larq's guide. Without it those tests skip,
saying so; the ports of Larq's tests check Larq's documented values and need no Larq.
"""

import functools
import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import bnn.larq as lq
from bnn import layers as bl
from bnn import quantizers as bq
from support import ROOT, larq_script_output

RNG = np.random.default_rng(4242)

#: Every quantizer class Larq exports, and the arguments it takes.
EVERY_QUANTIZER = [(lq.quantizers.SteSign, {}), (lq.quantizers.ApproxSign, {}),
                   (lq.quantizers.SwishSign, {}), (lq.quantizers.MagnitudeAwareSign, {}),
                   (lq.quantizers.SteHeaviside, {}), (lq.quantizers.SteTern, {}),
                   (lq.quantizers.DoReFa, {}), (lq.quantizers.NoOp, {"precision": 1})]
QUANTIZER_IDS = [cls.__name__ for cls, _ in EVERY_QUANTIZER]
#: Larq's string name of each class that has one.
LARQ_NAMES = {"SteSign": "ste_sign", "ApproxSign": "approx_sign", "SwishSign": "swish_sign",
              "MagnitudeAwareSign": "magnitude_aware_sign", "SteHeaviside": "ste_heaviside",
              "SteTern": "ste_tern", "DoReFa": "dorefa_quantizer"}


def generate_real_values_with_zeros(low=-2, high=2, shape=(4, 10)):
    """Larq's test input: uniform values with a column of zeros (float64)."""
    return np.insert(RNG.uniform(low, high, shape), 1, 0, axis=1)


def in_graph(quantizer):
    """``quantizer`` under ``tf.function`` on float32 matrices, where Larq's tests used a tf-keras
    backend function on a placeholder."""
    fn = tf.function(lambda x: quantizer(x),
                     input_signature=[tf.TensorSpec([None, None], tf.float32)])
    return lambda values: fn(tf.constant(values, tf.float32)).numpy()


@tf.custom_gradient
def identity_sign(x):
    """The custom quantizer of Larq's guide ("Using Custom Quantizers")."""
    def grad(dy):
        return dy

    return tf.sign(x), grad


class DummyTrainableQuantizer(keras.layers.Layer):
    """A Keras layer with a weight of its own, as a quantizer."""

    _custom_metrics = None

    def build(self, input_shape):
        self.dummy_weight = self.add_weight(name="dummy_weight", shape=(), initializer="ones")

    def call(self, inputs):
        return self.dummy_weight * inputs


# -- Larq's TestCommonFunctionality -----------------------------------------------------------

SERIALIZABLE = [("ste_sign", lq.quantizers.SteSign), ("approx_sign", lq.quantizers.ApproxSign),
                ("ste_heaviside", lq.quantizers.SteHeaviside),
                ("magnitude_aware_sign", lq.quantizers.MagnitudeAwareSign),
                ("swish_sign", lq.quantizers.SwishSign), ("ste_tern", lq.quantizers.SteTern),
                ("dorefa_quantizer", lq.quantizers.DoReFa)]


@pytest.mark.parametrize("module", [lq.quantizers, keras.activations],
                         ids=["lq.quantizers", "keras.activations"])
@pytest.mark.parametrize("name, ref_cls", SERIALIZABLE, ids=[n for n, _ in SERIALIZABLE])
def test_serialization(module, name, ref_cls):
    if module is lq.quantizers:  # Keras 3 resolves only its own activation names
        assert module.get(name).__class__ == ref_cls
    fn = module.get(ref_cls())
    assert fn.__class__ == ref_cls
    assert type(fn.precision) is int
    config = module.serialize(fn)
    fn = module.deserialize(config)
    assert fn.__class__ == ref_cls
    assert type(fn.precision) is int


def test_noop_serialization():
    fn = lq.quantizers.get(lq.quantizers.NoOp(precision=1))
    assert fn.__class__ == lq.quantizers.NoOp
    assert fn.precision == 1
    fn = lq.quantizers.deserialize(lq.quantizers.serialize(fn))
    assert fn.__class__ == lq.quantizers.NoOp
    assert fn.precision == 1


def test_invalid_usage():
    with pytest.raises(ValueError, match="cannot interpret 42"):
        lq.quantizers.get(42)
    with pytest.raises(ValueError, match="unknown quantizer 'unknown'"):
        lq.quantizers.get("unknown")
    with pytest.raises(ValueError, match="mode must be one of .*'unknown'"):
        lq.quantizers.DoReFa(k_bit=2, mode="unknown")
    f = lq.quantizers.DoReFa(k_bit=2, mode="activations")
    f.mode = "unknown"
    with pytest.raises(ValueError, match="mode must be one of .*'unknown'"):
        f.call([0.0])


@pytest.mark.parametrize("run_eagerly", [True, False], ids=["eager", "graph"])
@pytest.mark.parametrize("quantizer", ["input_quantizer", "kernel_quantizer"])
def test_layer_as_quantizer(quantizer, run_eagerly):
    """A keras.layers.Layer with a weight of its own serves as quantizer and trains."""
    input_data = RNG.uniform(-0.5, 9.5, (1, 10)).astype("float32")
    model = keras.Sequential([keras.Input((10,)),
                              lq.layers.QuantDense(1, **{quantizer: DummyTrainableQuantizer()})])
    model.compile(optimizer="sgd", loss="mse", run_eagerly=run_eagerly)
    model.fit(input_data, np.ones((1,)), epochs=1, verbose=0)
    assert any("dummy_weight" in var.name for var in model.trainable_variables)


# -- Larq's TestQuantization ------------------------------------------------------------------


@pytest.mark.parametrize("fn", ["ste_sign", lq.quantizers.SteSign(), "approx_sign",
                                lq.quantizers.ApproxSign(), "swish_sign",
                                lq.quantizers.SwishSign()], ids=str)
def test_xnor_binarization(fn):
    f = in_graph(lq.quantizers.get(fn))
    binarized_values = RNG.choice([-1, 1], size=(2, 5))
    np.testing.assert_allclose(f(binarized_values), binarized_values)
    real_values = generate_real_values_with_zeros()
    result = f(real_values)
    assert not np.any(result == 0)
    assert np.all(result[real_values < 0] == -1)
    assert np.all(result[real_values >= 0] == 1)
    assert np.all(f(np.zeros((2, 5))) == 1)


@pytest.mark.parametrize("fn", ["ste_heaviside", lq.quantizers.SteHeaviside()], ids=str)
def test_and_binarization(fn):
    f = in_graph(lq.quantizers.get(fn))
    binarized_values = RNG.choice([0, 1], size=(2, 5))
    np.testing.assert_allclose(f(binarized_values), binarized_values)
    real_values = generate_real_values_with_zeros()
    result = f(real_values)
    assert np.all(result[real_values <= 0] == 0)
    assert np.all(result[real_values > 0] == 1)


def test_magnitude_aware_sign_binarization():
    a = RNG.uniform(-2, 2, (3, 2, 2, 3))
    x = tf.Variable(a)
    y = lq.quantizers.MagnitudeAwareSign()(x)
    assert y.shape == x.shape
    np.testing.assert_allclose(tf.sign(y).numpy(), np.sign(a))
    np.testing.assert_allclose(tf.reduce_mean(tf.abs(y), axis=[0, 1, 2]).numpy(),
                               [np.mean(np.abs(a[:, :, :, i])) for i in range(3)])


@pytest.mark.parametrize("fn", [
    "ste_tern", lq.quantizers.SteTern(), lq.quantizers.SteTern(ternary_weight_networks=True),
    lq.quantizers.SteTern(threshold_value=RNG.uniform(0.01, 0.8))], ids=str)
def test_ternarization_basic(fn):
    f = in_graph(lq.quantizers.get(fn))
    ternarized_values = RNG.choice([-1, 0, 1], size=(4, 10))
    result = f(ternarized_values)
    np.testing.assert_allclose(result, ternarized_values)
    assert not np.any(result > 1) and not np.any(result < -1)
    assert np.any(result == -1) and np.any(result == 1) and np.any(result == 0)
    result = f(generate_real_values_with_zeros())
    assert not np.any(result > 1) and not np.any(result < -1)
    assert np.any(result == -1) and np.any(result == 1) and np.any(result == 0)


def _check_ternarized(result, real_values, threshold):
    assert np.all(result[real_values > threshold] == 1)
    assert np.all(result[real_values < -threshold] == -1)
    assert np.all(result[np.abs(real_values) < threshold] == 0)
    assert not np.any(result > 1) and not np.any(result < -1)


@pytest.mark.parametrize("fn", ["ste_tern", lq.quantizers.SteTern()], ids=str)
def test_ternarization_with_default_threshold(fn):
    real_values = generate_real_values_with_zeros()
    _check_ternarized(in_graph(lq.quantizers.get(fn))(real_values), real_values, 0.05)


def test_ternarization_with_custom_threshold():
    test_threshold = RNG.uniform(0.01, 0.8)
    real_values = generate_real_values_with_zeros()
    fn = lq.quantizers.SteTern(threshold_value=test_threshold)
    _check_ternarized(in_graph(fn)(real_values), real_values, test_threshold)


def test_ternarization_with_ternary_weight_networks():
    real_values = generate_real_values_with_zeros()
    test_threshold = 0.7 * np.sum(np.abs(real_values)) / np.size(real_values)
    fn = lq.quantizers.SteTern(ternary_weight_networks=True)
    _check_ternarized(in_graph(fn)(real_values), real_values, test_threshold)


@pytest.mark.parametrize("k_bit", [1, 2, 4, 6, 8])
@pytest.mark.parametrize("mode", ["activations", "weights"])
def test_dorefa_quantize(k_bit, mode):
    real_values = generate_real_values_with_zeros()
    result = in_graph(lq.quantizers.DoReFa(k_bit, mode))(real_values)
    n = 2**k_bit - 1
    if mode == "weights":  # preprocess as the quantizer does, test on the [0, 1] range
        real_values = np.tanh(real_values) / np.amax(np.abs(np.tanh(real_values)))
        real_values = real_values / 2.0 + 0.5
        result = result / 2.0 + 0.5
    assert not np.any(result > 1) and not np.any(result < 0)
    for i in range(n + 1):
        inside = (real_values > (2 * i - 1) / (2 * n)) & (real_values < (2 * i + 1) / (2 * n))
        np.testing.assert_allclose(result[inside], i / n, atol=1e-6)


# -- Larq's TestGradients (eager, float64 variables) ------------------------------------------


def _gradient(fn, x):
    tf_x = tf.Variable(x)
    with tf.GradientTape() as tape:
        activation = fn(tf_x)
    return tape.gradient(activation, tf_x).numpy()


@pytest.mark.parametrize("fn", [lq.quantizers.SteSign(clip_value=None),
                                lq.quantizers.SteTern(clip_value=None),
                                lq.quantizers.SteHeaviside(clip_value=None)], ids=str)
def test_identity_ste_grad(fn):
    x = generate_real_values_with_zeros(shape=(8, 3, 3, 16))
    np.testing.assert_allclose(_gradient(fn, x), np.ones_like(x))


@pytest.mark.parametrize("fn", [lq.quantizers.SteSign(), lq.quantizers.SteTern(),
                                lq.quantizers.SteHeaviside()], ids=str)
def test_ste_grad(fn):
    x = generate_real_values_with_zeros(shape=(8, 3, 3, 16))
    np.testing.assert_allclose(_gradient(fn, x), np.where(np.abs(x) <= 1, 1.0, 0.0))


def test_swish_grad():
    def swish_grad(x, beta):
        return beta * (2 - beta * x * np.tanh(beta * x / 2)) / (1 + np.cosh(beta * x))

    x = generate_real_values_with_zeros(shape=(8, 3, 3, 16))
    np.testing.assert_allclose(_gradient(lq.quantizers.SwishSign(), x), swish_grad(x, beta=5.0))
    np.testing.assert_allclose(_gradient(lq.quantizers.SwishSign(beta=10.0), x),
                               swish_grad(x, beta=10.0))


def test_approx_sign_grad():
    x = generate_real_values_with_zeros(shape=(8, 3, 3, 16))
    np.testing.assert_allclose(_gradient(lq.quantizers.ApproxSign(), x),
                               np.where(np.abs(x) <= 1, 2 - 2 * np.abs(x), 0.0))


def test_magnitude_aware_sign_grad():
    a = RNG.uniform(-2, 2, (3, 2, 2, 3))
    scale_vector = [np.mean(np.abs(a[:, :, :, i])) for i in range(3)]
    np.testing.assert_allclose(_gradient(lq.quantizers.MagnitudeAwareSign(), a),
                               np.where(abs(a) < 1, np.ones(a.shape) * scale_vector, 0))


@pytest.mark.parametrize("mode", ["activations", "weights"])
def test_dorefa_ste_grad(mode):
    x = generate_real_values_with_zeros(shape=(8, 3, 3, 16))
    if mode == "activations":
        expected = np.where((x >= 0) & (x <= 1), 1.0, 0.0)
    else:  # tanh limits, the max norm is held constant, the rounding passes the gradient
        expected = 1 / np.cosh(x) ** 2.0 / np.amax(np.abs(np.tanh(x)))
    np.testing.assert_allclose(_gradient(lq.quantizers.DoReFa(2, mode), x), expected)


# -- Larq's metrics tests ---------------------------------------------------------------------

METRIC_QUANTIZERS = [("ste_sign", lq.quantizers.SteSign),
                     ("approx_sign", lq.quantizers.ApproxSign),
                     ("ste_heaviside", lq.quantizers.SteHeaviside),
                     ("swish_sign", lq.quantizers.SwishSign),
                     ("magnitude_aware_sign", lq.quantizers.MagnitudeAwareSign),
                     ("ste_tern", lq.quantizers.SteTern),
                     ("dorefa_quantizer", lq.quantizers.DoReFa),
                     ("dorefa_quantizer", functools.partial(lq.quantizers.DoReFa,
                                                            mode="weights"))]


@pytest.mark.parametrize("quantizer", METRIC_QUANTIZERS,
                         ids=[f"{n}-{i}" for i, (n, _) in enumerate(METRIC_QUANTIZERS)])
def test_metrics(quantizer):
    """Larq's rule, with the metric tracked by the layer of the kernel quantizer (Keras 3
    collects a layer's metrics, its sublayers' included, in ``layer.metrics``)."""
    quantizer_str, quantizer_cls = quantizer

    def first_layer(**kwargs):
        model = keras.Sequential([keras.Input((32,)), lq.layers.QuantDense(3, **kwargs)])
        model.compile(loss="mse", optimizer="sgd")
        return model, model.layers[0]

    _, layer = first_layer(kernel_quantizer=quantizer_str)
    assert layer.metrics == []
    with lq.context.metrics_scope(["flip_ratio"]):
        _, layer = first_layer(kernel_quantizer=quantizer_str)
    assert [type(m) for m in layer.metrics] == [lq.metrics.FlipRatio]
    model, layer = first_layer(kernel_quantizer=quantizer_cls(metrics=["flip_ratio"]))
    assert [type(m) for m in layer.metrics] == [lq.metrics.FlipRatio]
    history = model.fit(RNG.normal(size=(8, 32)), RNG.normal(size=(8, 3)), batch_size=4,
                        verbose=0)
    assert f"flip_ratio/{layer.kernel_quantizer.name}" in history.history


def test_get_kernel_quantizer_assigns_metrics():
    with lq.context.metrics_scope(["flip_ratio"]):
        ste_sign = lq.quantizers.get_kernel_quantizer("ste_sign")
        assert "flip_ratio" in lq.context.get_training_metrics()
    assert isinstance(ste_sign, lq.quantizers.SteSign)
    assert "flip_ratio" in ste_sign._custom_metrics


def test_get_kernel_quantizer_accepts_function():
    custom_quantizer = lq.quantizers.get_kernel_quantizer(lambda x: x)
    assert callable(custom_quantizer)
    assert not hasattr(custom_quantizer, "_custom_metrics")


def test_backwards_compat_aliases():
    assert lq.quantizers.DoReFaQuantizer == lq.quantizers.DoReFa
    assert lq.quantizers.NoOpQuantizer == lq.quantizers.NoOp


# -- quantizers are Keras layers --------------------------------------------------------------


@pytest.mark.parametrize("cls, kwargs", EVERY_QUANTIZER, ids=QUANTIZER_IDS)
def test_every_quantizer_is_a_keras_layer_of_functional_and_sequential_models(cls, kwargs,
                                                                            tmp_path):
    quantizer = cls(**kwargs)
    assert isinstance(quantizer, (keras.layers.Layer, lq.quantizers.Quantizer))
    symbolic = quantizer(keras.Input((4,)))
    assert tuple(symbolic.shape) == (None, 4)
    x = RNG.uniform(-1.5, 1.5, (5, 4)).astype("float32")
    inputs = keras.Input((4,))
    functional = keras.Model(inputs, keras.layers.Dense(2)(cls(**kwargs)(inputs)))
    sequential = keras.Sequential([keras.Input((4,)), cls(**kwargs), keras.layers.Dense(2)])
    for model in (functional, sequential):
        dense = model.layers[-1]
        expected = x_q = np.asarray(quantizer(tf.constant(x)))
        expected = x_q @ dense.kernel.numpy() + dense.bias.numpy()
        np.testing.assert_allclose(np.asarray(model(x)), expected, rtol=1e-6, atol=1e-6)
        model.save(tmp_path / "m.keras")
        loaded = keras.saving.load_model(tmp_path / "m.keras")
        assert type(loaded.layers[-2]) is cls
        assert loaded.layers[-2].get_config() == model.layers[-2].get_config()
        np.testing.assert_array_equal(np.asarray(loaded(x)), np.asarray(model(x)))


@pytest.mark.parametrize("cls, kwargs", EVERY_QUANTIZER, ids=QUANTIZER_IDS)
def test_every_quantizer_round_trips_its_config_and_serves_by_name_in_quant_layers(cls, kwargs):
    quantizer = cls(**kwargs)
    config = quantizer.get_config()
    restored = cls.from_config(config)
    assert restored.get_config() == config and restored.precision == quantizer.precision
    config = keras.saving.serialize_keras_object(quantizer)
    assert config["registered_name"] == f"bnn.larq>{cls.__name__}"
    assert type(keras.saving.deserialize_keras_object(config)) is cls
    name = LARQ_NAMES.get(cls.__name__)
    for given in (quantizer, name) if name else (quantizer,):
        layer = lq.layers.QuantDense(3, input_quantizer=given, kernel_quantizer=given)
        assert isinstance(layer.kernel_quantizer, cls)
        x = RNG.uniform(-1.5, 1.5, (2, 5)).astype("float32")
        layer(x)
        expected = quantizer(tf.constant(x)).numpy() @ quantizer(layer.kernel).numpy()
        np.testing.assert_allclose(layer(x).numpy(), expected + layer.bias.numpy(), rtol=1e-5,
                                   atol=1e-5)


def test_a_quantizer_changed_after_construction_computes_with_the_new_value():
    x = tf.constant([[-1.5, -0.7, 0.0, 0.7, 1.5]])
    quantizer = lq.quantizers.SteSign()
    quantizer.clip_value = None
    assert _gradient(quantizer, x.numpy()).tolist() == [[1.0] * 5]
    layer = lq.layers.QuantDense(2, kernel_quantizer=lq.quantizers.DoReFa(k_bit=2,
                                                                          mode="weights"))
    layer(x)
    layer.kernel_quantizer.precision = 1  # Larq's DoReFa keeps k_bit there
    assert sorted(np.unique(layer.binary_kernel().numpy())) == [-1.0, 1.0]
    layer.kernel_quantizer.mode = "unknown"
    with pytest.raises(ValueError, match="mode must be one of .*'unknown'"):
        layer(x)


def test_quantizers_written_as_larqs_subclasses_are_called_as_written():
    class Halved(lq.quantizers.Quantizer):  # Larq's base class, a call and a precision
        precision = 1

        def call(self, inputs):
            return 0.5 * tf.sign(inputs)

    class Doubled(lq.quantizers.SteSign):  # a built-in quantizer with a call of its own
        def call(self, inputs):
            return 2.0 * super().call(inputs)

    x = tf.constant(RNG.normal(size=(2, 4)).astype("float32"))
    for quantizer, scale in ((Halved(), 0.5), (Doubled(), 2.0)):
        layer = lq.layers.QuantDense(3, kernel_quantizer=quantizer, use_bias=False)
        assert bq.equivalent(quantizer) is None
        with tf.GradientTape() as tape:
            y = layer(x)
        assert layer.kernel.precision == 1
        np.testing.assert_allclose(y.numpy(), x.numpy() @ (scale * np.sign(layer.kernel.numpy())),
                                   rtol=1e-5, atol=1e-6)
        gradient = tape.gradient(y, layer.kernel).numpy()
        assert np.any(gradient != 0) == (scale == 2.0)  # tf.sign's gradient is 0, SteSign's not


def test_ste_sign_layers_keep_bnns_fast_path():
    """The ``ste_sign`` of Larq, by name or object, inside a layer with ``weight_clip`` runs as
    bnn's own ``ste_sign`` does: the same product, the kernel mask skipped."""
    x = tf.constant(RNG.normal(size=(4, 6)).astype("float32"))
    ours = bl.BinaryDense(3, input_quantizer="ste_sign", kernel_quantizer="ste_sign")
    ours.build(x.shape)
    for quantizer in ("ste_sign", lq.quantizers.SteSign()):
        layer = lq.layers.QuantDense(3, input_quantizer=quantizer, kernel_quantizer=quantizer,
                                     kernel_constraint="weight_clip", use_bias=False)
        layer.build(x.shape)
        assert layer._kernel_in_range()
        assert layer._product(x, training=False) == ours._product(x, training=False)
        ours.kernel.assign(layer.kernel)
        np.testing.assert_array_equal(layer(x).numpy(), ours(x).numpy())


# -- against Larq itself ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def larq_quantizers(request):
    """Runs tests/larq/larq_quantizers_reference.py in Larq's environment; returns (arrays,
    manifest), kept in pytest's cache keyed by the script and the Larq python."""
    out = larq_script_output(request, "larq_quantizers_reference.py", "manifest.json")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["larq"] == "0.14.0", manifest
    return np.load(out / "reference.npz"), manifest


def _cases():
    """The case ids of the reference script, read from it without running it."""
    text = (ROOT / "tests" / "larq" / "larq_quantizers_reference.py").read_text()
    start = text.index("CASES = [")
    return [line.split('"')[1] for line in text[start:text.index("]\n", start)].splitlines()
            if line.strip().startswith('("')]


RUNS = {"eager": lambda f: f, "tf.function": tf.function,
        "xla": functools.partial(tf.function, jit_compile=True)}


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("case_id", _cases())
def test_quantizers_give_larqs_values_and_gradients(larq_quantizers, case_id, run):
    reference, manifest = larq_quantizers
    case = next(c for c in manifest["cases"] if c["id"] == case_id)
    quantizer = getattr(lq.quantizers, case["class"])(**case["kwargs"])
    x, dy = (reference[f"case/{case_id}/{k}"] for k in ("x", "dy"))

    @RUNS[run]
    def value_and_gradient(x, dy):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = quantizer(x)
        return y, tape.gradient(y, x, output_gradients=dy)

    y, dx = value_and_gradient(tf.constant(x), tf.constant(dy))
    np.testing.assert_allclose(y.numpy(), reference[f"case/{case_id}/y"], rtol=1e-6, atol=1e-6)
    if run == "eager":
        np.testing.assert_array_equal(y.numpy(), reference[f"case/{case_id}/y"])
    np.testing.assert_allclose(dx.numpy(), reference[f"case/{case_id}/dx"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case_id, threshold", [("ste_tern", 0.05), ("ste_tern_threshold", 0.3),
                                                ("ste_tern_twn", None)])
def test_ste_tern_at_its_threshold_is_larqs_plus_or_minus_one(larq_quantizers, case_id,
                                                              threshold):
    reference, manifest = larq_quantizers
    case = next(c for c in manifest["cases"] if c["id"] == case_id)
    x, expected = reference[f"case/{case_id}/x"], reference[f"case/{case_id}/y"]
    if threshold is None:  # the input holds ±(its own threshold), computed as Larq does
        threshold = np.float32(0.7) * np.abs(x).sum(dtype=np.float32) / np.float32(x.size)
        at = np.isclose(np.abs(x), threshold, rtol=1e-6, atol=0)
    else:
        at = np.abs(x) == np.float32(threshold)
    assert at.sum() >= 2 and np.array_equal(expected[at], np.sign(x[at]))
    strict = bq.ste_tern(tf.constant(x), **{**case["kwargs"], "clip_value": 1.0}).numpy()
    assert np.all(strict[at] == 0)  # bnn's own rule differs exactly there
    quantizer = lq.quantizers.SteTern(**case["kwargs"])
    np.testing.assert_array_equal(quantizer(tf.constant(x)).numpy(), expected)
    np.testing.assert_array_equal(
        lq.quantizers.ste_tern(tf.constant(x), **case["kwargs"]).numpy(), expected)


def test_configs_are_larqs(larq_quantizers):
    _, manifest = larq_quantizers
    assert {c["class"] for c in manifest["configs"]} == {cls.__name__ for cls, _ in
                                                        EVERY_QUANTIZER}
    for recorded in manifest["configs"]:
        cls = getattr(lq.quantizers, recorded["class"])
        quantizer = cls(**recorded["kwargs"])
        larq_config = recorded["config"]
        ours = quantizer.get_config()
        assert set(ours) == set(larq_config), recorded["class"]
        layer_keys = ("name", "dtype")
        assert ({k: v for k, v in ours.items() if k not in layer_keys}
                == {k: v for k, v in larq_config.items() if k not in layer_keys})
        assert quantizer.precision == recorded["precision"]
        read = lq.quantizers.get({"class_name": recorded["class"], "config": larq_config})
        assert type(read) is cls
        assert {k: v for k, v in read.get_config().items() if k not in layer_keys} == \
            {k: v for k, v in larq_config.items() if k not in layer_keys}


GUIDE = {"dense": lambda: lq.layers.QuantDense(3, input_quantizer=identity_sign,
                                               kernel_quantizer=identity_sign),
         "conv2d": lambda: lq.layers.QuantConv2D(3, 3, padding="same",
                                                 input_quantizer=identity_sign,
                                                 kernel_quantizer=identity_sign)}


def _guide_layer(reference, case_id):
    layer = GUIDE[case_id]()
    layer.build(reference[f"guide/{case_id}/x"].shape)
    layer.set_weights([reference[f"guide/{case_id}/kernel"], reference[f"guide/{case_id}/bias"]])
    return layer


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("case_id", sorted(GUIDE))
def test_the_custom_quantizer_of_larqs_guide_runs_eagerly_traced_and_compiled(larq_quantizers,
                                                                             case_id, run):
    """Larq's guide: a function on ``tf.custom_gradient`` as input and kernel quantizer. It gets
    the kernel's value, as in Larq, so it runs eagerly too, and its identity gradient reaches the
    latent kernel."""
    reference, _ = larq_quantizers
    ref = {k: reference[f"guide/{case_id}/{k}"] for k in ("x", "w", "y", "dx", "dkernel")}
    layer = _guide_layer(reference, case_id)

    @RUNS[run]
    def forward_backward(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x)
            loss = tf.reduce_sum(y * ref["w"])
        return (y, *tape.gradient(loss, [x, layer.kernel]))

    y, dx, dkernel = forward_backward(tf.constant(ref["x"]))
    np.testing.assert_allclose(y.numpy(), ref["y"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dx.numpy(), ref["dx"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dkernel.numpy(), ref["dkernel"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["run_eagerly", "graph", "jit_compile"])
def test_the_custom_quantizer_of_larqs_guide_trains_in_fit(larq_quantizers, mode):
    """One SGD step of ``fit`` on ``sum(y * w)`` moves the latent kernel by the learning rate
    times Larq's gradient."""
    reference, _ = larq_quantizers
    ref = {k: reference[f"guide/dense/{k}"] for k in ("x", "w", "dkernel")}
    layer = _guide_layer(reference, "dense")
    model = keras.Sequential([keras.Input(ref["x"].shape[1:]), layer])
    start = layer.kernel.numpy()
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=lambda _, y: tf.reduce_sum(y * ref["w"]),
                  run_eagerly=mode == "run_eagerly", jit_compile=mode == "jit_compile")
    model.fit(ref["x"], np.zeros_like(ref["w"]), batch_size=len(ref["x"]), epochs=1,
              shuffle=False, verbose=0)
    np.testing.assert_allclose(layer.kernel.numpy(), start - 0.1 * ref["dkernel"], rtol=1e-5,
                               atol=1e-6)
