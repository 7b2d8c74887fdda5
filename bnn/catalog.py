"""Every table of names bnn knows, without importing TensorFlow: precisions, datasets,
optimizers, schedules, losses, devices, mixed precisions, distribution strategies, kernel
variants, the architectures with their options and defaults, and the quantizers with their
arguments.

:mod:`bnn.train.config` validates experiment files against these tables, so the ``bnn`` command
can reject a mistake before it imports TensorFlow; the classes and builders read them too. The
architecture and quantizer tables describe the builders in :mod:`bnn.models` and the quantizer
classes in :mod:`bnn.quantizers`; ``tests/test_catalog.py`` checks that they agree with those
signatures, default for default.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PRECISIONS", "DATASETS", "OPTIMIZERS", "SCHEDULES", "LOSSES", "DEVICES",
           "MIXED_PRECISIONS", "POLICIES", "DISTRIBUTES", "KERNEL_VARIANTS", "CONV_GRADIENT_KERNELS",
           "DOREFA_MODES", "HISTOGRAMS", "MODEL_OPTIONS", "QUANTIZER_ARGUMENTS", "QUANTIZER_MINIMUMS",
           "QUANTIZER_CHOICES", "model_names", "quantizer_names"]

#: A binary layer or model (``"binary"``) or its float twin (``"float"``).
PRECISIONS: tuple[str, ...] = ("binary", "float")
#: The datasets :mod:`bnn.train.data` reads.
DATASETS: tuple[str, ...] = ("mnist", "fashion_mnist", "cifar10")
#: The optimizers :func:`bnn.optimizers.make_optimizer` builds by name.
OPTIMIZERS: tuple[str, ...] = ("adam", "sgd", "bop")
#: Learning-rate schedules (:class:`bnn.train.schedules.EpochSchedule`).
SCHEDULES: tuple[str, ...] = ("constant", "cosine", "exponential")
#: Losses (:func:`bnn.train.losses.get`).
LOSSES: tuple[str, ...] = ("crossentropy", "squared_hinge")
#: Where training runs.
DEVICES: tuple[str, ...] = ("auto", "cpu", "gpu")
#: Keras' dtype policy for each mixed-precision word an experiment or ``bnn bench`` uses.
POLICIES: dict[str, str] = {"off": "float32", "float16": "mixed_float16",
                            "bfloat16": "mixed_bfloat16"}
#: The mixed-precision words.
MIXED_PRECISIONS: tuple[str, ...] = tuple(POLICIES)
#: ``tf.distribute`` strategies (:mod:`bnn.train.runtime`).
DISTRIBUTES: tuple[str, ...] = ("none", "mirrored", "multi_worker")
#: The native kernels' instruction-set variants, from the most portable.
KERNEL_VARIANTS: tuple[str, ...] = ("generic", "avx2", "avx512")
#: Which kernels compute binary convolutions' gradients (``BNN_CONV_GRADIENTS``).
CONV_GRADIENT_KERNELS: tuple[str, ...] = ("xla", "patches", "tensorflow")
#: What :func:`bnn.quantizers.dorefa` quantizes.
DOREFA_MODES: tuple[str, ...] = ("activations", "weights")
#: Which weights the trainer's TensorBoard histograms show (:mod:`bnn.train.board`).
HISTOGRAMS: tuple[str, ...] = ("binary", "all")

_SHARED = {"input_quantizer": "ste_sign", "kernel_quantizer": "ste_sign", "momentum": 0.9,
           "epsilon": 1e-4, "float_activation": "relu", "synchronized_bn": False,
           "num_classes": 10}

#: ``{architecture: {option: default}}``: the keyword options of each builder in
#: :mod:`bnn.models` besides ``precision`` and ``name``.
MODEL_OPTIONS: dict[str, dict[str, Any]] = {
    "binarynet_mlp": {**_SHARED, "input_shape": (28, 28, 1), "hidden_units": (2048, 2048, 2048),
                      "dropout": 0.0},
    "vgg_small": {**_SHARED, "input_shape": (32, 32, 3),
                  "filters": (128, 128, 256, 256, 512, 512), "dense_units": (1024, 1024),
                  "real_first_layer": False},
    "binary_resnet": {**_SHARED, "input_shape": (32, 32, 3), "stages": (64, 128, 256, 512),
                      "blocks_per_stage": 2},
    "reactnet_resnet": {**_SHARED, "input_shape": (32, 32, 3), "stages": (64, 128, 256),
                        "blocks_per_stage": 2, "input_quantizer": "approx_sign",
                        "learnable_threshold": True, "rprelu": True},
    "keras_file": {"path": "", "input_shape": (28, 28, 1), "num_classes": 10,
                   "synchronized_bn": False},
}

#: ``{quantizer: {argument: default}}``: the constructor arguments of each quantizer class in
#: :mod:`bnn.quantizers`, by the name an experiment file uses.
QUANTIZER_ARGUMENTS: dict[str, dict[str, Any]] = {
    "ste_sign": {"clip_value": 1.0},
    "approx_sign": {},
    "swish_sign": {"beta": 5.0},
    "magnitude_aware_sign": {"clip_value": 1.0},
    "ste_heaviside": {"clip_value": 1.0},
    "ste_tern": {"threshold_value": 0.05, "ternary_weight_networks": False, "clip_value": 1.0,
                 "inclusive": False},
    "dorefa": {"k_bit": 2, "mode": "activations"},
    "no_op": {"precision": 1},
}

#: Arguments with a lower bound beyond their type: ``{(quantizer, argument): minimum}``.
QUANTIZER_MINIMUMS: dict[tuple[str, str], int] = {("dorefa", "k_bit"): 1,
                                                  ("no_op", "precision"): 1}

#: Arguments that take one of a few words: ``{(quantizer, argument): words}``.
QUANTIZER_CHOICES: dict[tuple[str, str], tuple[str, ...]] = {("dorefa", "mode"): DOREFA_MODES}


def model_names() -> list[str]:
    """The architectures :func:`bnn.models.build` knows, sorted."""
    return sorted(MODEL_OPTIONS)


def quantizer_names() -> list[str]:
    """The quantizer names :func:`bnn.quantizers.get` knows, sorted."""
    return sorted(QUANTIZER_ARGUMENTS)
