"""What Larq itself registers with Keras, and the values its registered objects give, for
tests/larq/test_larq_registry.py and tests/larq/test_larq_optimizers.py.

Larq needs tf-keras, so this script runs in Larq's own environment and never imports bnn::

    TF_USE_LEGACY_KERAS=1 larq-env/bin/python tests/larq/larq_registry_reference.py OUT_DIR

It writes into OUT_DIR:

* ``registry.json``: ``names``, every name ``import larq`` adds to tf-keras' custom objects, with
  the kind of object (``quantizer``, ``layer``, ``constraint``, ``metric``, ``activation``,
  ``optimizer``) and the class or function it names; ``lookups``, what tf-keras' lookup for that
  kind gives for the name (the class of the object, or the error); ``configs``, Larq's configs
  of Bop (default, with arguments, with schedules) and of FlipRatio; ``flip_ratio``, the state of
  a FlipRatio after each update of Larq's test sequence; versions.
* ``values.npz``: the input ``x`` and, per name, what the object it resolves to gives on ``x``
  (``<name>/y``) and the gradient of its sum (``<name>/dx``): constraints, activations and
  quantizers; ``math/sign`` and ``math/heaviside`` on ``x``.
"""

import json
import os
import sys
from pathlib import Path

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tf_keras  # noqa: E402,F401  (its own custom objects, before Larq adds to them)
import tensorflow as tf  # noqa: E402

keras = tf.keras
BEFORE = set(keras.utils.get_custom_objects())

import larq as lq  # noqa: E402
import numpy as np  # noqa: E402

#: The smallest arguments each of Larq's layers is built with.
LAYER_ARGUMENTS = {"QuantDense": {"units": 3}, "QuantDepthwiseConv2D": {"kernel_size": 3}}


def kind_of(obj) -> str:
    if isinstance(obj, type):
        for kind, base in (("quantizer", lq.quantizers.Quantizer),
                           ("metric", keras.metrics.Metric),  # a tf-keras Layer too
                           ("layer", keras.layers.Layer),
                           ("constraint", keras.constraints.Constraint),
                           ("optimizer", keras.optimizers.legacy.Optimizer)):
            if issubclass(obj, base):
                return kind
    if callable(obj) and obj.__module__ == "larq.activations":
        return "activation"
    raise ValueError(f"unexpected registered object {obj!r}")


def described(make) -> str:
    """The class name of what ``make()`` gives (``type:Name`` for a class), or the error."""
    try:
        obj = make()
    except Exception as error:  # noqa: BLE001 -- the error's name is the result
        return f"error:{type(error).__name__}"
    if isinstance(obj, type):
        return f"type:{obj.__name__}"
    return getattr(obj, "__name__", None) or type(obj).__name__


def lookup(name: str, kind: str):
    """tf-keras' lookup of ``name`` for objects of ``kind`` (a callable giving the object)."""
    if kind == "constraint":
        return lambda: keras.constraints.get(name)
    if kind == "activation":
        return lambda: keras.activations.get(name)
    if kind == "metric":
        return lambda: keras.metrics.get(name)
    if kind == "optimizer":
        return lambda: keras.optimizers.get(name)
    config = LAYER_ARGUMENTS.get(name, {"filters": 2, "kernel_size": 3}) if kind == "layer" else {}
    return lambda: keras.layers.deserialize({"class_name": name, "config": config})


def value_and_gradient(fn, x):
    x = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
    return y.numpy(), tape.gradient(y, x).numpy()


def flip_ratio_sequence() -> list[dict]:
    """Larq's metrics_test sequence: the metric's state after each update."""
    metric = lq.metrics.FlipRatio()
    states = []
    for values in ((1, 1), (2, 2), (1, 2)):
        metric.update_state(np.array(values))
        states.append({"result": float(metric.result()), "total": float(metric.total),
                       "count": float(metric.count),
                       "previous": metric._previous_values.numpy().tolist()})
    return states


def main(out_dir: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    custom = keras.utils.get_custom_objects()
    names = {name: {"kind": kind_of(custom[name]), "object": custom[name].__name__}
             for name in sorted(set(custom) - BEFORE)}
    lookups = {name: described(lookup(name, entry["kind"])) for name, entry in names.items()}

    rng = np.random.default_rng(1337)
    x = np.insert(rng.uniform(-2, 2, (4, 10)), 1, 0, axis=1)
    x[0, 2:5] = [-1.0, 1.0, 0.5]  # the edges of the clip window
    x = x.astype("float32")
    values = {"x": x}
    for name, entry in names.items():
        if (entry["kind"] in ("constraint", "activation", "quantizer")
                and not lookups[name].startswith("error:")):
            fn = lookup(name, entry["kind"])()
            values[f"{name}/y"], values[f"{name}/dx"] = value_and_gradient(fn, x)
    values["math/sign"] = lq.math.sign(tf.constant(x)).numpy()
    values["math/heaviside"] = lq.math.heaviside(tf.constant(x)).numpy()

    schedule = keras.optimizers.schedules.PolynomialDecay(5e-4, 100)
    configs = {
        "bop_default": lq.optimizers.Bop().get_config(),
        "bop_arguments": lq.optimizers.Bop(threshold=1e-6, gamma=1e-3, name="bop").get_config(),
        "bop_schedules": lq.optimizers.Bop(threshold=schedule, gamma=schedule).get_config(),
        "flip_ratio": lq.metrics.FlipRatio(values_dtype="int16", name="mcv",
                                           dtype=tf.float16).get_config(),
    }
    report = {"names": names, "lookups": lookups, "configs": configs,
              "flip_ratio": flip_ratio_sequence(), "larq": lq.__version__,
              "tensorflow": tf.__version__}
    np.savez(out / "values.npz", **values)
    (out / "registry.json").write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main(sys.argv[1])
