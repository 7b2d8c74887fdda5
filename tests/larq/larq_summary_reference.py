"""What ``larq.models.summary`` prints for Larq's own example models, computed by Larq itself.

Larq needs tf-keras, so this script runs in its own environment and never imports bnn::

    TF_USE_LEGACY_KERAS=1 larq-env/bin/python tests/larq/larq_summary_reference.py OUT_DIR

Each example model is Python source (:data:`MODELS`) that uses ``tf`` and ``lq`` the way Larq's
documentation and tests do: with ``tf.keras`` being tf-keras and ``lq`` Larq here, Keras 3 and
``bnn.larq`` in ``tests/larq/test_larq_summary.py``, which imports this file for the sources
(importing it loads neither Larq nor TensorFlow). For each model OUT_DIR/summaries.json records what
``summary`` passed to ``print_fn`` (with and without ``include_macs``) and Larq's table and
summary cells (``ModelProfile.generate_table`` / ``generate_summary``, as strings). It also
records Larq's number and memory formats for a range of values, and the errors Larq raises.
"""

import json
import os
import sys
import textwrap

# The example models. The sources come from: Larq's MNIST and BinaryNet CIFAR-10 tutorials and
# the custom model of Larq Compute Engine's end-to-end guide (docs.larq.dev); the models of the
# Larq guides (key concepts, BNN architecture) and of the Larq documentation's front page; the
# models of Larq's own tests (larq/models_test.py); and a few more that reach every counting rule
# (multi-bit quantizers, 1-D layers, shared layers).
MODELS = {
    "mnist_tutorial": """
        kwargs = dict(input_quantizer="ste_sign",
                      kernel_quantizer="ste_sign",
                      kernel_constraint="weight_clip")
        model = tf.keras.models.Sequential()
        model.add(lq.layers.QuantConv2D(32, (3, 3),
                                        kernel_quantizer="ste_sign",
                                        kernel_constraint="weight_clip",
                                        use_bias=False,
                                        input_shape=(28, 28, 1)))
        model.add(tf.keras.layers.MaxPooling2D((2, 2)))
        model.add(tf.keras.layers.BatchNormalization(scale=False))
        model.add(lq.layers.QuantConv2D(64, (3, 3), use_bias=False, **kwargs))
        model.add(tf.keras.layers.MaxPooling2D((2, 2)))
        model.add(tf.keras.layers.BatchNormalization(scale=False))
        model.add(lq.layers.QuantConv2D(64, (3, 3), use_bias=False, **kwargs))
        model.add(tf.keras.layers.BatchNormalization(scale=False))
        model.add(tf.keras.layers.Flatten())
        model.add(lq.layers.QuantDense(64, use_bias=False, **kwargs))
        model.add(tf.keras.layers.BatchNormalization(scale=False))
        model.add(lq.layers.QuantDense(10, use_bias=False, **kwargs))
        model.add(tf.keras.layers.BatchNormalization(scale=False))
        model.add(tf.keras.layers.Activation("softmax"))
    """,
    "binarynet_cifar10": """
        kwargs = dict(input_quantizer="ste_sign",
                      kernel_quantizer="ste_sign",
                      kernel_constraint="weight_clip",
                      use_bias=False)
        model = tf.keras.models.Sequential([
            lq.layers.QuantConv2D(128, 3,
                                  kernel_quantizer="ste_sign",
                                  kernel_constraint="weight_clip",
                                  use_bias=False,
                                  input_shape=(32, 32, 3)),
            tf.keras.layers.BatchNormalization(momentum=0.999, scale=False),
            lq.layers.QuantConv2D(128, 3, padding="same", **kwargs),
            tf.keras.layers.MaxPool2D(pool_size=(2, 2), strides=(2, 2)),
            tf.keras.layers.BatchNormalization(momentum=0.999, scale=False),
            lq.layers.QuantConv2D(256, 3, padding="same", **kwargs),
            tf.keras.layers.BatchNormalization(momentum=0.999, scale=False),
            lq.layers.QuantConv2D(256, 3, padding="same", **kwargs),
            tf.keras.layers.MaxPool2D(pool_size=(2, 2), strides=(2, 2)),
            tf.keras.layers.BatchNormalization(momentum=0.999, scale=False),
            lq.layers.QuantConv2D(512, 3, padding="same", **kwargs),
            tf.keras.layers.BatchNormalization(momentum=0.999, scale=False),
            lq.layers.QuantConv2D(512, 3, padding="same", **kwargs),
            tf.keras.layers.MaxPool2D(pool_size=(2, 2), strides=(2, 2)),
            tf.keras.layers.BatchNormalization(momentum=0.999, scale=False),
            tf.keras.layers.Flatten(),
            lq.layers.QuantDense(1024, **kwargs),
            tf.keras.layers.BatchNormalization(momentum=0.999, scale=False),
            lq.layers.QuantDense(1024, **kwargs),
            tf.keras.layers.BatchNormalization(momentum=0.999, scale=False),
            lq.layers.QuantDense(10, **kwargs),
            tf.keras.layers.BatchNormalization(momentum=0.999, scale=False),
            tf.keras.layers.Activation("softmax")
        ])
    """,
    "lce_custom_model": """
        model = tf.keras.models.Sequential(
            [
                tf.keras.layers.Input((32, 32, 3), name="input"),
                tf.keras.layers.Conv2D(32, kernel_size=(5, 5), padding="same", strides=3),
                tf.keras.layers.BatchNormalization(),
                lq.layers.QuantConv2D(
                    32, kernel_size=(3, 3), padding="same", strides=2,
                    input_quantizer="ste_sign", kernel_quantizer="ste_sign",
                    kernel_constraint="weight_clip", use_bias=False),
                tf.keras.layers.BatchNormalization(),
                tf.keras.layers.Activation("relu"),
                lq.layers.QuantConv2D(
                    64, kernel_size=(3, 3), padding="same", strides=2,
                    input_quantizer="ste_sign", kernel_quantizer="ste_sign",
                    kernel_constraint="weight_clip", use_bias=False),
                tf.keras.layers.BatchNormalization(),
                tf.keras.layers.Activation("relu"),
                tf.keras.layers.GlobalAveragePooling2D(),
                tf.keras.layers.Dense(10, activation="softmax"),
            ]
        )
    """,
    "guide_real_valued_quant_dense": """
        model = tf.keras.models.Sequential(
            [
                tf.keras.layers.Flatten(),
                larq.layers.QuantDense(512, activation="relu"),
                larq.layers.QuantDense(10, activation="softmax"),
            ]
        )
        model.build((None, 28, 28, 1))
    """,
    "guide_float_dense": """
        model = tf.keras.models.Sequential(
            [
                tf.keras.layers.Flatten(),
                tf.keras.layers.Dense(512, activation="relu"),
                tf.keras.layers.Dense(10, activation="softmax"),
            ]
        )
        model.build((None, 28, 28, 1))
    """,
    "guide_binary_kernels_real_inputs": """
        model = tf.keras.models.Sequential(
            [
                tf.keras.layers.Flatten(),
                larq.layers.QuantDense(
                    512, kernel_quantizer="ste_sign", kernel_constraint="weight_clip"
                ),
                larq.layers.QuantDense(
                    10,
                    input_quantizer=None,
                    kernel_quantizer="ste_sign",
                    kernel_constraint="weight_clip",
                    activation="softmax",
                ),
            ]
        )
        model.build((None, 28, 28, 1))
    """,
    "guide_binary_inputs_real_kernels": """
        model = tf.keras.models.Sequential(
            [
                tf.keras.layers.Flatten(),
                larq.layers.QuantDense(512, kernel_quantizer=None, kernel_constraint=None),
                larq.layers.QuantDense(
                    10,
                    input_quantizer="ste_sign",
                    kernel_quantizer=None,
                    kernel_constraint=None,
                    activation="softmax",
                ),
            ]
        )
        model.build((None, 28, 28, 1))
    """,
    "guide_binarized": """
        model = tf.keras.models.Sequential(
            [
                tf.keras.layers.Flatten(),
                larq.layers.QuantDense(
                    512, kernel_quantizer="ste_sign", kernel_constraint="weight_clip"
                ),
                larq.layers.QuantDense(
                    10,
                    input_quantizer="ste_sign",
                    kernel_quantizer="ste_sign",
                    kernel_constraint="weight_clip",
                    activation="softmax",
                ),
            ]
        )
        model.build((None, 28, 28, 1))
    """,
    "guide_custom_input_quantizer": """
        @tf.custom_gradient
        def identity_sign(x):
            def grad(dy):
                return dy

            return tf.sign(x), grad

        model = tf.keras.models.Sequential([
            tf.keras.layers.Flatten(input_shape=(8, 8)),
            larq.layers.QuantDense(10, input_quantizer=identity_sign,
                                   kernel_quantizer="ste_sign"),
        ])
    """,
    "guide_custom_quantizers": """
        @tf.custom_gradient
        def identity_sign(x):
            def grad(dy):
                return dy

            return tf.sign(x), grad

        model = tf.keras.models.Sequential([
            tf.keras.layers.Flatten(input_shape=(8, 8)),
            larq.layers.QuantDense(
                10, input_quantizer=identity_sign, kernel_quantizer=identity_sign
            ),
        ])
    """,
    "guide_shortcut_blocks": """
        def conv_with_shortcut(x):
            filters = x.get_shape().as_list()[-1]
            shortcut = x
            x = larq.layers.QuantConv2D(
                filters=filters,
                kernel_size=3,
                padding="same",
                input_quantizer=larq.quantizers.SteSign(clip_value=1.0),
                kernel_quantizer=larq.quantizers.SteSign(clip_value=1.0),
                kernel_initializer="glorot_normal",
                kernel_constraint=larq.constraints.WeightClip(clip_value=1.0),
                use_bias=False,
            )(x)
            x = tf.keras.layers.BatchNormalization(momentum=0.9)(x)
            out = tf.keras.layers.add([x, shortcut])
            return out

        x_in = tf.keras.Input((16, 16, 64))
        x = conv_with_shortcut(x_in)
        x = larq.layers.QuantConv2D(
            filters=512,
            kernel_size=3,
            padding="same",
            input_quantizer=larq.quantizers.SteSign(clip_value=1.0),
            kernel_quantizer=larq.quantizers.SteSign(clip_value=1.0),
            kernel_constraint=larq.constraints.WeightClip(clip_value=1.0),
            use_bias=False,
        )(x)
        x = tf.keras.layers.MaxPool2D(pool_size=3, strides=2)(x)
        x = tf.keras.layers.BatchNormalization(momentum=0.9)(x)
        x = tf.keras.layers.Flatten()(x)
        x_out = larq.layers.QuantDense(
            units=1024,
            input_quantizer=larq.quantizers.SteSign(clip_value=1.0),
            kernel_quantizer=larq.quantizers.SteSign(clip_value=1.0),
            kernel_constraint=larq.constraints.WeightClip(clip_value=1.0),
        )(x)
        model = tf.keras.Model(x_in, x_out)
    """,
    "index_functional": """
        x = tf.keras.Input(shape=(28, 28, 1))
        y = tf.keras.layers.Flatten()(x)
        y = larq.layers.QuantDense(
            512, kernel_quantizer="ste_sign", kernel_constraint="weight_clip"
        )(y)
        y = larq.layers.QuantDense(
            10,
            input_quantizer="ste_sign",
            kernel_quantizer="ste_sign",
            kernel_constraint="weight_clip",
            activation="softmax",
        )(y)
        model = tf.keras.Model(inputs=x, outputs=y)
    """,
    "index_subclassed": """
        class MyModel(tf.keras.Model):
            def __init__(self):
                super().__init__()
                self.flatten = tf.keras.layers.Flatten()
                self.dense1 = larq.layers.QuantDense(
                    512, kernel_quantizer="ste_sign", kernel_constraint="weight_clip"
                )
                self.dense2 = larq.layers.QuantDense(
                    10,
                    input_quantizer="ste_sign",
                    kernel_quantizer="ste_sign",
                    kernel_constraint="weight_clip",
                    activation="softmax",
                )

            def call(self, inputs):
                x = self.flatten(inputs)
                x = self.dense1(x)
                return self.dense2(x)


        model = MyModel()
        model.build((None, 28, 28, 1))
    """,
    "larq_test_profile_model": """
        def get_profile_model():
            return tf.keras.models.Sequential(
                [
                    lq.layers.QuantConv2D(
                        filters=32,
                        kernel_size=(3, 3),
                        kernel_quantizer="ste_sign",
                        input_shape=(64, 64, 1),
                        padding="same",
                    ),
                    tf.keras.layers.MaxPooling2D((2, 2)),
                    lq.layers.QuantDepthwiseConv2D(
                        kernel_size=3,
                        strides=(3, 3),
                        input_quantizer=lq.quantizers.SteTern(),
                        depthwise_quantizer=lq.quantizers.SteTern(),
                        padding="same",
                        pad_values=1.0,
                        use_bias=False,
                    ),
                    tf.keras.layers.BatchNormalization(scale=False),
                    lq.layers.QuantSeparableConv2D(
                        32,
                        (3, 3),
                        input_quantizer="ste_sign",
                        depthwise_quantizer="ste_sign",
                        pointwise_quantizer="ste_sign",
                        padding="same",
                    ),
                    tf.keras.layers.Flatten(),
                    tf.keras.layers.Dense(10, trainable=False),
                ],
            )

        model = get_profile_model()
    """,
    "larq_test_submodel": """
        def get_profile_model():
            return tf.keras.models.Sequential(
                [
                    lq.layers.QuantConv2D(
                        filters=32,
                        kernel_size=(3, 3),
                        kernel_quantizer="ste_sign",
                        input_shape=(64, 64, 1),
                        padding="same",
                    ),
                    tf.keras.layers.MaxPooling2D((2, 2)),
                    lq.layers.QuantDepthwiseConv2D(
                        kernel_size=3,
                        strides=(3, 3),
                        input_quantizer=lq.quantizers.SteTern(),
                        depthwise_quantizer=lq.quantizers.SteTern(),
                        padding="same",
                        pad_values=1.0,
                        use_bias=False,
                    ),
                    tf.keras.layers.BatchNormalization(scale=False),
                    lq.layers.QuantSeparableConv2D(
                        32,
                        (3, 3),
                        input_quantizer="ste_sign",
                        depthwise_quantizer="ste_sign",
                        pointwise_quantizer="ste_sign",
                        padding="same",
                    ),
                    tf.keras.layers.Flatten(),
                    tf.keras.layers.Dense(10, trainable=False),
                ],
            )

        def get_submodel_profile_model(start_index=2, end_index=5):
            model = get_profile_model()
            submodel = tf.keras.models.Sequential(
                [layer for layer in model.layers[start_index:end_index]],
            )
            return tf.keras.models.Sequential(
                [*model.layers[:start_index], submodel, *model.layers[end_index:]]
            )

        model = get_submodel_profile_model()
    """,
    "larq_test_subclass_model": """
        class ToyModel(tf.keras.Model):
            def __init__(self, **kwargs):
                super().__init__(**kwargs)
                self.conv = lq.layers.QuantConv2D(
                    filters=32,
                    kernel_size=(3, 3),
                    kernel_quantizer="ste_sign",
                    input_shape=(64, 64, 1),
                    padding="same",
                )
                self.pool = tf.keras.layers.GlobalAvgPool2D()
                self.dense = tf.keras.layers.Dense(10, activation="softmax")

            def call(self, inputs):
                return self.dense(self.pool(self.conv(inputs)))

        model = ToyModel()
        model.build((None, 32, 32, 3))
    """,
    "larq_test_functional_model": """
        input = tf.keras.Input((32, 32, 3))
        x = lq.layers.QuantConv2D(
            filters=32,
            kernel_size=(3, 3),
            kernel_quantizer="ste_sign",
            padding="same",
        )(input)
        y, z = tf.split(x, 2, axis=-1)
        x = tf.concat([y, z], axis=-1)
        model = tf.keras.Model(input, x, name="toy_model")
    """,
    "larq_test_model_without_weights": """
        model = tf.keras.models.Sequential(
            [tf.keras.layers.Lambda(lambda x: tf.zeros(2), input_shape=(32, 32))]
        )
    """,
    "multibit_quantizers": """
        x_in = tf.keras.Input((12, 12, 3))
        x = lq.layers.QuantConv2D(
            8, 3, kernel_quantizer=lq.quantizers.DoReFa(k_bit=4, mode="weights"),
            input_quantizer=lq.quantizers.DoReFa(k_bit=4), use_bias=False)(x_in)
        x = tf.keras.layers.BatchNormalization(center=False)(x)
        x = lq.layers.QuantConv2D(
            8, 3, padding="same", input_quantizer="ste_sign", kernel_quantizer="ste_tern",
            kernel_constraint="weight_clip")(x)
        x = tf.keras.layers.BatchNormalization(center=False, scale=False)(x)
        x = lq.layers.QuantDepthwiseConv2D(
            3, depth_multiplier=2, input_quantizer="ste_heaviside",
            depthwise_quantizer="magnitude_aware_sign", depthwise_constraint="weight_clip")(x)
        x = tf.keras.layers.AveragePooling2D(2)(x)
        x = lq.layers.QuantSeparableConv2D(
            12, 3, padding="same", input_quantizer="approx_sign",
            depthwise_quantizer=lq.quantizers.SteTern(threshold_value=0.1),
            pointwise_quantizer="swish_sign", pointwise_constraint="weight_clip")(x)
        x = tf.keras.layers.DepthwiseConv2D(3, padding="same")(x)
        x = tf.keras.layers.SeparableConv2D(6, 3)(x)
        x = tf.keras.layers.Dropout(0.1)(x)
        x = tf.keras.layers.Flatten()(x)
        x = lq.layers.QuantDense(
            16, kernel_quantizer=lq.quantizers.NoOp(precision=1),
            input_quantizer=lq.quantizers.DoReFa(k_bit=8))(x)
        x = lq.layers.QuantDense(
            10, kernel_quantizer=lq.quantizers.DoReFa(k_bit=2, mode="weights"),
            input_quantizer="ste_tern", use_bias=False)(x)
        model = tf.keras.Model(x_in, x, name="multibit")
    """,
    "keras_1d_layers": """
        model = tf.keras.models.Sequential(
            [
                tf.keras.layers.Conv1D(8, 3, input_shape=(32, 6), padding="same"),
                tf.keras.layers.MaxPooling1D(2),
                tf.keras.layers.SeparableConv1D(16, 3, padding="same"),
                tf.keras.layers.AveragePooling1D(2),
                tf.keras.layers.BatchNormalization(),
                tf.keras.layers.Dense(4),
                tf.keras.layers.Flatten(),
                tf.keras.layers.Dense(10, trainable=False),
            ]
        )
    """,
    "keras_other_layers": """
        model = tf.keras.models.Sequential(
            [
                tf.keras.Input((8, 8, 3)),
                tf.keras.layers.Conv2DTranspose(4, 3, strides=2),
                tf.keras.layers.UpSampling2D(),
                tf.keras.layers.ZeroPadding2D(),
                tf.keras.layers.GlobalMaxPooling2D(),
                tf.keras.layers.Reshape((4, 1)),
                tf.keras.layers.Conv1DTranspose(2, 3),
                tf.keras.layers.LayerNormalization(),
                tf.keras.layers.Flatten(),
                tf.keras.layers.Dense(3, use_bias=False),
            ]
        )
    """,
    "shared_layers": """
        a = tf.keras.Input((8,))
        b = tf.keras.Input((3, 8))
        dense = tf.keras.layers.Dense(5, name="shared_dense")
        conv = lq.layers.QuantConv2D(4, 3, padding="same", input_quantizer="ste_sign",
                                     kernel_quantizer="ste_sign", name="shared_conv")
        c = tf.keras.Input((6, 6, 4))
        y = conv(conv(c))
        y = tf.keras.layers.Flatten()(y)
        out = tf.keras.layers.concatenate([dense(a), tf.keras.layers.Flatten()(dense(b)), y])
        model = tf.keras.Model([a, b, c], out, name="shared")
    """,
}

#: The numbers whose Larq formats (parameter counts, memory) the test compares.
NUMBERS = [0, 1, 7, 12.5, 999, 999.4, 999.5, 1000, 1234, 7700, 9995, 99949, 99950, 468_000,
           999_000, 999_499, 999_500, 1_000_000, 2_599_552, 10_352_000, 514_071_680, 1.2e9,
           9.99e11, 1e12, 4.4e14, 9.99e14, 9.995e14, 1e15, 1e16, 12_345_678_901_234_567]
MEMORY_BITS = [0, 1, 8, 1000, 8191, 8192, 8 * 1023.995 * 1024, 8 * 1024 * 1024,
               103_960_000, 8 * 1024**3, 8 * 1024**3 * 2000]


def source(name: str) -> str:
    """The source of the example model ``name``, dedented."""
    return textwrap.dedent(MODELS[name])


def main(out_dir: str) -> None:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import larq as lq
    import tensorflow as tf
    from larq import models as lq_models
    from larq import utils as lq_utils

    def cells(rows):
        return [[str(c) for c in row] for row in lq_models.sanitize_table(rows)]

    cases = {}
    for name in MODELS:
        tf.keras.backend.clear_session()
        tf.keras.utils.set_random_seed(0)
        scope = {"tf": tf, "lq": lq, "larq": lq}
        try:
            exec(source(name), scope)
            model = scope["model"]
            printed, printed_without_macs = [], []
            lq.models.summary(model, print_fn=printed.append)
            lq.models.summary(model, print_fn=printed_without_macs.append, include_macs=False)
            profile = lq_models.ModelProfile(model)
            cases[name] = {
                "printed": printed, "printed_without_macs": printed_without_macs,
                "title": model.name, "table": cells(profile.generate_table()),
                "summary": cells(profile.generate_summary()),
                "summary_without_macs": cells(profile.generate_summary(include_macs=False)),
            }
        except Exception as error:  # noqa: BLE001  what Larq does is what is recorded
            cases[name] = {"error": f"{type(error).__name__}: {error}"}

    errors = {}
    for name, build in {"unbuilt_model": lambda: tf.keras.Model(),
                        "unbuilt_sequential": lambda: tf.keras.Sequential(
                            [lq.layers.QuantDense(3)])}.items():
        try:
            lq.models.summary(build())
            errors[name] = None
        except Exception as error:  # noqa: BLE001
            errors[name] = type(error).__name__

    reference = {
        "larq": lq.__version__, "tensorflow": tf.__version__, "cases": cases, "errors": errors,
        "numbers": [[n, lq_models._number_as_readable_str(n)] for n in NUMBERS],
        "memory": [[n, lq_utils.memory_as_readable_str(n)] for n in MEMORY_BITS],
    }
    with open(os.path.join(out_dir, "summaries.json"), "w") as f:
        json.dump(reference, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
