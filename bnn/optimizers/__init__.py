"""Optimizers for binary networks.

* :class:`Adam` (:mod:`~bnn.optimizers.adam`) is ``keras.optimizers.Adam`` whose dense updates
  run as one fused kernel: the same update, several times fewer passes over the weights
  without XLA, and binary layers' latent kernels updated and clipped in one pass.
* :class:`Bop` (:mod:`~bnn.optimizers.bop`, Helwegen et al. 2019) flips binary weights instead
  of taking gradient steps on latent weights.
* :class:`CaseOptimizer` (:mod:`~bnn.optimizers.case`) sends each variable to the first
  optimizer whose predicate accepts it and every other variable to a default optimizer, so Bop
  trains the binary kernels while Adam trains batch normalization, biases and float layers,
  all under one ``model.compile``.
* :func:`make_optimizer` (:mod:`~bnn.optimizers.factory`) builds ``"adam"``, ``"sgd"`` or
  ``"bop"`` (routed Bop + Adam) by name.
"""

from bnn.catalog import OPTIMIZERS
from bnn.layers.walk import binary_kernel_layers
from bnn.optimizers.adam import Adam
from bnn.optimizers.bop import Bop
from bnn.optimizers.case import CaseOptimizer, VariablePaths, is_binary_variable_of
from bnn.optimizers.factory import make_optimizer

__all__ = ["Adam", "Bop", "CaseOptimizer", "VariablePaths", "binary_kernel_layers",
           "is_binary_variable_of", "make_optimizer", "OPTIMIZERS"]
