"""bnn: binarized neural networks on TensorFlow with Keras 3.

Importing bnn registers every layer, quantizer, constraint, optimizer, loss and schedule with
Keras, so ``keras.models.load_model`` reads bnn models without ``custom_objects``. It also
selects TensorFlow's pooling CPU allocator (see :mod:`bnn.allocator`).
"""

from bnn import allocator

allocator.select_pooling_allocator()  # before TensorFlow's first CPU allocation; see bnn.allocator

from bnn import (constraints, gradients, layers, losses, metrics, models, normalization,
                 optimizers, pooling, quantizers, schedules)
from bnn.constraints import WeightClip
from bnn.gradients import GradientReversal, custom_gradient, reverse_gradient, straight_through
from bnn.layers import BinaryConv2D, BinaryDense
from bnn.quantizers import ste_sign

__version__ = "0.1.0"

__all__ = [
    "allocator", "constraints", "gradients", "layers", "losses", "metrics", "models",
    "normalization", "optimizers", "pooling", "quantizers", "schedules",
    "WeightClip", "GradientReversal", "custom_gradient", "reverse_gradient", "straight_through",
    "BinaryConv2D", "BinaryDense", "ste_sign", "__version__",
]
