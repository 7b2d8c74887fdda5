"""Binary layers and what they are made with.

- :mod:`~bnn.layers.base`: the quantization every binary layer shares, and how a product runs;
- :mod:`~bnn.layers.dense`, :mod:`~bnn.layers.conv`: ``BinaryDense``, ``BinaryConv2D``,
  ``BinaryDepthwiseConv2D``, ``BinarySeparableConv2D``;
- :mod:`~bnn.layers.activations`: ReActNet's ``RSign`` and ``RPReLU``;
- :mod:`~bnn.layers.normalization`, :mod:`~bnn.layers.pooling`: Keras' ``BatchNormalization``
  and ``MaxPooling2D``, with faster training steps;
- :mod:`~bnn.layers.constraints`: ``WeightClip``, which keeps latent weights in range;
- :mod:`~bnn.layers.reversal`: ``GradientReversal``;
- :mod:`~bnn.layers.walk`: the one walk over a model's layers.
"""

from bnn.catalog import PRECISIONS
from bnn.layers.activations import RPReLU, RSign
from bnn.layers.constraints import WeightClip
from bnn.layers.conv import BinaryConv2D, BinaryDepthwiseConv2D, BinarySeparableConv2D
from bnn.layers.dense import BinaryDense
from bnn.layers.normalization import BatchNormalization
from bnn.layers.pooling import MaxPooling2D
from bnn.layers.reversal import GradientReversal

__all__ = ["BinaryDense", "BinaryConv2D", "BinaryDepthwiseConv2D", "BinarySeparableConv2D",
           "RSign", "RPReLU", "BatchNormalization", "MaxPooling2D", "WeightClip",
           "GradientReversal", "PRECISIONS"]
