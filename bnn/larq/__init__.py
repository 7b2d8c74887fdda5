"""Larq's API on Keras 3: ``import bnn.larq as lq`` runs Larq model code on bnn.

Larq (https://larq.dev) needs tf-keras; this package gives its public names, arguments and
documented semantics on bnn's own layers, quantizers and optimizers, so Larq code runs on
current TensorFlow with the import line changed. :mod:`bnn.larq.convert` turns models saved by
Larq into Keras 3 ``.keras`` models. Names, the import change and the known differences:
``docs/migrating-from-larq.md``.

``bnn.larq.convert(path)`` (from :mod:`bnn.larq.conversion`) reads a model saved by Larq and
returns the Keras 3 bnn model with the same weights and outputs; ``bnn import-larq MODEL -o
model.keras`` does the same from the command line.

Importing this package registers Larq's names with Keras (:mod:`bnn.larq.keras_names`):
``kernel_constraint="weight_clip"``, ``activation="leaky_tanh"``, ``keras.optimizers.get("Bop")``,
``keras.metrics.get("flip_ratio")`` and configs that name Larq's classes resolve, as with Larq.

Layers built through ``bnn.larq``, and the quantizers in them, are saved as the bnn classes they
map to (``QuantDense`` as :class:`bnn.layers.BinaryDense`, its ``SteSign`` as
:class:`bnn.quantizers.SteSign`, ...), so a saved model loads after ``import bnn`` alone. The
quantizers are Keras layers, as in Larq; one used as a model layer of its own is saved as
``bnn.larq``'s class.
"""

from bnn.larq import (activations, callbacks, constraints, context, conversion, layers, math,
                      metrics, models, optimizers, quantizers)
from bnn.larq import keras_names  # noqa: F401  (registers Larq's names with Keras)
from bnn.larq.conversion import ConversionError, convert

__all__ = ["activations", "callbacks", "constraints", "context", "conversion", "layers", "math",
           "metrics", "models", "optimizers", "quantizers", "convert", "ConversionError"]
