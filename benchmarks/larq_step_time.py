"""Larq's train step for the same models as bnn's benchmark, binary against float, interleaved.

Larq needs tf-keras (``TF_USE_LEGACY_KERAS=1``), so this script runs in its own Python
environment and never imports bnn. ``benchmarks/step_time.py --larq-python PATH`` runs it as a
subprocess and hands it the exact runs to time as JSON::

    TF_USE_LEGACY_KERAS=1 larq-env/bin/python benchmarks/larq_step_time.py --config '{"runs": [
        {"model": "binarynet_mlp", "xla": false, "batch_size": 100, "options": {}}],
        "blocks": 9, "steps_per_block": 10, "warmup_steps": 3}'

It prints one JSON object: ``{"larq": version, "tensorflow": version, "results": [{"model", "xla",
"batch_size", "binary_ms", "float_ms", "ratio", "binary_cpu_ms", "float_cpu_ms", "cpu_ratio"},
...]}`` (milliseconds per step, wall and process CPU time) with the same timing rules as
``bnn.benchmark``: warm-up steps untimed, blocks alternating binary/float, each step synchronised
by fetching its loss, medians over blocks, ratio = median of per-block-pair ratios.

The models match bnn's layer for layer: ``QuantDense``/``QuantConv2D`` with ``ste_sign`` inputs
(none on the first layer) and kernels, ``weight_clip``, no bias, convolutions padded with +1,
batch normalization (momentum 0.9, epsilon 1e-4, no scale on the logits); the float twins use
``Dense``/``Conv2D`` with a ReLU after each batch normalization but the last.
"""

import argparse
import importlib.metadata
import json
import os
import statistics
import sys
import time

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import larq as lq  # noqa: E402

keras = tf.keras

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
        raise SystemExit(f"larq_step_time.py: no Larq version of model {name!r}; "
                         f"available: {', '.join(BUILDERS)}")
    builder, defaults = BUILDERS[name]
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise SystemExit(f"larq_step_time.py: options {unknown} of {name!r} have no Larq "
                         "equivalent here; time the default model or add them to this script")
    return builder(precision, **{**defaults, **options})


def time_block(model, x, y, steps):
    start, start_cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        loss = model.train_on_batch(x, y)
    elapsed, elapsed_cpu = time.perf_counter() - start, time.process_time() - start_cpu
    if not np.isfinite(loss):
        raise SystemExit(f"larq_step_time.py: training loss became {loss}; the timing is void")
    return elapsed / steps, elapsed_cpu / steps


def measure(run, blocks, steps_per_block, warmup_steps, seed=0):
    tf.keras.utils.set_random_seed(seed)
    twins = {}
    for precision in ("binary", "float"):
        model = build(run["model"], precision, run.get("options", {}))
        model.compile(keras.optimizers.Adam(1e-3),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      jit_compile=bool(run["xla"]))
        twins[precision] = model
    rng = np.random.default_rng(seed)
    batch = int(run["batch_size"])
    x = rng.standard_normal((batch, *twins["binary"].input_shape[1:]), dtype=np.float32)
    y = rng.integers(0, int(twins["binary"].output_shape[-1]), size=(batch,))
    for model in twins.values():
        time_block(model, x, y, warmup_steps)
    times = {"binary": [], "float": []}
    cpu = {"binary": [], "float": []}
    for block in range(blocks):
        for precision in (("binary", "float") if block % 2 == 0 else ("float", "binary")):
            wall, cpu_time = time_block(twins[precision], x, y, steps_per_block)
            times[precision].append(wall)
            cpu[precision].append(cpu_time)
    keras.backend.clear_session()
    return {"model": run["model"], "xla": bool(run["xla"]), "batch_size": batch,
            "binary_ms": statistics.median(times["binary"]) * 1e3,
            "float_ms": statistics.median(times["float"]) * 1e3,
            "ratio": paired_ratio(times),
            "binary_cpu_ms": statistics.median(cpu["binary"]) * 1e3,
            "float_cpu_ms": statistics.median(cpu["float"]) * 1e3,
            "cpu_ratio": paired_ratio(cpu)}


def paired_ratio(times):
    return statistics.median(b / f for b, f in zip(times["binary"], times["float"]))


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True,
                        help='JSON: {"runs": [{"model", "xla", "batch_size", "options"}], '
                             '"blocks", "steps_per_block", "warmup_steps"}')
    args = parser.parse_args(argv)
    try:
        config = json.loads(args.config)
    except json.JSONDecodeError as error:
        parser.error(f"--config is not valid JSON ({error})")
    results = [measure(run, int(config.get("blocks", 9)), int(config.get("steps_per_block", 10)),
                       int(config.get("warmup_steps", 3))) for run in config["runs"]]
    print(json.dumps({"larq": importlib.metadata.version("larq"),
                      "tensorflow": tf.__version__, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
