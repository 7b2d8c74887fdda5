"""Distillation from a real-valued teacher: the loss against its formula, FitModel (teacher,
test-time flips, device-side batches), the training.distill keys, the order of the twins, and
`bnn compare --ablate distill` end to end, resumed exactly."""

import json
import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf

from bnn.train import distill, losses, twins
from bnn.train.config import ConfigError, DistillConfig, parse_config, to_dict
from bnn.train.fitting import FitModel
from bnn.train.runtime import TrainingError
from support import needs_mnist, run_cli, tiny_config, write_config


def np_log_softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


@pytest.mark.parametrize("temperature", [1.0, 2.5])
def test_distillation_loss_is_t_squared_kl_of_teacher_to_student(temperature):
    rng = np.random.default_rng(0)
    s, t = rng.normal(size=(5, 10)) * 3, rng.normal(size=(5, 10)) * 3
    log_ps, log_pt = np_log_softmax(s / temperature), np_log_softmax(t / temperature)
    expected = temperature ** 2 * (np.exp(log_pt) * (log_pt - log_ps)).sum(axis=-1)
    student = tf.constant(s, tf.float32)
    with tf.GradientTape() as tape:
        tape.watch(student)
        loss = distill.distillation_loss(student, tf.constant(t, tf.float32), temperature)
        total = tf.reduce_sum(loss)
    np.testing.assert_allclose(loss.numpy(), expected, rtol=1e-5)
    # d/ds of T^2 KL(p_t || softmax(s / T)) is T (p_s - p_t)
    grad = tape.gradient(total, student).numpy()
    np.testing.assert_allclose(grad, temperature * (np.exp(log_ps) - np.exp(log_pt)),
                               rtol=1e-4, atol=1e-6)


def test_distillation_loss_is_zero_when_the_student_copies_the_teacher():
    logits = tf.constant([[1.0, -2.0, 0.5]])
    assert distill.distillation_loss(logits, logits, 3.0).numpy() == pytest.approx([0.0],
                                                                                   abs=1e-6)


def dense(units, seed, inputs=6):
    model = keras.Sequential([keras.Input((inputs,)), keras.layers.Dense(units)])
    rng = np.random.default_rng(seed)
    for w in model.weights:
        w.assign(rng.normal(size=w.shape).astype("float32"))
    return model


def compiled_fit_model(teacher, weight, temperature, **kwargs):
    fit = FitModel(dense(4, 1), teacher, temperature=temperature, weight=weight, **kwargs)
    fit.compile(optimizer=keras.optimizers.SGD(0.1), loss=losses.get("crossentropy", 4))
    return fit


def test_training_loss_blends_the_hard_loss_and_the_distillation_loss():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(8, 6)).astype("float32"), rng.integers(0, 4, 8)
    teacher = dense(4, 2)
    fit = compiled_fit_model(teacher, weight=0.3, temperature=2.0)
    s, t = fit.student(x).numpy(), teacher(x).numpy()
    hard = -np_log_softmax(s)[np.arange(8), y].mean()
    soft = distill.distillation_loss(s, t, 2.0).numpy().mean()
    loss = fit.compute_loss(x, y, tf.constant(s), training=True).numpy()
    assert loss == pytest.approx(0.7 * hard + 0.3 * soft, rel=1e-5)
    assert fit.compute_loss(x, y, tf.constant(s), training=False).numpy() == pytest.approx(
        hard, rel=1e-5)  # validation and test losses are the hard loss


def test_fit_trains_the_student_only_and_keeps_the_teacher_out_of_the_model():
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(16, 6)).astype("float32"), rng.integers(0, 4, 16)
    teacher = dense(4, 4)
    teacher.trainable = False
    teacher_before = [w.numpy().copy() for w in teacher.weights]
    fit = compiled_fit_model(teacher, weight=1.0, temperature=1.0)
    student_before = [w.numpy().copy() for w in fit.student.weights]
    fit.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert [id(w) for w in fit.trainable_weights] == [id(w) for w in fit.student.trainable_weights]
    assert not {id(w) for w in teacher.weights} & {id(w) for w in fit.weights}
    for before, w in zip(teacher_before, teacher.weights):
        np.testing.assert_array_equal(before, w.numpy())
    assert any(not np.array_equal(b, w.numpy()) for b, w in zip(student_before,
                                                                fit.student.weights))


def test_test_time_flip_averages_the_logits_of_each_image_and_its_mirror():
    student = keras.Sequential([keras.Input((4, 5, 2)), keras.layers.Flatten(),
                                keras.layers.Dense(3)])
    fit = FitModel(student, test_time_flip=True)
    x = np.random.default_rng(5).normal(size=(2, 4, 5, 2)).astype("float32")
    expected = (student(x).numpy() + student(x[:, :, ::-1]).numpy()) / 2
    np.testing.assert_allclose(fit(x, training=False).numpy(), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fit(x, training=True).numpy(), student(x).numpy(), rtol=1e-6)


def _reflect_shift(x, d):
    """numpy: (N, H, W, C) images moved d pixels down-right, the border reflected."""
    t = abs(d)
    padded = np.pad(x, ((0, 0), (t, t), (t, t), (0, 0)), mode="reflect")
    return padded[:, t - d:t - d + x.shape[1], t - d:t - d + x.shape[2]]


@pytest.mark.parametrize("flip", [False, True])
def test_test_time_translate_averages_shifted_views(flip):
    student = keras.Sequential([keras.Input((5, 6, 2)), keras.layers.Flatten(),
                                keras.layers.Dense(3)])
    fit = FitModel(student, test_time_flip=flip, test_time_translate=2)
    x = np.random.default_rng(7).normal(size=(3, 5, 6, 2)).astype("float32")
    views = [x, x[:, :, ::-1]] if flip else [x]
    views += [_reflect_shift(v, d) for v in list(views) for d in (-2, 2)]
    assert len(views) == (6 if flip else 3)
    np.testing.assert_array_equal(_reflect_shift(x, 2)[:, 2:, 2:], x[:, :-2, :-2])
    np.testing.assert_array_equal(_reflect_shift(x, -2)[:, 1, 3], x[:, 3, 5])
    expected = np.mean([student(v).numpy() for v in views], axis=0)
    np.testing.assert_allclose(fit(x, training=False).numpy(), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fit(x, training=True).numpy(), student(x).numpy(), rtol=1e-6)


def test_train_step_makes_each_batch_with_prepare():
    images = np.random.default_rng(6).normal(size=(10, 6)).astype("float32")
    labels = np.arange(10) % 4
    seen = []

    def prepare(batch):
        seen.append(True)
        return tf.gather(images, batch["index"]), tf.gather(labels, batch["index"])

    fit = compiled_fit_model(None, weight=0.0, temperature=1.0, prepare=prepare)
    indices = tf.data.Dataset.from_tensor_slices({"index": tf.reshape(tf.range(10), (5, 2))})
    history = fit.fit(indices, epochs=1, verbose=0, shuffle=False)  # as the trainer calls it
    assert seen and np.isfinite(history.history["loss"][0])


def test_teacher_paths_and_their_errors(tmp_path):
    with pytest.raises(TrainingError, match="float_twin but .*float/model.keras does not exist"):
        distill.teacher_path("float_twin", tmp_path)
    with pytest.raises(TrainingError, match="does not exist; give a run directory"):
        distill.teacher_path(str(tmp_path / "elsewhere"), tmp_path)
    (tmp_path / "float").mkdir()
    dense(10, 7, inputs=12).save(tmp_path / "float" / "model.keras")
    assert distill.teacher_path("float_twin", tmp_path) == tmp_path / "float" / "model.keras"
    assert distill.teacher_path(str(tmp_path), tmp_path / "x") == tmp_path / "float" / "model.keras"
    teacher = distill.load_teacher(str(tmp_path / "float" / "model.keras"), tmp_path, (12,), 10)
    assert not teacher.trainable
    with pytest.raises(TrainingError, match=r"maps \(12,\) inputs to \(10,\) outputs"):
        distill.load_teacher("float_twin", tmp_path, (28, 28, 1), 10)
    (tmp_path / "bad.keras").write_bytes(b"not a model")
    with pytest.raises(TrainingError, match="cannot be read as a Keras model"):
        distill.load_teacher(str(tmp_path / "bad.keras"), tmp_path, (12,), 10)


def test_distill_keys_validate_round_trip_and_take_overrides():
    config = parse_config({"training": {"distill": {"temperature": 2, "weight": 0.5}},
                           "dataset": {"cutout": 8, "on_device": True}})
    assert config.training.distill == DistillConfig("float_twin", 2.0, 0.5)
    assert parse_config(to_dict(config)) == config
    assert parse_config({}).training.distill is None
    overridden = parse_config({}, overrides=["training.distill.teacher=runs/t",
                                             "training.test_time_flip=true"])
    assert overridden.training.distill == DistillConfig("runs/t", 1.0, 1.0)
    assert overridden.training.test_time_flip


@pytest.mark.parametrize("data, overrides, fragments", [
    ({"training": {"distill": {"weight": 1.5}}}, [], ["training.distill.weight", "[0, 1]"]),
    ({"training": {"distill": {"temperature": 0}}}, [], ["training.distill.temperature"]),
    ({"training": {"distill": {"teacher": ""}}}, [], ["training.distill.teacher", "float_twin"]),
    ({"training": {"distill": {"techer": "x"}}}, [], ["training.distill.techer",
                                                      "did you mean 'teacher'"]),
    ({"training": {"distill": "yes"}}, [], ["training.distill", "mapping"]),
    ({}, ["training.distill.alpha=1"], ["training.distill.alpha", "teacher, temperature"]),
    ({}, ["training.distill.weight.x=1"], ["training.distill.weight.x", "unknown key"]),
    ({"dataset": {"cutout": -1}}, [], ["dataset.cutout", ">= 0"]),
    ({"dataset": {"on_device": "yes"}}, [], ["dataset.on_device", "true or false"]),
    ({"training": {"test_time_flip": 1}}, [], ["training.test_time_flip"]),
    ({"training": {"test_time_translate": -1}}, [], ["training.test_time_translate", ">= 0"]),
])
def test_bad_distill_and_pipeline_keys_are_one_line_errors(data, overrides, fragments):
    with pytest.raises(ConfigError) as info:
        parse_config(data, "x.yaml", overrides)
    message = str(info.value)
    assert "\n" not in message and message.startswith("x.yaml: ")
    for fragment in fragments:
        assert fragment in message, message


def test_the_float_twin_trains_first_when_it_is_the_teacher_and_ablation_adds_a_plain_twin():
    plain = parse_config({})
    assert [p[0] for p in twins.plan_twins(plain, ["binary", "float"])] == ["binary", "float"]
    distilled = parse_config({"training": {"distill": {}}})
    plan = twins.plan_twins(distilled, ["binary", "float"], ("distill",))
    assert [(label, precision) for label, precision, _ in plan] == [
        ("float", "float"), ("binary", "binary"), (twins.NO_DISTILL, "binary")]
    assert plan[1][2].training.distill is not None and plan[2][2].training.distill is None
    other = parse_config({"training": {"distill": {"teacher": "runs/teacher"}}})
    assert [p[0] for p in twins.plan_twins(other, ["binary", "float"])] == ["binary", "float"]
    assert [p[0] for p in twins.plan_twins(distilled, ["binary"], ("distill",))] == [
        "binary", twins.NO_DISTILL]
    with pytest.raises(TrainingError, match="--ablate distill .* does not set"):
        twins.plan_twins(plain, ["binary", "float"], ("distill",))


DISTILLED = tiny_config(seed=4, epochs=2, **{
    "distill": {"teacher": "float_twin", "temperature": 2.0, "weight": 0.7},
    "test_time_flip": False})
DISTILLED["dataset"].update(on_device=True)


@needs_mnist
def test_compare_with_ablation_reports_three_twins_and_resumes_exactly(tmp_path):
    config = write_config(tmp_path / "d.yaml", DISTILLED)
    run = tmp_path / "run"
    assert run_cli("compare", config, "--ablate", "distill", "--output-dir", run) == 0
    report = json.loads((run / "report.json").read_text())
    assert set(report) >= {"binary", "float", twins.NO_DISTILL}
    assert "| figure | binary | binary_no_distill | float |" in (run / "report.md").read_text()
    student = keras.models.load_model(run / "binary" / "model.keras")
    assert student.name == "binarynet_mlp_binary"  # the student, not the wrapper
    # resuming the distilled twin from its first epoch ends where the uninterrupted run ended
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    for name in ("epoch-0002.keras", "state-0002.json"):
        (copy / "binary" / "checkpoints" / name).unlink()
    (copy / "report.json").unlink()
    assert run_cli("train", config, "--precision", "binary", "--output-dir", copy,
                   "--resume") == 0
    resumed = keras.models.load_model(copy / "binary" / "model.keras")
    for a, b in zip(student.weights, resumed.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert json.loads((copy / "report.json").read_text())["binary"]["test_accuracy"] == \
        report["binary"]["test_accuracy"]


@needs_mnist
def test_binary_twin_with_a_missing_float_teacher_is_a_one_line_error(tmp_path, capsys):
    config = write_config(tmp_path / "d.yaml", DISTILLED)
    assert run_cli("train", config, "--precision", "binary", "--output-dir", tmp_path / "r") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bnn: error: training.distill.teacher is float_twin") and "\n" not in err
