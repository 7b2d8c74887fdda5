"""Values computed by Larq itself for the bnn.larq quantizer tests (test_larq_quantizers.py).

Larq needs tf-keras, so this script runs in its own environment and never imports bnn::

    TF_USE_LEGACY_KERAS=1 larq-env/bin/python tests/larq/larq_quantizers_reference.py OUT_DIR

It writes into OUT_DIR:

* ``reference.npz``: for each quantizer case its input, upstream gradient, output and input
  gradient (``case/<id>/{x,dy,y,dx}``), on inputs that hold the points where quantizers decide:
  0, the thresholds of ``SteTern`` (the fixed one, and the ternary-weight-networks one, which
  the input is built to reach exactly), the clip values, the DoReFa level boundaries; for each
  layer with the custom quantizer of Larq's guide (``identity_sign``, a function on
  ``tf.custom_gradient``) its weights, input, output and gradients (``guide/<id>/...``);
* ``manifest.json``: the cases (class and keyword arguments), each class's ``get_config()`` and
  ``precision``, and the Larq and TensorFlow versions.
"""

import json
import os
import sys
from pathlib import Path

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import larq as lq  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

keras = tf.keras
SEED = 11

#: (case id, Larq class, keyword arguments, input kind)
CASES = [
    ("ste_sign", "SteSign", {}, "grid"),
    ("ste_sign_clip_half", "SteSign", {"clip_value": 0.5}, "grid"),
    ("ste_sign_clip2", "SteSign", {"clip_value": 2.0}, "grid"),
    ("ste_sign_noclip", "SteSign", {"clip_value": None}, "grid"),
    ("approx_sign", "ApproxSign", {}, "grid"),
    ("swish_sign", "SwishSign", {}, "grid"),
    ("swish_sign_beta2", "SwishSign", {"beta": 2.0}, "grid"),
    ("swish_sign_beta10", "SwishSign", {"beta": 10.0}, "grid"),
    ("magnitude_aware_sign", "MagnitudeAwareSign", {}, "kernel"),
    ("magnitude_aware_sign_clip2", "MagnitudeAwareSign", {"clip_value": 2.0}, "kernel"),
    ("ste_heaviside", "SteHeaviside", {}, "grid"),
    ("ste_heaviside_noclip", "SteHeaviside", {"clip_value": None}, "grid"),
    ("ste_tern", "SteTern", {}, "grid"),
    ("ste_tern_threshold", "SteTern", {"threshold_value": 0.3, "clip_value": 1.5}, "grid"),
    ("ste_tern_zero_threshold", "SteTern", {"threshold_value": 0.0}, "grid"),
    ("ste_tern_noclip", "SteTern", {"clip_value": None}, "grid"),
    ("ste_tern_twn", "SteTern", {"ternary_weight_networks": True}, "twn"),
    ("dorefa", "DoReFa", {}, "levels"),
    ("dorefa_1", "DoReFa", {"k_bit": 1}, "levels"),
    ("dorefa_4", "DoReFa", {"k_bit": 4}, "levels"),
    ("dorefa_weights", "DoReFa", {"mode": "weights"}, "kernel"),
    ("dorefa_weights_3", "DoReFa", {"k_bit": 3, "mode": "weights"}, "kernel"),
    ("noop", "NoOp", {"precision": 1}, "grid"),
    ("noop_8", "NoOp", {"precision": 8}, "grid"),
]

#: Every quantizer class Larq exports, with the arguments its config is recorded for.
CONFIGS = [
    ("SteSign", {"clip_value": 0.5}), ("SteSign", {"clip_value": None}), ("ApproxSign", {}),
    ("SwishSign", {"beta": 2.0}), ("MagnitudeAwareSign", {}), ("SteHeaviside", {}),
    ("SteTern", {"threshold_value": 0.3, "ternary_weight_networks": True, "clip_value": 1.5}),
    ("DoReFa", {"k_bit": 3, "mode": "weights"}), ("NoOp", {"precision": 1}),
]


def grid(rng) -> np.ndarray:
    """Every decision point of the sign family, ternarization and clipping, and random values."""
    points = np.float32([0.0, 0.05, 0.049, 0.051, 0.3, 0.5, 1.0, 1.5, 2.0, 0.7, 0.2])
    fixed = np.concatenate([points, -points[1:]])
    return np.concatenate([fixed, rng.uniform(-2.5, 2.5, 43).astype("float32")]).reshape(4, 16)


def kernel(rng) -> np.ndarray:
    """A conv kernel (3, 3, 2, 4), with exact zeros and the clip values."""
    x = rng.uniform(-2, 2, (3, 3, 2, 4)).astype("float32")
    x[0, 0, 0, :] = [0.0, 1.0, -1.0, 2.0]
    return x


def levels(rng) -> np.ndarray:
    """Inputs across [0, 1] with DoReFa's clip points, and beyond."""
    x = np.concatenate([np.float32([0.0, 1.0, -0.25, 1.25, 0.5]),
                        rng.uniform(-0.5, 1.5, 59).astype("float32")])
    return x.reshape(4, 16)


def twn(rng) -> np.ndarray:
    """An input in which ±(Larq's ternary-weight-networks threshold of this very input) occur
    exactly: the threshold 0.7 sum|x| / n, computed as Larq computes it, is a fixed point of
    x[0] = threshold, x[1] = -threshold (the rest fixed)."""
    for _ in range(100):
        x = rng.uniform(-1, 1, 64).astype("float32")
        for _ in range(60):
            t = tf.constant(x)
            threshold = (0.7 * tf.reduce_sum(tf.abs(t)) / tf.cast(tf.size(t), t.dtype)).numpy()
            if x[0] == threshold and x[1] == -threshold:
                return x.reshape(4, 16)
            x[0], x[1] = threshold, -threshold
    raise RuntimeError("found no input holding its own ternary-weight-networks threshold")


INPUTS = {"grid": grid, "kernel": kernel, "levels": levels, "twn": twn}


def quantizer_cases(out: dict, rng) -> list:
    cases = []
    for case_id, cls, kwargs, kind in CASES:
        x = INPUTS[kind](rng)
        dy = rng.normal(size=x.shape).astype("float32")
        tx = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(tx)
            y = getattr(lq.quantizers, cls)(**kwargs)(tx)
        dx = tape.gradient(y, tx, output_gradients=tf.constant(dy))
        for key, value in dict(x=x, dy=dy, y=y.numpy(), dx=dx.numpy()).items():
            out[f"case/{case_id}/{key}"] = value
        cases.append({"id": case_id, "class": cls, "kwargs": kwargs})
    return cases


@tf.custom_gradient
def identity_sign(x):
    """Larq's guide ("Using Custom Quantizers"): a binarization with an identity gradient."""
    def grad(dy):
        return dy

    return tf.sign(x), grad


GUIDE_LAYERS = {
    "dense": (lambda: lq.layers.QuantDense(3, input_quantizer=identity_sign,
                                           kernel_quantizer=identity_sign), (4, 5)),
    "conv2d": (lambda: lq.layers.QuantConv2D(3, 3, padding="same", input_quantizer=identity_sign,
                                             kernel_quantizer=identity_sign), (2, 5, 5, 2)),
}


def guide_cases(out: dict, rng) -> list:
    """Each layer with the guide's quantizer: output and gradients of sum(y * w) for given
    weights and input (eager, as Larq computes them everywhere)."""
    for case_id, (make, shape) in GUIDE_LAYERS.items():
        layer = make()
        layer.build(shape)
        weights = [rng.uniform(-1, 1, w.shape).astype("float32") for w in layer.get_weights()]
        layer.set_weights(weights)
        x = tf.constant(rng.uniform(-1, 1, shape).astype("float32"))
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x)
            w = tf.constant(rng.normal(size=y.shape).astype("float32"))
            loss = tf.reduce_sum(y * w)
        dx, dkernel = tape.gradient(loss, [x, layer.kernel])
        for key, value in dict(kernel=weights[0], bias=weights[1], x=x.numpy(), w=w.numpy(),
                               y=y.numpy(), dx=dx.numpy(), dkernel=dkernel.numpy()).items():
            out[f"guide/{case_id}/{key}"] = value
    return sorted(GUIDE_LAYERS)


def configs() -> list:
    recorded = []
    for cls, kwargs in CONFIGS:
        quantizer = getattr(lq.quantizers, cls)(**kwargs)
        recorded.append({"class": cls, "kwargs": kwargs, "config": quantizer.get_config(),
                         "precision": quantizer.precision})
    return recorded


def main(out_dir: Path) -> None:
    tf.random.set_seed(SEED)
    rng = np.random.default_rng(SEED)
    out_dir.mkdir(parents=True, exist_ok=True)
    arrays = {}
    manifest = {"larq": lq.__version__, "tensorflow": tf.__version__,
                "cases": quantizer_cases(arrays, rng), "guide": guide_cases(arrays, rng),
                "configs": configs()}
    np.savez(out_dir / "reference.npz", **arrays)
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
