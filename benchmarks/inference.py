"""Packed (.bnn, xor-popcount) inference against the float twin on CPU.

    python benchmarks/inference.py [--quick] [--json PATH] [--models mlp,vgg_small]

For the BinaryNet MLP (784-3x2048-10) exported with the MNIST input encoding (``mlp``: exact
integer first layer) and without it (``mlp_float_in``: float first layer, rounded as Keras rounds
it), and VGG-small (32x32x3), it times, at batch 1 and 100, the packed model and the
float twin (Keras, in a ``tf.function``, with and without XLA), all fed the same normalized
float32 inputs (MLP inputs are random pixels ``u / 127.5 - 1``; the packed MLP is also timed on
the uint8 pixels), in interleaved timed blocks after warm-up, and reports medians over blocks
of the per-call time and the speed-up over the faster float variant: the median over rounds of
(the faster float block of the round) / (the packed block of the round), so a minute in which
the machine runs slow slows both sides of each ratio alike. Where the native kernels
(``bnn.native``) run the packed model, the same model on its pure-TensorFlow XLA kernels is
timed beside it (``BNN_NATIVE_KERNELS=avx2`` times the AVX2 kernels on an AVX-512 CPU; see
docs/export.md for restricting XLA and oneDNN to AVX2 as well). It also reports the .bnn size against the float twin's saved weights
(``.weights.h5``), and, when MNIST is available (``BNN_DATA_DIR``, default ../shared/datasets
beside the repository), fits the binary MLP for one epoch and counts the test images on which
the packed model's class equals the Keras model's, exported with and without the input encoding.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from bnn.cli.startup import start_tensorflow

start_tensorflow()  # the pooling CPU allocator, and TensorFlow without its start-up log lines

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from bnn import models, settings  # noqa: E402
from bnn.native import dispatch  # noqa: E402
from bnn.tools.benchmark import paired_ratio  # noqa: E402
from bnn.packed.export import export_model, load_packed  # noqa: E402

ARCHITECTURES = {
    "mlp": ("binarynet_mlp", {}, (28, 28, 1)),
    "mlp_float_in": ("binarynet_mlp", {}, (28, 28, 1)),
    "vgg_small": ("vgg_small", {}, (32, 32, 3)),
}
#: MNIST normalization of bnn.data: x = u / 127.5 - 1 for uint8 pixels u.
MNIST_ENCODING = (1 / 127.5, -1.0)


def _timed_block(fn, x, reps: int) -> float:
    """Seconds per call, averaged over ``reps`` back-to-back calls (results fetched to numpy)."""
    start = time.perf_counter()
    for _ in range(reps):
        fn(x).numpy()
    return (time.perf_counter() - start) / reps


def interleaved(variants: dict, x, rounds: int, reps: int,
                warmup: int = 3) -> dict[str, list[float]]:
    """Seconds per call of each variant in each of ``rounds`` timed blocks, interleaved: one
    block per variant a round, in the given order on even rounds and the reverse on odd ones."""
    for fn in variants.values():
        for _ in range(warmup):
            fn(x).numpy()
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for round_index in range(rounds):
        for name in names if round_index % 2 == 0 else names[::-1]:
            times[name].append(_timed_block(variants[name], x, reps))
    return times


def _fit_mnist_mlp(data_dir: Path, quick: bool) -> tuple[keras.Model, np.ndarray, np.ndarray]:
    with np.load(data_dir / "mnist.npz") as data:
        x_train, y_train = data["x_train"], data["y_train"]
        x_test, y_test = data["x_test"], data["y_test"]
    normalize = lambda a: (a.astype(np.float32) / 127.5 - 1.0)[..., None]  # noqa: E731
    if quick:
        x_train, y_train = x_train[:6000], y_train[:6000]
    model = models.build("binarynet_mlp")
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(normalize(x_train), y_train, batch_size=100, epochs=1, verbose=0)
    return model, normalize(x_test), y_test.astype(np.int64)


def mnist_agreement(data_dir: Path, work: Path, quick: bool) -> dict | None:
    """Class agreement of the packed MLP with the Keras MLP on the MNIST test set."""
    if not (data_dir / "mnist.npz").is_file():
        return None
    model, x_test, y_test = _fit_mnist_mlp(data_dir, quick)
    reference = model.predict(x_test, batch_size=500, verbose=0)
    result = {"examples": int(len(x_test)), "train_examples": 6000 if quick else 60000,
              "keras_accuracy": float((reference.argmax(-1) == y_test).mean())}
    for key, encoding in (("integer_first_layer", MNIST_ENCODING), ("float_first_layer", None)):
        export_model(model, work / "mnist_mlp.bnn", input_encoding=encoding)
        packed = load_packed(work / "mnist_mlp.bnn").predict(x_test, batch_size=500)
        same = packed.argmax(-1) == reference.argmax(-1)
        result[key] = {"class_agreement": float(same.mean()),
                       "disagreements": int((~same).sum()),
                       "max_abs_logit_difference": float(np.abs(packed - reference).max()),
                       "packed_accuracy": float((packed.argmax(-1) == y_test).mean())}
    return result


def benchmark_architecture(key: str, work: Path, quick: bool) -> dict:
    name, options, input_shape = ARCHITECTURES[key]
    binary = models.build(name, "binary", input_shape=input_shape, **options)
    rng = np.random.default_rng(0)
    for layer in binary.layers:  # trained-like statistics: untrained zero means put pixel-grid
        if isinstance(layer, keras.layers.BatchNormalization):  # inputs on exact ties
            layer.moving_mean.assign(rng.normal(0, 5, layer.moving_mean.shape))
    twin = models.build(name, "float", input_shape=input_shape, **options)
    bnn_path, weights_path = work / f"{key}.bnn", work / f"{key}_float.weights.h5"
    encoding = MNIST_ENCODING if key == "mlp" else None
    summary = export_model(binary, bnn_path, input_encoding=encoding)
    twin.save_weights(weights_path)
    packed = load_packed(bnn_path)
    packed_xla = load_packed(bnn_path, native=False) if packed.native else None
    float_graph = tf.function(lambda x: twin(x, training=False))
    float_xla = tf.function(lambda inputs: twin(inputs, training=False), jit_compile=True)
    result = {"bnn_bytes": summary["bytes"], "float_weights_bytes": weights_path.stat().st_size,
              "batches": {}}
    result["size_ratio"] = result["float_weights_bytes"] / result["bnn_bytes"]
    for batch in (1, 100):
        if encoding:
            pixels = tf.constant(rng.integers(0, 256, (batch, *input_shape)).astype(np.uint8))
            x = tf.cast(pixels, tf.float32) * np.float32(encoding[0]) + np.float32(encoding[1])
        else:
            x = tf.constant(rng.uniform(-1, 1, (batch, *input_shape)).astype(np.float32))
        difference = float(np.abs(packed(x).numpy() - binary(x, training=False).numpy()).max())
        heavy = key == "vgg_small" and batch == 100
        rounds = (3 if quick else 7) if heavy else (5 if quick else 11)
        reps = 1 if heavy else (2 if batch == 100 else 20) * (1 if quick else 2)
        variants = {"packed": packed, "float": float_graph, "float_xla": float_xla}
        if encoding:
            variants["packed_uint8"] = lambda _, pixels=pixels: packed(pixels)
        if packed.native:
            variants["packed_xla"] = packed_xla
        blocks = interleaved(variants, x, rounds, reps)
        seconds = {name: float(np.median(t)) for name, t in blocks.items()}
        best_float = [min(pair) for pair in zip(blocks["float"], blocks["float_xla"])]
        result["batches"][str(batch)] = {
            "packed_ms": 1e3 * seconds["packed"], "float_ms": 1e3 * seconds["float"],
            "float_xla_ms": 1e3 * seconds["float_xla"],
            "speedup_vs_best_float": paired_ratio(best_float, blocks["packed"]), "rounds": rounds,
            "max_abs_logit_difference": difference,
            "reps_per_round": reps}
        if encoding:
            result["batches"][str(batch)]["packed_uint8_ms"] = 1e3 * seconds["packed_uint8"]
        if packed.native:
            result["batches"][str(batch)]["packed_xla_ms"] = 1e3 * seconds["packed_xla"]
    result["native_kernels"] = packed.native
    return result


def markdown(results: dict) -> str:
    lines = ["| model | batch | packed ms | packed ms (uint8 in) | packed ms (XLA kernels) | "
             "float ms (tf.function) | float ms (XLA) | speed-up vs best float |",
             "|---|---|---|---|---|---|---|---|"]
    for key, res in results["models"].items():
        for batch, b in res["batches"].items():
            uint8 = f"{b['packed_uint8_ms']:.3f}" if "packed_uint8_ms" in b else "-"
            xla = f"{b['packed_xla_ms']:.3f}" if "packed_xla_ms" in b else "-"
            lines.append(f"| {key} | {batch} | {b['packed_ms']:.3f} | {uint8} | {xla} | "
                         f"{b['float_ms']:.3f} | {b['float_xla_ms']:.3f} | "
                         f"{b['speedup_vs_best_float']:.1f}x |")
    lines += ["", "| model | .bnn bytes | float twin .weights.h5 bytes | ratio |",
              "|---|---|---|---|"]
    for key, res in results["models"].items():
        lines.append(f"| {key} | {res['bnn_bytes']} | {res['float_weights_bytes']} | "
                     f"{res['size_ratio']:.1f}x |")
    mnist = results.get("mnist")
    if mnist:
        lines += ["", f"MNIST test set (MLP fitted 1 epoch on {mnist['train_examples']} images, "
                      f"Keras accuracy {mnist['keras_accuracy']:.4f}):"]
        for key in ("integer_first_layer", "float_first_layer"):
            m = mnist[key]
            lines.append(f"- {key.replace('_', ' ')}: packed and Keras classes agree on "
                         f"{mnist['examples'] - m['disagreements']}/{mnist['examples']}, max "
                         f"|logit difference| {m['max_abs_logit_difference']:.2e}, packed "
                         f"accuracy {m['packed_accuracy']:.4f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, smaller MNIST fit")
    parser.add_argument("--json", type=Path, help="write the results as JSON here")
    parser.add_argument("--models", default=",".join(ARCHITECTURES),
                        help=f"comma-separated, from {', '.join(ARCHITECTURES)} (default: all)")
    args = parser.parse_args(argv)
    keys = [key.strip() for key in args.models.split(",") if key.strip()]
    unknown = [key for key in keys if key not in ARCHITECTURES]
    if unknown or not keys:
        parser.error(f"--models: unknown {', '.join(unknown) or 'empty list'}; choose from "
                     f"{', '.join(ARCHITECTURES)}")
    data_dir = Path(settings.data_dir()
                    or Path(__file__).resolve().parents[2] / "shared" / "datasets")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        results = {"cpu_threads": os.cpu_count(), "quick": args.quick,
                   "native_kernels": dispatch.preferred(),
                   "native_kernel_variant": dispatch.variant(),
                   "native_kernels_built": dispatch.available(),
                   "native_kernels_unavailable": dispatch.unavailable_reason(),
                   "models": {key: benchmark_architecture(key, work, args.quick)
                              for key in keys},
                   "mnist": mnist_agreement(data_dir, work, args.quick)}
    print(markdown(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
