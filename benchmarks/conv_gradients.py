"""A binary convolution's kernel gradient: TensorFlow's kernel against bnn's patch-bit lookup.

    python benchmarks/conv_gradients.py [--quick] [--batch-size 100] [--filters 128,...]
                                        [--dtype bfloat16|float32] [--blocks 5] [--json PATH]

For each binary 3x3 convolution of VGG-small (``--filters``: its six widths; the first layer is
float and not timed; 2x2 pools after the second, fourth and sixth), on ±1 inputs padded with +1
as bnn pads them and a random output gradient, it times, one call at a time, in interleaved
blocks:

- ``forward_ms``: TensorFlow's forward convolution of the layer, the reference for its size;
- ``tensorflow_ms``: TensorFlow's kernel-gradient convolution (``Conv2DBackpropFilter``) of the
  padded ±1 input, what the binary layer runs with ``BNN_CONV_GRADIENTS=tensorflow``;
- ``patches_product_ms``: the native ±1 patches of the packed input
  (:meth:`bnn.native.ops.Ops.sign_patches`) in the float dtype and their matrix product with the
  output gradient;
- ``bits_ms``: the patches as sign bits alone;
- ``lookup_ms``: the sign bits and their product with the output gradient by table lookup
  (:meth:`bnn.native.ops.Ops.sign_matmul`, in float32), the kernel gradient with
  ``BNN_CONV_GRADIENTS=patches``;

and reports medians over blocks, ``tensorflow / lookup``, the median over blocks of the ratio
of neighbouring blocks, which kernels ``bnn.native.dispatch.conv_gradient_kernels`` picks on this machine,
and, relative to the largest gradient, the largest difference from the float32 kernel gradient
of the same operands (TensorFlow's, in float32) of the lookup's gradient
(``max_relative_difference``: the same sums in another order, float32 rounding) and of
TensorFlow's in the dtype (``tensorflow_max_relative_difference``: in bfloat16 its rounding of
the sums, which on CPUs where oneDNN does not run TensorFlow's convolutions, such as AMD Zen 3,
sums in bfloat16). It needs the native kernels.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from bnn.cli.startup import start_tensorflow

start_tensorflow()  # the pooling CPU allocator, and TensorFlow without its start-up log lines

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from bnn.native import dispatch  # noqa: E402
from bnn.ops import bitpack  # noqa: E402
from bnn.tools.benchmark import paired_ratio  # noqa: E402

DTYPES = {"bfloat16": tf.bfloat16, "float32": tf.float32}
VGG_SMALL_FILTERS = (128, 128, 256, 256, 512, 512)


def layer_shapes(filters, size: int = 32) -> list[tuple[int, int, int]]:
    """(image size, input channels, output channels) of VGG-small's binary convolutions."""
    shapes = []
    for index in range(1, len(filters)):
        shapes.append((size, filters[index - 1], filters[index]))
        if index % 2 == 1:
            size //= 2
    return shapes


def _timers(size: int, c: int, f: int, batch: int, dtype: tf.DType, rng):
    signs = np.where(rng.random((batch, size, size, c)) < 0.5, 1.0, -1.0)
    padded = tf.constant(np.pad(signs, [(0, 0), (1, 1), (1, 1), (0, 0)], constant_values=1.0),
                         dtype)
    words = bitpack.pack(padded >= 0, axis=-1)
    dy = tf.constant(rng.standard_normal((batch, size, size, f)), dtype)
    w = tf.constant(rng.uniform(-1, 1, (3, 3, c, f)), dtype)
    native = dispatch.ops()
    strides = [1, 1, 1, 1]

    def bits():
        return native.sign_patches(words, (3, 3), (1, 1), c, tf.int64)

    ops = {
        "forward": lambda: tf.raw_ops.Conv2D(input=padded, filter=w, strides=strides,
                                             padding="VALID"),
        "tensorflow": lambda: tf.raw_ops.Conv2DBackpropFilter(
            input=padded, filter_sizes=[3, 3, c, f], out_backprop=dy, strides=strides,
            padding="VALID"),
        "float32": lambda: tf.raw_ops.Conv2DBackpropFilter(
            input=tf.cast(padded, tf.float32), filter_sizes=[3, 3, c, f],
            out_backprop=tf.cast(dy, tf.float32), strides=strides, padding="VALID"),
        "patches_product": lambda: tf.reshape(
            tf.matmul(native.sign_patches(words, (3, 3), (1, 1), c, dtype),
                      tf.reshape(dy, [-1, f])), [3, 3, c, f]),
        "bits": lambda: bits()[:1, :1],
        "lookup": lambda: tf.reshape(native.sign_matmul(
            bits(), tf.cast(tf.reshape(dy, [-1, f]), tf.float32)), [3, 3, c, f]),
    }
    return {name: tf.function(fn) for name, fn in ops.items()}


def _time_once(fn) -> float:
    start = time.perf_counter()
    fn().numpy()
    return (time.perf_counter() - start) * 1e3


def measure(size: int, c: int, f: int, batch: int, dtype: tf.DType, blocks: int, rng) -> dict:
    timers = _timers(size, c, f, batch, dtype, rng)
    reference = timers.pop("float32")().numpy().astype(np.float64)
    largest = max(np.abs(reference).max(), 1e-30)

    def relative_difference(name: str) -> float:
        return float(np.abs(timers[name]().numpy().astype(np.float64) - reference).max()
                     / largest)
    for fn in timers.values():  # warm-up: tracing, oneDNN's primitive caches
        fn()
    times: dict[str, list[float]] = {name: [] for name in timers}
    names = list(timers)
    for block in range(blocks):
        for name in names if block % 2 == 0 else reversed(names):
            times[name].append(_time_once(timers[name]))
    row = {"size": size, "in_channels": c, "filters": f}
    row.update({f"{name}_ms": statistics.median(t) for name, t in times.items()})
    row["tensorflow_over_lookup"] = paired_ratio(times["tensorflow"], times["lookup"])
    row["default_kernels"] = dispatch.conv_gradient_kernels(dtype, 9 * c)
    row["max_relative_difference"] = relative_difference("lookup")
    row["tensorflow_max_relative_difference"] = relative_difference("tensorflow")
    return row


def _parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="small layers, batch 4, two blocks: checks the harness in seconds")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--filters", default=",".join(map(str, VGG_SMALL_FILTERS)),
                        help="VGG-small's six convolution widths (default: %(default)s)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--blocks", type=int, default=5, help="timed blocks (default 5)")
    parser.add_argument("--json", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    try:
        args.filters = tuple(int(f) for f in args.filters.split(","))
    except ValueError:
        parser.error(f"--filters: six integers separated by commas, got {args.filters!r}")
    if len(args.filters) != 6 or min(args.filters) < 1:
        parser.error(f"--filters: six positive widths, got {args.filters}")
    if args.batch_size < 1 or args.blocks < 1:
        parser.error("--batch-size and --blocks must be at least 1")
    if args.quick:
        args.filters, args.batch_size, args.blocks = (8, 16, 16, 32, 32, 64), 4, 2
    return args


def main(argv=None) -> int:
    args = _parse(argv)
    if not dispatch.available():
        print(f"conv_gradients: native kernels unavailable: {dispatch.unavailable_reason()}",
              file=sys.stderr)
        return 1
    dtype = DTYPES[args.dtype]
    rng = np.random.default_rng(0)
    rows = [measure(size, c, f, args.batch_size, dtype, args.blocks, rng)
            for size, c, f in layer_shapes(args.filters)]
    print("| layer | forward ms | TensorFlow kernel gradient ms | ±1 patches + product ms | "
          "patch bits ms | bits + lookup ms | TensorFlow / lookup | default | "
          "lookup max rel. difference | TensorFlow max rel. difference |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['size']}x{r['size']}, {r['in_channels']} -> {r['filters']} | "
              f"{r['forward_ms']:.1f} | {r['tensorflow_ms']:.1f} | "
              f"{r['patches_product_ms']:.1f} | {r['bits_ms']:.1f} | {r['lookup_ms']:.1f} | "
              f"{r['tensorflow_over_lookup']:.2f} | {r['default_kernels']} | "
              f"{r['max_relative_difference']:.1e} | "
              f"{r['tensorflow_max_relative_difference']:.1e} |")
    total = {key: sum(r[key] for r in rows)
             for key in ("tensorflow_ms", "patches_product_ms", "lookup_ms")}
    print(f"\nAll layers: TensorFlow {total['tensorflow_ms']:.1f} ms, ±1 patches + product "
          f"{total['patches_product_ms']:.1f} ms, bits + lookup {total['lookup_ms']:.1f} ms; "
          f"{args.dtype}, batch {args.batch_size}, kernels {dispatch.variant()}.")
    if args.json:
        args.json.write_text(json.dumps({
            "dtype": args.dtype, "batch_size": args.batch_size, "filters": list(args.filters),
            "blocks": args.blocks, "kernel_variant": dispatch.variant(), "layers": rows,
            "total": total}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
