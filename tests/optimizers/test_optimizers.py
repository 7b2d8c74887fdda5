import contextlib
from unittest import mock

import keras
import numpy as np
import pytest
import tensorflow as tf

import bnn
from bnn import models
from bnn.optimizers import adam as adam_module
from bnn.optimizers import (Adam, Bop, CaseOptimizer, VariablePaths, is_binary_variable_of,
                            make_optimizer)


def np_bop(w, m, grads, gamma, threshold):
    """Reference Bop in numpy, one step per gradient in ``grads``."""
    w, m = w.astype("float64").copy(), m.astype("float64").copy()
    for g in grads:
        m = (1 - gamma) * m + gamma * g
        flip = (np.abs(m) > threshold) & ((m >= 0) == (w >= 0))
        w = np.where(flip, -w, w)
    return w, m


def tiny_mlp():
    return models.binarynet_mlp(input_shape=(8, 8), hidden_units=(32, 32), num_classes=4)


def learnable_data(n=512, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8, 8)).astype("float32")
    return x, x[:, 0, :4].argmax(axis=1).astype("int32")


def compile_with(model, optimizer):
    model.compile(optimizer=optimizer, jit_compile=True,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_bop_update_matches_hand_computed_example():
    w = keras.Variable(np.array([0.5, -0.5, 0.5, -0.3], "float32"))
    opt = Bop(threshold=0.1, gamma=0.5)
    opt.apply([tf.constant([1.0, 1.0, 0.1, -1.0])], [w])
    # m = 0.5 * g = [0.5, 0.5, 0.05, -0.5]; flips at 0 (m>0, w>0) and 3 (m<0, w<0) only.
    np.testing.assert_allclose(opt._momentums[0].numpy(), [0.5, 0.5, 0.05, -0.5])
    np.testing.assert_array_equal(w.numpy(), np.float32([-0.5, -0.5, 0.5, 0.3]))
    opt.apply([tf.zeros(4)], [w])
    # m halves to [0.25, 0.25, 0.025, -0.25]; its signs now oppose w's, so nothing flips.
    np.testing.assert_allclose(opt._momentums[0].numpy(), [0.25, 0.25, 0.025, -0.25])
    np.testing.assert_array_equal(w.numpy(), np.float32([-0.5, -0.5, 0.5, 0.3]))


def test_bop_flips_only_where_momentum_exceeds_threshold_and_agrees_in_sign_under_xla():
    rng = np.random.default_rng(3)
    w0 = rng.choice([-1.0, 1.0], size=(6, 5)).astype("float32")
    grads = rng.normal(size=(4, 6, 5)).astype("float32")
    w = keras.Variable(w0)
    opt = Bop(threshold=0.3, gamma=0.4)
    opt.build([w])
    step = tf.function(lambda g: opt.apply([g], [w]), jit_compile=True)
    for g in grads:
        step(tf.constant(g))
    want_w, want_m = np_bop(w0, np.zeros_like(w0), grads, gamma=0.4, threshold=0.3)
    np.testing.assert_allclose(opt._momentums[0].numpy(), want_m, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(w.numpy(), want_w)
    assert 0 < (w.numpy() != w0).sum() < w0.size  # the example exercises both outcomes


def test_bop_gamma_and_threshold_set_between_steps_reach_a_step_compiled_once():
    rng = np.random.default_rng(4)
    w0 = rng.choice([-1.0, 1.0], size=(6, 5)).astype("float32")
    grads = rng.normal(size=(3, 6, 5)).astype("float32")
    w = keras.Variable(w0)
    opt = Bop(threshold=1e-8, gamma=1e-4)
    opt.build([w])
    step = tf.function(lambda g: opt.apply([g], [w]), jit_compile=True)
    want_w, want_m = w0, np.zeros_like(w0)
    for g, (gamma, threshold) in zip(grads, [(0.5, 0.1), (0.9, 0.6), (0.2, 0.0)]):
        opt.gamma, opt.threshold = gamma, threshold
        step(tf.constant(g))
        want_w, want_m = np_bop(want_w, want_m, [g], gamma=gamma, threshold=threshold)
        np.testing.assert_allclose(opt._momentums[0].numpy(), want_m, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(w.numpy(), want_w)
    assert step.experimental_get_tracing_count() == 1
    config = opt.get_config()
    assert config["threshold"] == 0.0 and config["gamma"] == pytest.approx(0.2)
    # the threshold is in the config, not a variable: saved optimizer state keeps its layout
    assert [id(v) for v in opt.variables] == [id(opt.iterations), id(opt.gamma),
                                              id(opt._momentums[0])]


def test_bop_rejects_bad_arguments_with_clear_message():
    with pytest.raises(ValueError, match="threshold must be >= 0"):
        Bop(threshold=-1.0)
    with pytest.raises(ValueError, match=r"gamma must be in \(0, 1\]"):
        Bop(gamma=2.0)
    opt = Bop()
    with pytest.raises(ValueError, match="threshold must be >= 0"):
        opt.threshold = -1.0
    with pytest.raises(ValueError, match=r"gamma must be in \(0, 1\]"):
        opt.gamma = 0.0


def test_routing_sends_binary_kernels_to_bop_and_everything_else_to_adam():
    model = tiny_mlp()
    kernels = {"dense0/kernel", "dense1/kernel", "dense_out/kernel"}
    assert set(is_binary_variable_of(model).paths) == kernels
    optimizer = CaseOptimizer((is_binary_variable_of(model), Bop(threshold=0.0, gamma=1.0)),
                              default=keras.optimizers.Adam(0.1))
    compile_with(model, optimizer)
    before = {v.path.split("/", 1)[1]: v.numpy() for v in model.trainable_variables}
    x, y = learnable_data(64)
    model.train_on_batch(x, y)
    bop, adam = optimizer.optimizers
    assert sorted(tuple(m.shape) for m in bop._momentums) == sorted(
        before[k].shape for k in kernels)
    for v in model.trainable_variables:
        key, new = v.path.split("/", 1)[1], v.numpy()
        if key in kernels:  # Bop: only sign flips, and with threshold 0 and gamma 1, some flip
            np.testing.assert_array_equal(np.abs(new), np.abs(before[key]))
            assert (np.sign(new) != np.sign(before[key])).any(), key
        else:  # Adam: a real-valued step of about the learning rate
            changed = np.abs(new - before[key])
            assert changed.max() > 0.05 and not np.allclose(np.abs(new), np.abs(before[key]))
    assert int(bop.iterations) == int(adam.iterations) == int(optimizer.iterations) == 1


def test_case_optimizer_learning_rate_is_the_default_optimizers():
    optimizer = CaseOptimizer((VariablePaths([]), Bop()), default=keras.optimizers.Adam(0.01))
    optimizer.learning_rate = 0.5
    assert float(optimizer.optimizers[-1].learning_rate) == pytest.approx(0.5)
    assert float(optimizer.learning_rate) == pytest.approx(0.5)


def test_case_optimizer_rejects_malformed_cases():
    with pytest.raises(ValueError, match="expected a \\(predicate"):
        CaseOptimizer(("not a predicate", Bop()))
    with pytest.raises(ValueError, match="cannot be saved"):
        CaseOptimizer((lambda v: True, Bop())).get_config()


@pytest.fixture(scope="module")
def trained():
    """A tiny BinaryNet MLP trained for 4 epochs by routed Bop + Adam under XLA."""
    keras.utils.set_random_seed(0)
    model = tiny_mlp()
    compile_with(model, make_optimizer("bop", model, 1e-2, threshold=1e-6, gamma=1e-2))
    x, y = learnable_data()
    history = model.fit(x, y, epochs=4, batch_size=64, verbose=0)
    return model, history.history["loss"], (x, y)


def test_binarynet_mlp_trains_with_routed_bop_under_jit_compile(trained):
    model, losses, _ = trained
    assert losses[-1] < 0.85 * losses[0], losses
    bop = model.optimizer.optimizers[0]
    assert int(bop.iterations) == 4 * 8
    assert all(np.abs(m.numpy()).max() > 0 for m in bop._momentums)


def test_saved_model_keeps_routing_and_optimizer_state(trained, tmp_path):
    model, _, (x, y) = trained
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded.optimizer, CaseOptimizer)
    for original, restored in zip(model.optimizer.optimizers, loaded.optimizer.optimizers):
        assert type(original) is type(restored)
        assert len(original.variables) == len(restored.variables) > 2
        for a, b in zip(original.variables, restored.variables):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    # The same next step from the same state gives the same weights.
    model.train_on_batch(x[:64], y[:64])
    loaded.train_on_batch(x[:64], y[:64])
    for a, b in zip(model.trainable_variables, loaded.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


def test_tf_train_checkpoint_restores_bop_momentum(trained, tmp_path):
    model, _, _ = trained
    prefix = tf.train.Checkpoint(model=model, optimizer=model.optimizer).save(tmp_path / "ckpt")
    fresh = tiny_mlp()
    optimizer = make_optimizer("bop", fresh, 1e-2, threshold=1e-6, gamma=1e-2)
    optimizer.build(fresh.trainable_variables)
    tf.train.Checkpoint(model=fresh, optimizer=optimizer).restore(prefix).assert_consumed()
    for a, b in zip(model.optimizer.optimizers[0]._momentums, optimizer.optimizers[0]._momentums):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert int(optimizer.optimizers[1].iterations) == int(model.optimizer.optimizers[1].iterations)


def test_case_optimizer_variables_are_its_own_then_each_optimizers(trained):
    optimizer = trained[0].optimizer
    variables = optimizer.variables
    assert variables[0] is optimizer.iterations
    inner = [v for sub in optimizer.optimizers for v in sub.variables]
    assert len(inner) > 2 * len(optimizer.optimizers)  # the step counts, rates and moments
    assert all(a is b for a, b in zip(variables[-len(inner):], inner, strict=True))
    assert len(variables) == len(inner) + 2  # its own step count and learning rate


def test_case_optimizer_saves_a_registered_function_as_its_predicate():
    @keras.saving.register_keras_serializable("bnn_tests", "is_kernel")
    def is_kernel(variable):
        return variable.path.endswith("kernel")

    config = keras.optimizers.serialize(CaseOptimizer((is_kernel, Bop())))
    restored = keras.optimizers.deserialize(config)
    assert restored.predicates == [is_kernel]
    assert keras.optimizers.serialize(restored) == config


def test_is_binary_variable_of_needs_a_built_model():
    model = keras.Sequential([bnn.BinaryDense(3, name="d")])
    with pytest.raises(ValueError, match="not built"):
        is_binary_variable_of(model)


def test_make_optimizer_builds_each_kind():
    model = tiny_mlp()
    adam = make_optimizer("adam", model, 1e-3)
    assert isinstance(adam, Adam)
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.5)
    sgd = make_optimizer("sgd", model, schedule, momentum=0.8, nesterov=True)
    assert isinstance(sgd, keras.optimizers.SGD) and sgd.nesterov and sgd.momentum == 0.8
    assert float(sgd.learning_rate) == pytest.approx(0.1)
    routed = make_optimizer("bop", model, 2e-3, threshold=1e-6, gamma=1e-3)
    bop, adam = routed.optimizers
    assert isinstance(bop, Bop) and isinstance(adam, Adam)
    assert bop.threshold == 1e-6 and float(bop.learning_rate) == pytest.approx(1e-3)
    assert float(routed.learning_rate) == pytest.approx(2e-3)


def test_make_optimizer_on_a_float_twin_routes_everything_to_adam():
    model = models.binarynet_mlp("float", input_shape=(8, 8), hidden_units=(32, 32))
    routed = make_optimizer("bop", model, 1e-3)
    routed.build(model.trainable_variables)
    assert routed.optimizers[0]._momentums == []


@pytest.mark.parametrize("call, message", [
    (lambda m: make_optimizer("rmsprop", m, 1e-3), "unknown optimizer 'rmsprop'"),
    (lambda m: make_optimizer("sgd", m, 1e-3, beta=1), "unknown option.*beta"),
    (lambda m: make_optimizer("adam", m, "fast"), "learning_rate must be a float"),
    (lambda m: make_optimizer("adam", m, -1.0), "learning_rate must be > 0"),
])
def test_make_optimizer_errors_name_the_problem(call, message):
    with pytest.raises(ValueError, match=message):
        call(tiny_mlp())


def test_routed_bop_trains_under_mirrored_strategy():
    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    if len(devices) < 2:
        pytest.skip("needs 2 logical CPU devices, configured in conftest before TF starts")
    keras.utils.set_random_seed(0)
    with tf.distribute.MirroredStrategy(
            devices[:2], cross_device_ops=tf.distribute.ReductionToOneDevice()).scope():
        model = tiny_mlp()
        model.compile(optimizer=make_optimizer("bop", model, 1e-2, threshold=1e-6, gamma=1e-2),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    before = model.get_layer("dense1").kernel.numpy()
    x, y = learnable_data(256)
    losses = model.fit(x, y, epochs=3, batch_size=64, verbose=0).history["loss"]
    after = model.get_layer("dense1").kernel.numpy()
    assert losses[-1] < losses[0]
    np.testing.assert_array_equal(np.abs(after), np.abs(before))  # Bop: sign flips only
    assert (np.sign(after) != np.sign(before)).any()


def _adam_twins(jit, steps, **options):
    """A float model trained ``steps`` steps by Keras' Adam and by bnn's, from the same start."""
    x, y = learnable_data(64)
    trained = []
    for optimizer in (keras.optimizers.Adam(0.01, **options), Adam(0.01, **options)):
        keras.utils.set_random_seed(5)
        model = models.binarynet_mlp("float", input_shape=(8, 8), hidden_units=(32, 32),
                                     num_classes=4)
        model.compile(optimizer=optimizer, jit_compile=jit,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        for _ in range(steps):
            model.train_on_batch(x, y)
        trained.append(model)
    return trained


@pytest.mark.parametrize("jit", [False, True])
def test_fused_adam_takes_keras_adams_steps(jit):
    keras_model, bnn_model = _adam_twins(jit, steps=4, weight_decay=0.01)
    moved = 0.0
    for ours, theirs in zip(bnn_model.weights, keras_model.weights):
        # Rounding differs; 1e-5 is a thousandth of one step of the learning rate.
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=0, atol=1e-5,
                                   err_msg=ours.path)
    for ours, theirs in zip(bnn_model.optimizer.variables, keras_model.optimizer.variables):
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-4, atol=1e-7)
        moved = max(moved, float(np.abs(ours.numpy()).max()))
    assert moved > 0  # the moments were updated, not left at zero


def test_fused_adam_with_amsgrad_is_keras_adam_exactly():
    keras_model, bnn_model = _adam_twins(False, steps=3, amsgrad=True)
    for ours, theirs in zip(bnn_model.weights, keras_model.weights):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def test_fused_adam_updates_with_the_fused_kernel_and_round_trips(tmp_path):
    model = compile_with(tiny_mlp(), Adam(1e-3, beta_1=0.8))
    x, y = learnable_data(64)
    graph = tf.function(lambda: model.optimizer.apply(
        [tf.ones_like(v) for v in model.trainable_variables], model.trainable_variables))
    ops_used = {op.type for op in graph.get_concrete_function().graph.get_operations()}
    assert "ResourceApplyAdam" in ops_used
    model.fit(x, y, epochs=1, batch_size=32, verbose=0)
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    assert type(loaded.optimizer) is Adam and loaded.optimizer.beta_1 == pytest.approx(0.8)
    assert int(loaded.optimizer.iterations) == int(model.optimizer.iterations) == 2


needs_native = pytest.mark.skipif(not bnn.native.dispatch.preferred(),
                                  reason="the native kernels do not run here")


def _clipped_twins(policy):
    """A binary MLP trained 3 steps by bnn's Adam with its weight clips inside the native update,
    and the same with Keras' separate clip, from the same start, kernels near the clip value."""
    x, y = learnable_data(64)
    trained = []
    for in_update in (True, False):
        keras.utils.set_random_seed(3)
        previous = keras.mixed_precision.global_policy()
        keras.mixed_precision.set_global_policy(policy)
        try:
            model = tiny_mlp()
        finally:
            keras.mixed_precision.set_global_policy(previous)
        model.compile(optimizer=Adam(0.05), jit_compile=False,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.build((None, 8, 8))
        for variable in model.trainable_variables:
            if "kernel" in variable.path:
                variable.assign(np.sign(variable.numpy()) * 0.97)
        separate = mock.patch.object(adam_module, "_clip_in_update", lambda *args: False)
        with contextlib.nullcontext() if in_update else separate:
            for _ in range(3):
                model.train_on_batch(x, y)
        trained.append(model)
    return trained


@needs_native
@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_adam_clips_in_its_update_as_keras_clips_after_it(policy):
    ours, theirs = _clipped_twins(policy)
    clipped = 0
    for a, b in zip(ours.weights, theirs.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)
        clipped += int(np.sum(np.abs(a.numpy()) == 1.0)) if "kernel" in a.path else 0
    assert clipped > 0  # some weights reached the clip
    for variable in ours.trainable_variables:  # the constraints are back after the steps
        assert ("kernel" in variable.path) == isinstance(variable.constraint,
                                                         bnn.constraints.WeightClip)


@needs_native
def test_adam_runs_clipped_updates_natively_outside_xla_only():
    model = tiny_mlp()
    model.compile(optimizer=Adam(1e-3), loss="mse")
    model.build((None, 8, 8))
    variables = model.trainable_variables

    def ops_of(jit):
        fn = tf.function(lambda: model.optimizer.apply([tf.ones_like(v) for v in variables],
                                                       variables), jit_compile=jit)
        return [op.type for op in fn.get_concrete_function().graph.get_operations()]

    kernels_clipped = sum(isinstance(v.constraint, bnn.constraints.WeightClip) for v in variables)
    plain = ops_of(False)
    assert plain.count("BnnAdamUpdate") == kernels_clipped == 3
    assert plain.count("ResourceApplyAdam") == len(variables) - kernels_clipped
    assert "ClipByValue" not in plain
    compiled = ops_of(True)
    assert "BnnAdamUpdate" not in compiled and compiled.count("ClipByValue") == kernels_clipped


@needs_native
def test_adam_reads_a_widened_bfloat16_gradient_itself():
    """A float32 gradient that is the cast of a bfloat16 one (through identities, as Keras hands
    them over) reaches the native update as the bfloat16 tensor; other gradients as they are."""
    model = tiny_mlp()
    model.compile(optimizer=Adam(1e-3), loss="mse")
    model.build((None, 8, 8))
    variables = model.trainable_variables

    def widened(v):
        return tf.identity_n([tf.cast(tf.ones(v.shape, tf.bfloat16), tf.float32)])[0]

    def grad_types(make):
        fn = tf.function(lambda: model.optimizer.apply([make(v) for v in variables], variables))
        graph = fn.get_concrete_function().graph
        return [op.get_attr("T").name for op in graph.get_operations()
                if op.type == "BnnAdamUpdate"]

    assert grad_types(widened) == ["bfloat16"] * 3
    assert grad_types(lambda v: tf.ones(v.shape) * 2.0) == ["float32"] * 3
    eager = tf.constant([1.5])
    assert bnn.optimizers.adam._widened_from(eager) is eager


@needs_native
def test_keras_own_adam_updates_binary_latent_kernels_in_one_native_pass():
    """``"adam"`` in compile is Keras' Adam: outside XLA the latent kernels of bnn's layers take
    the native update with their clip, every other variable Keras' own update."""
    model = tiny_mlp()
    model.compile(optimizer="adam", loss="mse")
    model.build((None, 8, 8))
    assert type(model.optimizer) is keras.optimizers.Adam
    variables = model.trainable_variables

    def ops_of(jit):
        fn = tf.function(lambda: model.optimizer.apply([tf.ones_like(v) for v in variables],
                                                       variables), jit_compile=jit)
        return [op.type for op in fn.get_concrete_function().graph.get_operations()]

    plain = ops_of(False)
    assert plain.count("BnnAdamUpdate") == 3 and "ResourceApplyAdam" not in plain
    assert "ClipByValue" not in plain and "Sqrt" in plain  # the others: Keras' update
    assert "BnnAdamUpdate" not in ops_of(True)
    dense = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])  # no WeightClip
    dense.compile(optimizer="adam", loss="mse")
    dense.build((None, 4))
    fn = tf.function(lambda: dense.optimizer.apply(
        [tf.ones_like(v) for v in dense.trainable_variables], dense.trainable_variables))
    assert "BnnAdamUpdate" not in {op.type for op in fn.get_concrete_function().graph
                                   .get_operations()}


@needs_native
def test_keras_own_adam_trains_binary_kernels_as_keras_update_then_clip():
    x, y = learnable_data(64)
    trained = []
    for one_pass in (True, False):
        keras.utils.set_random_seed(5)
        model = tiny_mlp()
        model.compile(optimizer=keras.optimizers.Adam(0.05), jit_compile=False,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        keras_only = mock.patch.object(adam_module, "_clip_in_update", lambda *args: False)
        with contextlib.nullcontext() if one_pass else keras_only:
            for _ in range(3):
                model.train_on_batch(x, y)
        trained.append(model)
    for a, b in zip(*(model.weights for model in trained)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6, err_msg=a.path)
        if "kernel" in a.path:
            assert np.abs(a.numpy()).max() <= 1.0
