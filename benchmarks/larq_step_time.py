"""Larq's train step for the same models as bnn's benchmark, served block by block.

Larq needs tf-keras (``TF_USE_LEGACY_KERAS=1``), so this script runs in its own Python
environment and never imports bnn. ``benchmarks/step_time.py --larq-python PATH`` starts it as a
subprocess and talks to it one JSON object per line, so that Larq's timed blocks take turns with
bnn's binary and float blocks in the same minutes of machine time:

* ``{"op": "setup", "model", "xla", "batch_size", "options", "warmup_steps", "seed",
  "mixed_precision"}`` builds Larq's binary and float models under that Keras policy (``"off"``:
  float32, ``"bfloat16"``/``"float16"``: ``mixed_bfloat16``/``mixed_float16``; absent: off),
  compiles them (Adam, sparse cross-entropy on logits, ``jit_compile=xla``), runs the warm-up
  steps untimed and answers ``{"ok": true}``;
* ``{"op": "block", "precision": "binary" | "float", "steps": n}`` trains that model ``n`` steps
  on one fixed synthetic batch, each step synchronised by fetching its loss, and answers
  ``{"wall": s, "cpu": s}``, seconds per step (wall clock and process CPU time);
* ``{"op": "teardown"}`` frees the models; end of input ends the process.

A failure answers ``{"error": "one line"}``. Run by hand::

    TF_USE_LEGACY_KERAS=1 larq-env/bin/python benchmarks/larq_step_time.py
    {"op": "setup", "model": "binarynet_mlp", "xla": true, "batch_size": 100, "options": {}, \
"warmup_steps": 3, "seed": 0}
    {"op": "block", "precision": "binary", "steps": 10}

The models match bnn's layer for layer: ``QuantDense``/``QuantConv2D`` with ``ste_sign`` inputs
(none on the first layer) and kernels, ``weight_clip``, no bias, convolutions padded with +1,
batch normalization (momentum 0.9, epsilon 1e-4, no scale on the logits); the float twins use
``Dense``/``Conv2D`` with a ReLU after each batch normalization but the last.
"""

import argparse
import importlib.metadata
import json
import os
import sys
import time

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import larq as lq  # noqa: E402

keras = tf.keras

POLICIES = {"off": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}
MLP_DEFAULTS = dict(input_shape=(28, 28, 1), num_classes=10, hidden_units=(2048, 2048, 2048))
VGG_DEFAULTS = dict(input_shape=(32, 32, 3), num_classes=10,
                    filters=(128, 128, 256, 256, 512, 512), dense_units=(1024, 1024))


def _norm(scale=True):
    return keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-4, scale=scale)


def _dense(units, precision, first):
    if precision == "float":
        return keras.layers.Dense(units, use_bias=False)
    return lq.layers.QuantDense(units, input_quantizer=None if first else "ste_sign",
                                kernel_quantizer="ste_sign", kernel_constraint="weight_clip",
                                use_bias=False)


def _conv(filters, precision, first):
    if precision == "float":
        return keras.layers.Conv2D(filters, 3, padding="same", use_bias=False)
    return lq.layers.QuantConv2D(filters, 3, padding="same", pad_values=1.0,
                                 input_quantizer=None if first else "ste_sign",
                                 kernel_quantizer="ste_sign", kernel_constraint="weight_clip",
                                 use_bias=False)


def _relu(precision):
    return [] if precision == "binary" else [keras.layers.Activation("relu")]


def binarynet_mlp(precision, input_shape, num_classes, hidden_units):
    layers = [keras.Input(tuple(input_shape)), keras.layers.Flatten()]
    for i, units in enumerate(hidden_units):
        layers += [_dense(units, precision, i == 0), _norm(), *_relu(precision)]
    layers += [_dense(num_classes, precision, False), _norm(scale=False)]
    return keras.Sequential(layers)


def vgg_small(precision, input_shape, num_classes, filters, dense_units):
    layers = [keras.Input(tuple(input_shape))]
    for i, f in enumerate(filters):
        layers.append(_conv(f, precision, i == 0))
        if i % 2 == 1:
            layers.append(keras.layers.MaxPooling2D(2))
        layers += [_norm(), *_relu(precision)]
    layers.append(keras.layers.Flatten())
    for units in dense_units:
        layers += [_dense(units, precision, False), _norm(), *_relu(precision)]
    layers += [_dense(num_classes, precision, False), _norm(scale=False)]
    return keras.Sequential(layers)


BUILDERS = {"binarynet_mlp": (binarynet_mlp, MLP_DEFAULTS), "vgg_small": (vgg_small, VGG_DEFAULTS)}


def build(name, precision, options):
    if name not in BUILDERS:
        raise ValueError(f"no Larq version of model {name!r}; "
                         f"available: {', '.join(BUILDERS)}")
    builder, defaults = BUILDERS[name]
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise ValueError(f"options {unknown} of {name!r} have no Larq "
                         "equivalent here; time the default model or add them to this script")
    return builder(precision, **{**defaults, **options})


def time_block(model, x, y, steps):
    start, start_cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        loss = model.train_on_batch(x, y)
    elapsed, elapsed_cpu = time.perf_counter() - start, time.process_time() - start_cpu
    if not np.isfinite(loss):
        raise ValueError(f"Larq's training loss became {loss}; the timing is void")
    return elapsed / steps, elapsed_cpu / steps


class Session:
    """The binary and float Larq models of one setup, with their synthetic batch."""

    def __init__(self, spec):
        seed = int(spec.get("seed", 0))
        tf.keras.utils.set_random_seed(seed)
        policy = spec.get("mixed_precision", "off")
        if policy not in POLICIES:
            raise ValueError(f"mixed_precision {policy!r} is not one of {', '.join(POLICIES)}")
        keras.mixed_precision.set_global_policy(POLICIES[policy])
        self.models = {}
        for precision in ("binary", "float"):
            model = build(spec["model"], precision, spec.get("options", {}))
            model.compile(keras.optimizers.Adam(1e-3),
                          keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                          jit_compile=bool(spec["xla"]))
            self.models[precision] = model
        rng = np.random.default_rng(seed)
        batch = int(spec["batch_size"])
        self.x = rng.standard_normal((batch, *self.models["binary"].input_shape[1:]),
                                     dtype=np.float32)
        self.y = rng.integers(0, int(self.models["binary"].output_shape[-1]), size=(batch,))
        for model in self.models.values():
            time_block(model, self.x, self.y, int(spec.get("warmup_steps", 3)))

    def block(self, precision, steps):
        if precision not in self.models:
            raise ValueError(f"no {precision!r} model; use 'binary' or 'float'")
        wall, cpu = time_block(self.models[precision], self.x, self.y, int(steps))
        return {"wall": wall, "cpu": cpu}


def handle(request, state):
    op = request.get("op")
    if op == "setup":
        state["session"] = None
        keras.backend.clear_session()
        state["session"] = Session(request)
        return {"ok": True, "larq": importlib.metadata.version("larq"),
                "tensorflow": tf.__version__}
    if op == "block":
        if state.get("session") is None:
            raise ValueError("'block' before 'setup'")
        return state["session"].block(request.get("precision"), request.get("steps", 1))
    if op == "teardown":
        state["session"] = None
        keras.backend.clear_session()
        return {"ok": True}
    raise ValueError(f"unknown op {op!r}; use setup, block or teardown")


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    state = {}
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            answer = handle(json.loads(line), state)
        except (ValueError, KeyError) as error:
            answer = {"error": f"{type(error).__name__}: {error}"}
        print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
