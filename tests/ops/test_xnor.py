"""bnn.ops.bitpack and bnn.ops.xnor: packing in TensorFlow, and the exact xor-popcount products
binary layers train with (forward equal to the float product, gradients equal to the float
product's)."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import bnn
from bnn.native import dispatch
from bnn.ops import bitpack, xnor
from bnn.errors import SettingError
from bnn.ops.bitpack import pack_bits


def _pm1(rng, shape):
    return np.where(rng.random(shape) < 0.5, 1.0, -1.0).astype("float32")


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 4), st.integers(1, 200), st.integers(1, 5), st.sampled_from([0, 1, -1]))
def test_pack_equals_numpy_pack_bits_along_any_axis(rows, n, inner, axis):
    rng = np.random.default_rng(rows * 1000 + n)
    shape = [rows + 1, n, inner] if axis == 1 else ([n, rows + 1, inner] if axis == 0
                                                    else [rows + 1, inner, n])
    a = rng.standard_normal(shape).astype("float32")
    got = bitpack.pack(tf.constant(a) >= 0, axis=axis).numpy()
    np.testing.assert_array_equal(got, pack_bits(a, axis=axis))


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 4), st.integers(1, 200), st.integers(1, 5), st.sampled_from([0, 1, -1]))
def test_int32_halves_are_the_words_split_low_first_and_both_unpack(rows, n, inner, axis):
    rng = np.random.default_rng(rows * 1000 + n + 7)
    shape = [rows + 1, n, inner] if axis == 1 else ([n, rows + 1, inner] if axis == 0
                                                    else [rows + 1, inner, n])
    a = rng.standard_normal(shape).astype("float32")
    words = pack_bits(a, axis=axis)
    halves = bitpack.pack(tf.constant(a) >= 0, axis=axis, word_bits=32).numpy()
    assert halves.dtype == np.int32
    # Little-endian int64 storage is the low int32 half then the high one.
    joined = np.moveaxis(halves, axis, -1).copy().view(np.int64)
    np.testing.assert_array_equal(joined, np.moveaxis(words, axis, -1))
    signs = np.where(a >= 0, 1.0, -1.0)
    for packed in (tf.constant(words), tf.constant(halves)):
        np.testing.assert_array_equal(bitpack.unpack(packed, n, axis=axis).numpy(), signs)


def test_pack_rejects_other_word_sizes():
    with pytest.raises(ValueError, match="word_bits must be 32 or 64, got 16"):
        bitpack.pack(tf.constant([[True]]), word_bits=16)


def test_pack_inside_xla_with_unknown_batch():
    fn = tf.function(lambda b: bitpack.pack(b >= 0), jit_compile=True,
                     input_signature=[tf.TensorSpec([None, 70], tf.float32)])
    a = np.random.default_rng(0).standard_normal((3, 70)).astype("float32")
    np.testing.assert_array_equal(fn(tf.constant(a)).numpy(), pack_bits(a))


def _grads(fn, x, w, dy):
    x, w = tf.constant(x), tf.constant(w)
    with tf.GradientTape() as tape:
        tape.watch([x, w])
        y = fn(x, w)
        loss = tf.reduce_sum(y * dy)
    return (y.numpy(), *[g.numpy() for g in tape.gradient(loss, [x, w])])


@pytest.mark.parametrize("batch,n,units", [(7, 130, 9), (1, 64, 1), (5, 2048, 33)])
def test_binary_matmul_forward_exact_and_gradients_of_matmul(batch, n, units):
    rng = np.random.default_rng(n)
    x, w = _pm1(rng, (batch, n)), _pm1(rng, (n, units))
    dy = rng.standard_normal((batch, units)).astype("float32")
    y, dx, dw = _grads(xnor.binary_matmul, x, w, dy)
    np.testing.assert_array_equal(y, x.astype(np.float64) @ w)
    _, dx_ref, dw_ref = _grads(tf.matmul, x, w, dy)
    np.testing.assert_allclose(dx, dx_ref, rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(dw, dw_ref, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("jit", [False, True])
def test_binary_matmul_of_a_latent_kernel_is_the_product_of_its_signs(jit):
    """A real-valued kernel enters through its sign (0 counts as +1) in the forward pass and in
    the input's gradient; its own gradient is passed straight through."""
    rng = np.random.default_rng(3)
    x, dy = _pm1(rng, (6, 200)), rng.standard_normal((6, 17)).astype("float32")
    w = rng.uniform(-1, 1, (200, 17)).astype("float32")
    w[0, :5] = 0.0
    signs = np.where(w >= 0, 1.0, -1.0).astype("float32")
    fn = tf.function(xnor.binary_matmul, jit_compile=jit)
    y, dx, dw = _grads(fn, x, w, dy)
    _, dx_ref, dw_ref = _grads(tf.matmul, x, signs, dy)
    np.testing.assert_array_equal(y, x.astype(np.float64) @ signs)
    np.testing.assert_allclose(dx, dx_ref, rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(dw, dw_ref, rtol=1e-6, atol=1e-5)


def _bfloat16_case(seed):
    """±1 bfloat16 inputs, a float32 latent kernel, a small-integer bfloat16 output gradient
    (every product and sum exact in bfloat16), and the kernel's signs in bfloat16."""
    rng = np.random.default_rng(seed)
    x = tf.constant(_pm1(rng, (5, 70)), tf.bfloat16)
    w = rng.uniform(-1, 1, (70, 12)).astype("float32")
    dy = tf.constant(rng.integers(-3, 4, (5, 12)), tf.bfloat16)
    return x, w, dy, tf.constant(np.where(w >= 0, 1.0, -1.0), tf.bfloat16)


@pytest.mark.parametrize("jit", [False, True])
def test_binary_matmul_in_bfloat16_has_the_gradients_of_the_bfloat16_product(jit):
    """Under a bfloat16 policy the input's gradient takes TensorFlow's product of the unpacked
    signs outside XLA and XLA's inside it; both equal the bfloat16 product of the signs (±1 and
    small integer sums are exact in bfloat16)."""
    x, w, dy, signs = _bfloat16_case(4)
    fn = tf.function(xnor.binary_matmul, jit_compile=jit)
    y, dx, dw = _grads(fn, x, tf.constant(w, tf.bfloat16), dy)
    _, dx_ref, dw_ref = _grads(tf.matmul, x, signs, dy)
    assert dx.dtype == dx_ref.dtype and dx.dtype.name == "bfloat16"
    np.testing.assert_array_equal(y, _grads(tf.matmul, x, signs, dy)[0])
    np.testing.assert_array_equal(dx, dx_ref)
    np.testing.assert_array_equal(dw, dw_ref)


@pytest.mark.parametrize("jit", [False, True])
def test_binary_matmul_takes_a_float32_latent_kernel_beside_bfloat16_inputs(jit):
    """A float32 kernel beside bfloat16 inputs (a layer's latent kernel under a bfloat16
    policy) gives the bfloat16 product of its signs, and its gradient in float32."""
    x, w, dy, signs = _bfloat16_case(5)
    fn = tf.function(xnor.binary_matmul, jit_compile=jit)
    y, dx, dw = _grads(fn, x, w, dy)
    y_ref, dx_ref, dw_ref = _grads(tf.matmul, x, signs, dy)
    assert y.dtype.name == dx.dtype.name == "bfloat16" and dw.dtype == np.float32
    np.testing.assert_array_equal(y, y_ref)
    np.testing.assert_array_equal(dx, dx_ref)
    np.testing.assert_array_equal(dw, dw_ref.astype(np.float32))


@pytest.mark.parametrize("padding,pad_value", [("same", 1.0), ("same", -1.0), ("valid", 1.0)])
@pytest.mark.parametrize("strides", [(1, 1), (2, 2), (2, 1)])
@pytest.mark.parametrize("gradients", ["xla", "patches", "tensorflow"])
def test_binary_conv2d_forward_exact_and_gradients_of_padded_conv(monkeypatch, padding, pad_value,
                                                                  strides, gradients):
    monkeypatch.setenv("BNN_CONV_GRADIENTS", gradients)
    assert dispatch.conv_gradient_kernels() == gradients
    assert (dispatch.conv_gradient_kernels() == "xla") is (gradients == "xla")
    rng = np.random.default_rng(sum(strides))
    x, w = _pm1(rng, (3, 9, 8, 70)), _pm1(rng, (3, 3, 70, 5))

    def reference(x, w):
        if padding == "same":
            pads = [[0, 0], list(xnor.same_pads(9, 3, strides[0])),
                    list(xnor.same_pads(8, 3, strides[1])), [0, 0]]
            x = tf.pad(x, pads, constant_values=pad_value)
        return tf.nn.conv2d(x, w, [1, *strides, 1], "VALID")

    dy = rng.standard_normal(reference(x, w).shape).astype("float32")
    y, dx, dw = _grads(lambda a, b: xnor.binary_conv2d(a, b, strides, padding, pad_value),
                       x, w, dy)
    y_ref, dx_ref, dw_ref = _grads(reference, x, w, dy)
    np.testing.assert_array_equal(y, y_ref)
    np.testing.assert_allclose(dx, dx_ref, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(dw, dw_ref, rtol=1e-5, atol=1e-4)


needs_native = pytest.mark.skipif(not bnn.native.dispatch.preferred(),
                                  reason="the native kernels are not used on this machine")


def _graph_op_types(graph_def) -> set[str]:
    """The op types of a ``GraphDef``, those of the functions it calls included."""
    types = {node.op for node in graph_def.node}
    for function in graph_def.library.function:
        types |= {node.op for node in function.node_def}
    return types


def _op_types(fn, *args) -> set[str]:
    """The op types of ``fn`` traced on ``args``, nested functions included."""
    return _graph_op_types(tf.function(fn).get_concrete_function(*args).graph.as_graph_def())


def _xla_op_types(fn, *args) -> set[str]:
    """The op types inside the functions that ``fn`` traced on ``args`` has XLA compile."""
    graph_def = tf.function(fn).get_concrete_function(*args).graph.as_graph_def()
    return {node.op for function in graph_def.library.function
            if function.attr["_XlaMustCompile"].b for node in function.node_def}


@needs_native
@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
@pytest.mark.parametrize("layer, gradients", [("conv", "patches"), ("conv", "tensorflow"),
                                              ("dense", "auto")])
def test_training_products_run_natively_with_the_same_results_and_gradients(monkeypatch, layer,
                                                                            gradients, dtype):
    """training=True outside XLA takes the native kernels' product (and, with "patches", the
    native patches for the kernel gradient): the same values and gradients as the XLA product
    and TensorFlow's gradients that inference (training=False) keeps."""
    monkeypatch.setenv("BNN_CONV_GRADIENTS", gradients)
    rng = np.random.default_rng(8)
    if layer == "conv":
        x, w = _pm1(rng, (3, 9, 8, 70)), rng.uniform(-1, 1, (3, 3, 70, 65)).astype("float32")
        fn = lambda a, b, training: xnor.binary_conv2d(  # noqa: E731
            a, b, (2, 1), "same", -1.0, training=training)
    else:
        x, w = _pm1(rng, (7, 130)), rng.uniform(-1, 1, (130, 66)).astype("float32")
        fn = lambda a, b, training: xnor.binary_matmul(a, b, training=training)  # noqa: E731
    x, w = tf.constant(x, dtype), tf.constant(w, dtype)
    dy = tf.constant(rng.integers(-3, 4, fn(x, w, False).shape), dtype)
    runs = [_grads(lambda a, b, t=training: fn(a, b, t), x, w, dy) for training in (True, False)]
    # on CPUs without AVX-512 the input gradient with patches is XLA's (exact sums rounded
    # once), not TensorFlow's: both against the float32 gradient of the same operands
    xla_dx = layer == "conv" and gradients == "patches" and dispatch.xla_convolutions_faster()
    exact = runs if not xla_dx else [(y, dw) for y, _, dw in runs]
    for native, reference in zip(*exact):
        np.testing.assert_array_equal(native.astype("float32"), reference.astype("float32"))
    if xla_dx:
        f32 = _grads(lambda a, b: fn(a, b, False), *(tf.cast(t, tf.float32) for t in (x, w)),
                     tf.cast(dy, tf.float32))[1]
        rounding = 2.0 ** -8 if dtype == tf.bfloat16 else 1e-6  # of the largest value
        np.testing.assert_allclose(runs[0][1].astype("float32"), f32, rtol=0,
                                   atol=rounding * np.abs(f32).max())
    assert "BnnXorPopcountConv2d" in _op_types(lambda a, b: fn(a, b, True), x, w)
    assert "BnnXorPopcountConv2d" not in _op_types(lambda a, b: fn(a, b, False), x, w)

    def gradients_of(a, b):
        with tf.GradientTape() as tape:
            tape.watch([a, b])
            loss = tf.reduce_sum(fn(a, b, True) * dy)
        return tape.gradient(loss, [a, b])

    types = _op_types(gradients_of, x, w)
    assert ("BnnSignPatches" in types) is (gradients == "patches")
    assert ("BnnPackSigns" in types) is (layer == "dense")  # the operands' signs, natively
    # products of sign bits: a convolution's kernel gradient from its patches; both float32
    # dense gradients (bfloat16 ones stay TensorFlow's)
    assert ("BnnSignMatmul" in types) is (gradients == "patches" or (
        layer == "dense" and dtype == tf.float32))
    assert "BnnXorPopcountConv2d" not in _op_types(
        tf.function(lambda a, b: fn(a, b, True), jit_compile=True), x, w)


@needs_native
@pytest.mark.parametrize("kept_in_range", [True, False])
def test_first_binary_dense_layer_trains_on_sign_bit_products(kept_in_range):
    """A first layer (real-valued inputs, ±1 kernel) in a float32 training step takes its
    product and input gradient from the native sign-bit products: equal to the float product of
    the kernel's signs up to rounding, with the straight-through kernel gradient; inference keeps
    the float product."""
    rng = np.random.default_rng(4)
    clip = {} if kept_in_range else {"kernel_constraint": None}  # default: WeightClip(1)
    layer = bnn.layers.BinaryDense(70, input_quantizer=None, **clip)
    layer.build((None, 130))
    layer.kernel.assign(rng.uniform(-1 if kept_in_range else -1.5, 1.5, (130, 70)).clip(
        -1 if kept_in_range else -2, 1 if kept_in_range else 2))
    x = tf.constant(rng.normal(0, 1, (9, 130)), tf.float32)
    dy = tf.constant(rng.normal(0, 1, (9, 70)), tf.float32)

    def run(training):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(layer(x, training=training) * dy)
        return [loss, *tape.gradient(loss, [x, layer.kernel])]

    native, reference = (tf.function(run, autograph=False)(training) for training in (True, False))
    for got, expected in zip(native, reference):
        np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-5, atol=1e-4)
    signs = np.where(layer.kernel.numpy() >= 0, 1.0, -1.0)
    np.testing.assert_allclose(native[1].numpy(), dy.numpy() @ signs.T, rtol=1e-5, atol=1e-4)
    mask = np.abs(layer.kernel.numpy()) <= 1
    np.testing.assert_allclose(native[2].numpy(), (x.numpy().T @ dy.numpy()) * mask, rtol=1e-5,
                               atol=1e-4)
    assert {"BnnSignMatmul", "BnnPackSigns"} <= _op_types(lambda: run(True))
    assert "BnnSignMatmul" not in _op_types(lambda: run(False))


def test_sign_kernel_matmul_takes_float32_only():
    with pytest.raises(ValueError, match="takes float32 inputs, got bfloat16"):
        xnor.sign_kernel_matmul(tf.zeros([2, 3], tf.bfloat16), tf.zeros([3, 4]), None)


@needs_native
@pytest.mark.parametrize("flags", [{"avx2", "avx512f"}, {"avx2"}])
def test_default_conv_gradients_are_patch_bits_times_dy_by_lookup(monkeypatch, flags):
    """Float32 layers, and bfloat16 ones of at least PATCHES_MIN_ROWS kernel rows: the kernel
    gradient from the patches' sign bits and the lookup product; the input gradient
    TensorFlow's, or XLA's on CPUs without AVX-512. Smaller bfloat16 layers keep the
    convolution's kernel gradient."""
    monkeypatch.delenv("BNN_CONV_GRADIENTS", raising=False)
    monkeypatch.setattr(dispatch, "cpu_flags", lambda: frozenset(flags))
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: [])

    def gradients_of(x, w):
        with tf.GradientTape() as tape:
            tape.watch([x, w])
            y = xnor.binary_conv2d(x, w, (1, 1), "same", training=True)
        return tape.gradient(y, [x, w])

    for channels in (114, 113):  # 1026 and 1017 kernel rows
        for dtype in (tf.bfloat16, tf.float32):
            x, w = tf.ones((2, 9, 9, channels), dtype), tf.ones((3, 3, channels, 4), dtype)
            types = _op_types(gradients_of, x, w)
            lookup = dtype == tf.float32 or channels == 114
            assert ({"BnnSignPatches", "BnnSignMatmul"} <= types) is lookup
            assert ("Conv2DBackpropFilter" in types) is not lookup
            if lookup:
                compiled = _xla_op_types(gradients_of, x, w)
                assert ("Conv2DBackpropInput" in compiled) is ("avx512f" not in flags)


def test_training_products_stay_on_xla_without_native_kernels(monkeypatch):
    monkeypatch.setenv("BNN_NATIVE_KERNELS", "0")
    assert dispatch.training_ops(tf.float32, False) is None
    x, w = tf.constant(_pm1(np.random.default_rng(0), (2, 64))), tf.ones((64, 3))
    assert "BnnXorPopcountConv2d" not in _op_types(
        lambda a, b: xnor.binary_matmul(a, b, training=True), x, w)


@needs_native
def test_exported_binary_model_needs_no_custom_op(tmp_path):
    model = bnn.models.build("vgg_small", "binary", filters=(8, 8, 16, 16, 16, 16),
                             dense_units=(16, 16))
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.default_rng(1).random((2, 32, 32, 3)).astype("float32")
    model.train_on_batch(x, np.array([1, 2]))
    model.export(str(tmp_path / "saved"), verbose=False)
    graph = tf.saved_model.load(str(tmp_path / "saved"))
    types = set().union(*(_graph_op_types(f.graph.as_graph_def())
                          for f in graph.serve.concrete_functions))
    assert "PopulationCount" in types  # the XLA product, read from the nested functions
    assert "BnnXorPopcountConv2d" not in types
    np.testing.assert_allclose(graph.serve(x).numpy(), model(x, training=False).numpy(),
                               rtol=1e-5, atol=1e-4)


def test_binary_conv2d_rejects_a_padding_value_that_is_not_plus_minus_one():
    x = tf.ones((1, 4, 4, 3))
    with pytest.raises(ValueError, match="pads with \\+1 or -1 only"):
        xnor.binary_conv2d(x, tf.ones((3, 3, 3, 2)), (1, 1), "same", 0.0)
    with pytest.raises(ValueError, match="'valid' or 'same'"):
        xnor.binary_conv2d(x, tf.ones((3, 3, 3, 2)), (1, 1), "full")


@pytest.mark.parametrize("gpu, flags, native, expected", [
    (False, {"avx2"}, False, "xla"), (False, {"avx2", "avx512f"}, False, "tensorflow"),
    (False, {"avx2"}, True, "patches"), (False, {"avx2", "avx512f"}, True, "patches"),
    (True, {"avx2"}, True, "tensorflow"), (True, {"avx512f"}, False, "tensorflow")])
def test_conv_gradients_default_follows_the_cpu_gpu_and_native_kernels(monkeypatch, gpu, flags,
                                                                       native, expected):
    monkeypatch.delenv("BNN_CONV_GRADIENTS", raising=False)
    monkeypatch.setattr(dispatch, "cpu_flags", lambda: frozenset(flags))
    monkeypatch.setattr(dispatch, "preferred", lambda: native)
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: ["GPU:0"] if gpu and kind == "GPU" else [])
    assert dispatch.conv_gradient_kernels() == expected
    assert (dispatch.conv_gradient_kernels() == "xla") is (expected == "xla")
    # bfloat16 gradients of small kernels keep the convolution's
    rows = dispatch.PATCHES_MIN_ROWS
    assert dispatch.conv_gradient_kernels(tf.float32, rows - 1) == expected
    assert dispatch.conv_gradient_kernels(tf.bfloat16, rows) == expected
    assert dispatch.conv_gradient_kernels(tf.bfloat16, rows - 1) == (
        ("xla" if "avx512f" not in flags else "tensorflow") if expected == "patches"
        else expected)


def test_packed_forward_setting_rejects_unknown_values(monkeypatch):
    monkeypatch.setenv("BNN_PACKED_FORWARD", "flase")
    with pytest.raises(SettingError, match="BNN_PACKED_FORWARD must be 0, 1 or auto, got 'flase'"):
        dispatch.packed_forward()


def test_conv_gradients_setting_rejects_unknown_values(monkeypatch):
    monkeypatch.setenv("BNN_CONV_GRADIENTS", "fast")
    with pytest.raises(SettingError, match="BNN_CONV_GRADIENTS must be 'auto', 'xla', "
                                         "'patches' or 'tensorflow', got 'fast'"):
        (dispatch.conv_gradient_kernels() == "xla")


@pytest.mark.parametrize("setting,expected", [("0", False), ("off", False), ("1", True)])
def test_packed_training_setting(monkeypatch, setting, expected):
    monkeypatch.setenv("BNN_PACKED_FORWARD", setting)
    assert dispatch.packed_forward() is expected


def test_auto_setting_follows_gpu_visibility(monkeypatch):
    monkeypatch.delenv("BNN_PACKED_FORWARD", raising=False)
    assert dispatch.packed_forward() is (not tf.config.list_physical_devices("GPU"))


@pytest.mark.parametrize("flags,dtype,expected", [
    ({"avx512f"}, "float32", True), ({"avx512f", "amx_bf16"}, "float32", True),
    ({"avx512f", "avx512_bf16"}, "bfloat16", True), ({"avx512f", "amx_bf16"}, "bfloat16", False),
    ({"avx2"}, "float16", False)])
def test_auto_setting_packs_bfloat16_layers_on_cpus_without_amx(monkeypatch, flags, dtype,
                                                                 expected):
    monkeypatch.delenv("BNN_PACKED_FORWARD", raising=False)
    monkeypatch.setattr(dispatch, "cpu_flags", lambda: frozenset(flags))
    gpu = bool(tf.config.list_physical_devices("GPU"))
    assert dispatch.packed_forward(dtype) is (expected and not gpu)


def _train_twice(monkeypatch, build, x, y, jit):
    """One Adam step of the same model built with the packed forward on and off: outputs,
    loss and updated weights."""
    results = []
    for setting in ("1", "0"):
        monkeypatch.setenv("BNN_PACKED_FORWARD", setting)
        keras.utils.set_random_seed(3)
        model = build()
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      jit_compile=jit)
        out = model(x, training=False).numpy()
        loss = model.train_on_batch(x, y)
        results.append((out, loss, [v.numpy() for v in model.trainable_variables]))
    return results


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("name,shape", [("binarynet_mlp", (28, 28, 1)), ("vgg_small", (32, 32, 3))])
def test_models_train_the_same_with_and_without_the_packed_forward(monkeypatch, name, shape, jit):
    rng = np.random.default_rng(5)
    x = rng.random((4, *shape)).astype("float32")
    y = rng.integers(0, 10, 4)
    options = ({"hidden_units": (96, 80)} if name == "binarynet_mlp"
               else {"filters": (8, 16, 16, 16, 24, 24), "dense_units": (32, 32)})
    (out1, loss1, w1), (out0, loss0, w0) = _train_twice(
        monkeypatch, lambda: bnn.models.build(name, "binary", **options), x, y, jit)
    np.testing.assert_array_equal(out1, out0)
    np.testing.assert_allclose(loss1, loss0, rtol=1e-5)
    for a, b in zip(w1, w0):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_layers_use_the_packed_product_only_for_plus_minus_one_operands(monkeypatch):
    def product(**options):
        return bnn.BinaryDense(4, **options)._product(tf.zeros((2, 8)), training=False)

    monkeypatch.setenv("BNN_PACKED_FORWARD", "1")
    assert product() == "packed"
    assert product(input_quantizer=None) == "float"
    assert product(scale_kernel=True) == "float"
    assert product(kernel_quantizer="ste_tern") == "float"
    assert product(precision="float") == "float"
    monkeypatch.setenv("BNN_PACKED_FORWARD", "0")
    assert product() == "float"


def _readers_of_popcount_fusions(hlo: str) -> list[int]:
    """For each fusion of the entry computation that counts bits, how many entry instructions
    read its result."""
    computations = dict(re.findall(r"^(%\S+) [^\n]*\{\n(.*?)^\}", hlo, re.S | re.M))
    entry = hlo[hlo.index("\nENTRY"):]
    fusions = re.findall(r"^\s*(?:ROOT )?(%\S+) = [^\n]*calls=(%[\w.\-]+)", entry, re.M)
    names = [name for name, called in fusions if "popcnt(" in computations.get(called, "")]
    operands = re.findall(r"^\s*(?:ROOT )?%\S+ = [^\n]*?\((.*)$", entry, re.M)
    return [sum(len(re.findall(re.escape(n) + r"[,)\s]", ops)) for ops in operands)
            for n in names]


def test_binary_conv_output_is_summed_once_for_batch_norm_and_its_gradient():
    """Under XLA, each partial popcount sum of a binary convolution is read once, by the loop
    that adds them up, however many consumers the convolution's output has (batch-norm
    statistics, normalization, their gradients); without computed_once each would re-read them."""
    def loss_and_gradients(x, w):
        with tf.GradientTape() as tape:
            tape.watch([x, w])
            y = xnor.binary_conv2d(x, w, (1, 1), "same")
            mean, var = tf.nn.moments(y, [0, 1, 2])
            loss = tf.reduce_sum(tf.nn.relu((y - mean) * tf.math.rsqrt(var + 1e-4)) ** 2)
        return loss, tape.gradient(loss, [x, w])

    rng = np.random.default_rng(0)
    x = tf.constant(np.sign(rng.standard_normal((4, 6, 6, 130))).astype(np.float32))
    w = tf.constant(rng.standard_normal((3, 3, 130, 8)).astype(np.float32))
    hlo = tf.function(loss_and_gradients, jit_compile=True).experimental_get_compiler_ir(
        x, w)(stage="optimized_hlo")
    readers = _readers_of_popcount_fusions(hlo)
    assert len(readers) >= 9, readers  # one or more per tap of the 3x3 kernel
    assert readers == [1] * len(readers), readers
