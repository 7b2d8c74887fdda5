"""Reference models and values computed by Larq itself, for the bnn.larq tests.

Larq needs tf-keras, so this script runs in its own environment and never imports bnn::

    TF_USE_LEGACY_KERAS=1 larq-env/bin/python tests/larq/larq_reference.py OUT_DIR

It writes into OUT_DIR:

* ``<model>.h5``, ``<model>.keras`` and ``<model>_savedmodel/``: each reference model, trained a
  few steps (so that batch-norm statistics and latent weights have moved) and saved in the three
  formats Larq users have (``mnist_tutorial``, used to train further, only as ``.h5``);
* ``reference.npz``: for each model its inputs ``model/<name>/x`` and inference outputs
  ``model/<name>/y``; for each Bop case the initial and final weights of a short training run
  (``bop/<id>/...``);
* ``manifest.json``: the Bop cases, and the Larq and TensorFlow versions.

Quantizer values and gradients are recorded by ``larq_quantizers_reference.py``.
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
SEED = 7


def binarynet_mlp():
    """BinaryNet MLP: real-valued first layer, ste_sign elsewhere (once as Larq's function rather
    than its name), softmax output."""
    binary = dict(input_quantizer="ste_sign", kernel_quantizer="ste_sign",
                  kernel_constraint="weight_clip", use_bias=False)
    return keras.Sequential([
        keras.Input((8, 8, 1)), keras.layers.Flatten(),
        lq.layers.QuantDense(32, kernel_quantizer="ste_sign", kernel_constraint="weight_clip",
                             use_bias=False, name="dense_in"),
        keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-4, name="bn_in"),
        lq.layers.QuantDense(32, **binary, name="dense_hidden"),
        keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-4),
        lq.layers.QuantDense(10, input_quantizer=lq.quantizers.ste_sign,  # a function
                             kernel_quantizer="ste_sign", kernel_constraint="weight_clip",
                             use_bias=False),
        keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-4, scale=False),
        keras.layers.Activation("softmax"),
    ], name="binarynet_mlp")


def vgg_style():
    """A VGG-style net as Larq's tutorials build it (input_shape on the first layer):
    convolutions padded with +1, max pooling, batch norm, dense head."""
    binary = dict(input_quantizer="ste_sign", kernel_quantizer="ste_sign",
                  kernel_constraint="weight_clip", use_bias=False)
    model = keras.Sequential(name="vgg_style")
    model.add(lq.layers.QuantConv2D(8, 3, padding="same", pad_values=1.0,
                                    kernel_quantizer="ste_sign", kernel_constraint="weight_clip",
                                    use_bias=False, input_shape=(12, 12, 3)))
    model.add(keras.layers.BatchNormalization(momentum=0.9))
    model.add(lq.layers.QuantConv2D(8, 3, padding="same", pad_values=1.0, **binary))
    model.add(keras.layers.MaxPooling2D(2))
    model.add(keras.layers.BatchNormalization(momentum=0.9))
    model.add(lq.layers.QuantConv2D(16, 3, padding="same", pad_values=1.0, **binary))
    model.add(keras.layers.MaxPooling2D(2))
    model.add(keras.layers.BatchNormalization(momentum=0.9))
    model.add(keras.layers.Flatten())
    model.add(lq.layers.QuantDense(16, **binary))
    model.add(keras.layers.BatchNormalization(momentum=0.9))
    model.add(lq.layers.QuantDense(10, **binary))
    model.add(keras.layers.BatchNormalization(momentum=0.9, scale=False))
    return model


def scaled_quantizers():
    """A functional model with a shortcut and every other quantizer: magnitude-aware and
    ternary kernels, DoReFa weights and activations, SwishSign, ApproxSign, SteHeaviside, clip
    values, depthwise and separable convolutions, biases and a frozen batch norm."""
    inputs = keras.Input((10, 10, 4))
    x = lq.layers.QuantConv2D(
        8, 3, padding="same", pad_values=-1.0, input_quantizer="approx_sign",
        kernel_quantizer="magnitude_aware_sign", kernel_constraint=lq.constraints.WeightClip(1.3),
        activation="relu", name="conv_scaled")(inputs)
    y = lq.layers.QuantDepthwiseConv2D(
        3, padding="same", pad_values=1.0, input_quantizer=lq.quantizers.SwishSign(beta=3.0),
        depthwise_quantizer=lq.quantizers.SteTern(ternary_weight_networks=True),
        depthwise_constraint="weight_clip", name="depthwise_tern")(x)
    y = keras.layers.BatchNormalization(center=False, name="bn_shortcut")(y)
    x = keras.layers.Add()([x, y])
    x = lq.layers.QuantSeparableConv2D(
        12, 3, strides=2, depth_multiplier=2, padding="same", pad_values=1.0,
        input_quantizer=lq.quantizers.SteSign(clip_value=None),
        depthwise_quantizer=lq.quantizers.DoReFa(k_bit=3, mode="weights"),
        pointwise_quantizer="ste_tern", pointwise_constraint="weight_clip",
        name="separable")(x)
    frozen = keras.layers.BatchNormalization(name="bn_frozen")
    x = frozen(x)
    x = keras.layers.AveragePooling2D(2)(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = lq.layers.QuantDense(16, input_quantizer=lq.quantizers.DoReFa(k_bit=2),
                             kernel_quantizer=lq.quantizers.SteHeaviside(clip_value=0.5),
                             name="dense_dorefa")(x)
    x = keras.layers.BatchNormalization(scale=False)(x)
    outputs = keras.layers.Dense(10, name="logits")(x)
    model = keras.Model(inputs, outputs, name="scaled_quantizers")
    frozen.trainable = False
    return model


def mnist_tutorial():
    """The model of Larq's MNIST tutorial (a binarized CNN ending in a softmax)."""
    kwargs = dict(input_quantizer="ste_sign", kernel_quantizer="ste_sign",
                  kernel_constraint="weight_clip")
    return keras.Sequential([
        lq.layers.QuantConv2D(32, (3, 3), kernel_quantizer="ste_sign",
                              kernel_constraint="weight_clip", use_bias=False,
                              input_shape=(28, 28, 1)),
        keras.layers.MaxPooling2D((2, 2)), keras.layers.BatchNormalization(scale=False),
        lq.layers.QuantConv2D(64, (3, 3), use_bias=False, **kwargs),
        keras.layers.MaxPooling2D((2, 2)), keras.layers.BatchNormalization(scale=False),
        lq.layers.QuantConv2D(64, (3, 3), use_bias=False, **kwargs),
        keras.layers.BatchNormalization(scale=False), keras.layers.Flatten(),
        lq.layers.QuantDense(64, use_bias=False, **kwargs),
        keras.layers.BatchNormalization(scale=False),
        lq.layers.QuantDense(10, use_bias=False, **kwargs),
        keras.layers.BatchNormalization(scale=False), keras.layers.Activation("softmax"),
    ], name="mnist_tutorial")


MODELS = {"binarynet_mlp": binarynet_mlp, "vgg_style": vgg_style,
          "scaled_quantizers": scaled_quantizers, "mnist_tutorial": mnist_tutorial}

BOP_CASES = {
    # kernel quantizer of the two binary layers, Bop arguments ("schedule" = InverseTimeDecay)
    "noop_constant": ("noop", {"threshold": 1e-5, "gamma": 0.05}),
    "ste_sign_schedule": ("ste_sign", "schedule"),
}


def bop_model(kernel_quantizer):
    quantizer = lq.quantizers.NoOp(precision=1) if kernel_quantizer == "noop" else "ste_sign"
    constraint = None if kernel_quantizer == "noop" else "weight_clip"
    return keras.Sequential([
        keras.Input((6,)),
        lq.layers.QuantDense(8, kernel_quantizer=quantizer, kernel_constraint=constraint,
                             use_bias=False, name="binary_0"),
        keras.layers.BatchNormalization(name="bn"),
        lq.layers.QuantDense(3, input_quantizer="ste_sign", kernel_quantizer=quantizer,
                             kernel_constraint=constraint, name="binary_1"),
    ])


def bop_schedule():
    return keras.optimizers.schedules.InverseTimeDecay(1e-3, decay_steps=1.0, decay_rate=0.5)


def bop_references(out: dict) -> dict:
    rng = np.random.default_rng(SEED + 1)
    x = rng.normal(size=(32, 6)).astype("float32")
    y = rng.normal(size=(32, 3)).astype("float32")
    cases = {}
    for case_id, (quantizer, arguments) in BOP_CASES.items():
        tf.keras.utils.set_random_seed(SEED)
        model = bop_model(quantizer)
        bop_args = ({"threshold": bop_schedule(), "gamma": bop_schedule()}
                    if arguments == "schedule" else arguments)
        optimizer = lq.optimizers.CaseOptimizer(
            (lq.optimizers.Bop.is_binary_variable, lq.optimizers.Bop(**bop_args)),
            default_optimizer=keras.optimizers.legacy.SGD(0.1))
        model.compile(optimizer=optimizer, loss="mse")
        for i, w in enumerate(model.get_weights()):
            out[f"bop/{case_id}/initial/{i}"] = w
        model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
        for i, w in enumerate(model.get_weights()):
            out[f"bop/{case_id}/final/{i}"] = w
        cases[case_id] = {"kernel_quantizer": quantizer, "bop": arguments}
    out["bop/x"], out["bop/y"] = x, y
    return cases


def main(out_dir: str) -> None:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    out: dict = {}
    for name, build in MODELS.items():
        tf.keras.utils.set_random_seed(SEED)
        model = build()
        shape = (16, *model.input_shape[1:])
        x = np.random.default_rng(SEED).normal(size=shape).astype("float32")
        labels = np.arange(16) % 10
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=name == "scaled_quantizers"))
        model.fit(x, labels, batch_size=8, epochs=2, verbose=0)
        out[f"model/{name}/x"] = x
        out[f"model/{name}/y"] = model(x, training=False).numpy()
        model.save(out_dir / f"{name}.h5")
        if name != "mnist_tutorial":  # used for training further; one format is enough
            model.save(out_dir / f"{name}.keras")
            model.save(out_dir / f"{name}_savedmodel", save_format="tf")
    manifest = {"bop": bop_references(out),
                "larq": lq.__version__, "tensorflow": tf.__version__}
    np.savez(out_dir / "reference.npz", **out)
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
