"""The ``BNN_*`` environment variables that choose kernels, read without importing TensorFlow.

Each reader returns the setting as one of its allowed words, ``"auto"`` when the variable is unset
or empty, and raises :class:`bnn.errors.SettingError` (one line naming the variable, its value and
the allowed ones) for anything else, so that a misspelt setting stops a run before it starts
instead of being ignored. What ``"auto"`` means is decided where the setting is used:

- ``BNN_PACKED_FORWARD``: ``on`` / ``off`` / ``auto``, whether binary layers compute their forward
  products by xor-popcount (:func:`bnn.bitops.packed_training_enabled`);
- ``BNN_CONV_GRADIENTS``: ``xla`` / ``patches`` / ``tensorflow`` / ``auto``, which kernels compute
  binary convolutions' gradients outside XLA-compiled models
  (:func:`bnn.bitops.conv_gradient_kernels`);
- ``BNN_NATIVE_KERNELS``: ``on`` / ``off`` / ``auto`` or a variant of :data:`KERNEL_VARIANTS`,
  whether and which native xor-popcount kernels packed models use (:mod:`bnn.kernels`).
"""

from __future__ import annotations

import os

from bnn.errors import SettingError

__all__ = ["KERNEL_VARIANTS", "packed_forward", "conv_gradients", "native_kernels", "check"]

#: The native kernels' instruction-set variants, from the most portable.
KERNEL_VARIANTS: tuple[str, ...] = ("generic", "avx2", "avx512")

_SWITCH = {"0": "off", "false": "off", "off": "off", "no": "off",
           "1": "on", "true": "on", "on": "on", "yes": "on", "auto": "auto"}


def _read(variable: str, words: dict[str, str], allowed: str) -> str:
    raw = os.environ.get(variable, "").strip().lower()
    if not raw:
        return "auto"
    if raw not in words:
        raise SettingError(f"{variable} must be {allowed}, got {raw!r}; unset it for the default")
    return words[raw]


def packed_forward() -> str:
    """``BNN_PACKED_FORWARD``: ``"on"`` (1, true, yes), ``"off"`` (0, false, no) or ``"auto"``."""
    return _read("BNN_PACKED_FORWARD", _SWITCH, "0, 1 or auto")


def conv_gradients() -> str:
    """``BNN_CONV_GRADIENTS``: ``"xla"``, ``"patches"``, ``"tensorflow"`` or ``"auto"``."""
    return _read("BNN_CONV_GRADIENTS", {w: w for w in ("xla", "patches", "tensorflow", "auto")},
                 "'auto', 'xla', 'patches' or 'tensorflow'")


def native_kernels() -> str:
    """``BNN_NATIVE_KERNELS``: ``"on"``, ``"off"``, ``"auto"`` or a variant of
    :data:`KERNEL_VARIANTS`."""
    return _read("BNN_NATIVE_KERNELS", {**_SWITCH, **{v: v for v in KERNEL_VARIANTS}},
                 f"auto, 0, 1, {', '.join(KERNEL_VARIANTS)}")


def check() -> None:
    """Reads every setting, raising :class:`SettingError` for the first unreadable one."""
    packed_forward()
    conv_gradients()
    native_kernels()
