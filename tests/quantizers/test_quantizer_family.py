"""Every quantizer of the family against its formula written independently in numpy."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import bnn
from bnn import quantizers

GRID = np.array([-3.0, -2.0, -1.0 - 1e-3, -1.0, -1.0 + 1e-3, -0.7, -0.5, -0.05 - 1e-3, -0.05,
                 -1e-3, -0.0, 0.0, 1e-3, 0.05, 0.05 + 1e-3, 0.2, 1 / 6, 0.5, 0.7, 1.0 - 1e-3,
                 1.0, 1.0 + 1e-3, 2.0, 3.0])


def np_sign(x):
    return np.where(x >= 0, 1.0, -1.0)


def np_window(x, clip=1.0):
    return (np.abs(x) <= clip).astype(float)


def np_swish_grad(x, beta=5.0):
    bx = beta * x
    return beta * (2 - bx * np.tanh(bx / 2)) / (1 + np.cosh(bx))


def np_channel_scale(x):
    return np.mean(np.abs(x), axis=tuple(range(x.ndim - 1)))


# name: (kwargs, forward(x), d forward / dx (elementwise), level set or None, gradient window)
REFERENCES = {
    "ste_sign": ({}, np_sign, np_window, (-1, 1), lambda x: np.abs(x) <= 1),
    "approx_sign": ({}, np_sign, lambda x: np.maximum(2 - 2 * np.abs(x), 0), (-1, 1),
                    lambda x: np.abs(x) <= 1),
    "swish_sign": ({}, np_sign, np_swish_grad, (-1, 1), None),
    "magnitude_aware_sign": ({}, lambda x: np_sign(x) * np_channel_scale(x),
                             lambda x: np_window(x) * np_channel_scale(x), None,
                             lambda x: np.abs(x) <= 1),
    "ste_heaviside": ({}, lambda x: (x > 0).astype(float), np_window, (0, 1),
                      lambda x: np.abs(x) <= 1),
    "ste_tern": ({}, lambda x: np_sign(x) * (np.abs(x) > 0.05), np_window, (-1, 0, 1),
                 lambda x: np.abs(x) <= 1),
    "dorefa": ({}, lambda x: np.round(3 * np.clip(x, 0, 1)) / 3,
               lambda x: ((x >= 0) & (x <= 1)).astype(float), (0, 1 / 3, 2 / 3, 1),
               lambda x: (x >= 0) & (x <= 1)),
}
NAMES = sorted(REFERENCES)
FLOAT_DTYPES = [tf.float16, tf.bfloat16, tf.float32, tf.float64]


def value_and_grad(fn, x, upstream=None):
    x = tf.convert_to_tensor(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
        loss = tf.reduce_sum(y * (tf.ones_like(y) if upstream is None else upstream))
    return y, tape.gradient(loss, x)


def test_the_family_is_registered():
    assert set(NAMES) <= set(quantizers.names())


@pytest.mark.parametrize("name", NAMES)
def test_forward_and_gradient_match_numpy_formula_on_grid(name):
    kwargs, forward, derivative, _, _ = REFERENCES[name]
    x = np.stack([GRID, GRID[::-1]], axis=-1)  # 2 channels, for the per-channel scale
    upstream = np.random.default_rng(0).normal(size=x.shape)
    y, g = value_and_grad(quantizers.get(name), tf.constant(x, tf.float64),
                          tf.constant(upstream, tf.float64))
    np.testing.assert_allclose(y.numpy(), forward(x), rtol=1e-12, atol=0)
    np.testing.assert_allclose(g.numpy(), upstream * derivative(x), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("clip", [0.5, 2.0])
@pytest.mark.parametrize("name", ["ste_sign", "ste_heaviside", "ste_tern", "magnitude_aware_sign"])
def test_clip_value_sets_the_gradient_window(name, clip):
    x = np.array([[-clip - 1e-3], [-clip], [0.0], [clip], [clip + 1e-3]])
    _, g = value_and_grad(quantizers.get({"name": name, "clip_value": clip}), x)
    scale = np_channel_scale(x) if name == "magnitude_aware_sign" else 1.0
    np.testing.assert_allclose(g.numpy(), np_window(x, clip) * scale)


def test_ste_tern_threshold_and_ternary_weight_networks():
    x = np.array([-0.3, -0.1, 0.0, 0.1, 0.3, 0.6])
    y = quantizers.get({"name": "ste_tern", "threshold_value": 0.2})(x).numpy()
    np.testing.assert_array_equal(y, [-1, 0, 0, 0, 1, 1])
    delta = 0.7 * np.mean(np.abs(x))  # 0.1633...
    y = quantizers.ste_tern(tf.constant(x), ternary_weight_networks=True).numpy()
    np.testing.assert_array_equal(y, np_sign(x) * (np.abs(x) > delta))


@pytest.mark.parametrize("k_bit", [1, 2, 4])
def test_dorefa_has_2_to_the_k_levels(k_bit):
    x = np.linspace(-0.5, 1.5, 401)
    y = quantizers.dorefa(tf.constant(x), k_bit=k_bit).numpy()
    n = 2 ** k_bit - 1
    np.testing.assert_allclose(y, np.round(n * np.clip(x, 0, 1)) / n)
    assert len(np.unique(y)) == n + 1


@pytest.mark.parametrize("beta", [1.0, 10.0])
def test_swish_sign_gradient_follows_beta(beta):
    x = np.linspace(-2, 2, 41)
    _, g = value_and_grad(quantizers.get({"name": "swish_sign", "beta": beta}), x)
    np.testing.assert_allclose(g.numpy(), np_swish_grad(x, beta), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("name", NAMES)
def test_output_and_gradient_keep_dtype(name, dtype):
    kwargs, forward, derivative, _, _ = REFERENCES[name]
    x = np.array([[-1.5, 0.25], [-0.5, 0.75], [0.0, 1.5]])
    y, g = value_and_grad(quantizers.get(name), tf.constant(x, dtype))
    assert y.dtype == dtype and g.dtype == dtype
    tol = 1e-2 if dtype in (tf.float16, tf.bfloat16) else 1e-6
    np.testing.assert_allclose(y.numpy().astype(float), forward(x), rtol=tol, atol=tol)
    np.testing.assert_allclose(g.numpy().astype(float), derivative(x), rtol=tol, atol=tol)


@pytest.mark.parametrize("name", NAMES)
def test_lookup_by_name_dict_and_keras_serialization_round_trip(name):
    by_name = quantizers.get(name)
    assert isinstance(by_name, quantizers.Quantizer) and by_name.name == name
    assert quantizers.get({"name": name, **by_name.get_config()}) == by_name
    restored = keras.saving.deserialize_keras_object(quantizers.serialize(by_name))
    assert restored == by_name and restored is not by_name
    assert quantizers.get(type(by_name).function) == by_name  # the plain function resolves too


def test_lookup_errors_name_the_known_quantizers():
    with pytest.raises(ValueError, match="known quantizers: .*dorefa"):
        quantizers.get("sign")
    with pytest.raises(ValueError, match="bad arguments for quantizer 'dorefa'"):
        quantizers.get({"name": "dorefa", "bits": 3})


@pytest.mark.parametrize("name", NAMES)
def test_binary_dense_with_quantizer_saves_and_loads(name, tmp_path):
    model = keras.Sequential([keras.Input((6,)),
                              bnn.BinaryDense(3, input_quantizer=name, kernel_quantizer=name)])
    x = np.random.default_rng(1).normal(size=(4, 6)).astype("float32")
    layer = model.layers[0]
    kernel = layer.kernel.numpy()
    want = REFERENCES[name][1](x) @ REFERENCES[name][1](kernel)
    np.testing.assert_allclose(model(x).numpy(), want, rtol=1e-5, atol=1e-5)
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    assert loaded.layers[0].kernel_quantizer == layer.kernel_quantizer
    assert loaded.layers[0].input_quantizer == layer.input_quantizer
    np.testing.assert_array_equal(loaded(x).numpy(), model(x).numpy())


def _finite_arrays(dtype, bound=None):
    # no subnormals: TensorFlow's CPU kernels flush them to zero, so -1e-309 compares as 0
    shapes = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=5)
    if dtype == tf.bfloat16:  # drawn as float32 within bfloat16's finite range, then cast
        bound = float(np.float32(bound or 3e38))
        elements = st.floats(-bound, bound, width=32, allow_subnormal=False)
        return hnp.arrays(np.float32, shapes, elements=elements)
    np_dtype = dtype.as_numpy_dtype
    bound = None if bound is None else float(np.dtype(np_dtype).type(bound))
    return hnp.arrays(np_dtype, shapes,
                      elements=st.floats(-bound if bound else None, bound, allow_nan=False,
                                         allow_infinity=False, allow_subnormal=False,
                                         width=np.dtype(np_dtype).itemsize * 8))


def _check_properties(name, dtype, array):
    _, _, _, levels, window = REFERENCES[name]
    x = tf.cast(tf.constant(array), dtype)
    y, g = value_and_grad(quantizers.get(name), x)
    assert y.shape == x.shape and g.shape == x.shape
    assert y.dtype == dtype and g.dtype == dtype
    yv, gv, xv = (t.numpy().astype(np.float64) for t in (y, g, x))
    assert np.isfinite(yv).all(), (name, xv, yv)
    assert np.isfinite(gv).all(), (name, xv, gv)
    if levels is not None:
        allowed = np.array([tf.cast(tf.constant(v, tf.float64), dtype).numpy() for v in levels],
                           np.float64)
        assert np.isin(yv, allowed).all(), (name, yv)
    else:  # magnitude_aware_sign: +-scale of each channel
        scale = np.broadcast_to(np.abs(yv).max(axis=tuple(range(yv.ndim - 1))), yv.shape)
        np.testing.assert_array_equal(np.abs(yv), scale)
    if window is not None:
        assert (gv[~window(xv)] == 0).all(), (name, xv, gv)


SAFE = ["ste_sign", "approx_sign", "ste_heaviside", "ste_tern", "dorefa"]


@pytest.mark.parametrize("name", SAFE)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_property_finite_in_finite_out_levels_and_gradient_window(name, data):
    dtype = data.draw(st.sampled_from(FLOAT_DTYPES))
    _check_properties(name, dtype, data.draw(_finite_arrays(dtype)))


@pytest.mark.parametrize("name", ["swish_sign", "magnitude_aware_sign"])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_property_for_moderate_inputs(name, data):
    """Same properties for swish_sign and magnitude_aware_sign on inputs up to 1e3."""
    dtype = data.draw(st.sampled_from(FLOAT_DTYPES))
    _check_properties(name, dtype, data.draw(_finite_arrays(dtype, bound=1e3)))


@pytest.mark.parametrize("dtype, big", [(tf.float16, 6e4), (tf.float32, 1e38)])
def test_swish_sign_gradient_is_finite_for_huge_inputs(dtype, big):
    _, g = value_and_grad(quantizers.swish_sign, tf.constant([big, -big, 1.0], dtype))
    assert np.isfinite(g.numpy().astype(float)).all(), g


def test_magnitude_aware_sign_output_is_finite_for_large_float16_inputs():
    x = tf.constant([[6e4], [6e4], [1.0]], tf.float16)
    assert np.isfinite(quantizers.magnitude_aware_sign(x).numpy().astype(float)).all()


def test_no_op_is_the_identity_in_both_passes_and_keeps_its_precision():
    x = np.array([-2.0, -0.3, 0.0, 0.7, 5.0])
    y, g = value_and_grad(quantizers.get("no_op"), x)
    np.testing.assert_array_equal(y.numpy(), x)
    np.testing.assert_array_equal(g.numpy(), np.ones_like(x))
    quantizer = quantizers.get({"name": "no_op", "precision": 8})
    assert quantizer.precision == 8 and quantizer.get_config() == {"precision": 8}
    restored = keras.saving.deserialize_keras_object(quantizers.serialize(quantizer))
    assert restored == quantizer and restored.precision == 8


@pytest.mark.parametrize("k_bit", [1, 2, 3])
def test_dorefa_weights_mode_matches_its_formula(k_bit):
    x = np.stack([GRID, GRID[::-1] / 2], axis=-1)
    upstream = np.random.default_rng(1).normal(size=x.shape)
    quantizer = quantizers.get({"name": "dorefa", "k_bit": k_bit, "mode": "weights"})
    y, g = value_and_grad(quantizer, tf.constant(x, tf.float64),
                          tf.constant(upstream, tf.float64))
    n = 2**k_bit - 1
    peak = np.abs(np.tanh(x)).max()
    u = np.tanh(x) / (2 * peak) + 0.5
    np.testing.assert_allclose(y.numpy(), 2 * np.round(n * u) / n - 1, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(g.numpy(), upstream * (1 - np.tanh(x) ** 2) / peak, rtol=1e-9)
    assert set(np.round((y.numpy().ravel() + 1) / 2 * n, 9)) <= set(range(n + 1))


def test_dorefa_rejects_an_unknown_mode():
    with pytest.raises(ValueError, match="mode must be one of"):
        quantizers.get({"name": "dorefa", "mode": "both"})
