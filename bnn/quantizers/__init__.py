"""Quantizers: functions that map real values to a few levels, with a pseudo-gradient.

Each quantizer is a small pure function, a gradient override built with
:mod:`bnn.ops.gradients`, whose docstring gives the forward formula and the pseudo-gradient
(:mod:`~bnn.quantizers.sign`: two levels; :mod:`~bnn.quantizers.multibit`: more). Each also has
a tiny serializable class registered under a string name (:mod:`~bnn.quantizers.base`), so
layers and YAML files can say ``"ste_sign"``. Look a quantizer up with :func:`get`; add your own
with :func:`register`.
"""

from bnn.catalog import DOREFA_MODES
from bnn.quantizers.base import Quantizer, equivalent, get, names, register, serialize
from bnn.quantizers.multibit import DoReFa, NoOp, SteTern, dorefa, no_op, ste_tern
from bnn.quantizers.sign import (ApproxSign, MagnitudeAwareSign, SteHeaviside, SteSign,
                                 SwishSign, approx_sign, magnitude_aware_sign, ste_heaviside,
                                 ste_sign, swish_sign)

__all__ = ["Quantizer", "SteSign", "ApproxSign", "SwishSign", "MagnitudeAwareSign",
           "SteHeaviside", "SteTern", "DoReFa", "NoOp", "ste_sign", "approx_sign", "swish_sign",
           "magnitude_aware_sign", "ste_heaviside", "ste_tern", "dorefa", "no_op", "get",
           "serialize", "equivalent", "register", "names", "DOREFA_MODES"]
