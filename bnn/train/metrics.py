"""Training diagnostics for binary networks: how many binary weights flip.

The flip ratio of a binary kernel between two moments is the fraction of its weights whose sign
changed, with :math:`\\mathrm{sign}(x) = +1` for :math:`x \\ge 0` and -1 otherwise. A healthy
binary network flips many weights early and few late (Helwegen et al. 2019 use it to choose Bop's
threshold); a ratio stuck at zero means the binary weights stopped learning.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
from keras import ops

from bnn.layers.walk import binary_kernel_layers

__all__ = ["FlipRatio", "flip_ratio"]

_EVERY = ("epoch", "batch")


def flip_ratio(before: Any, after: Any) -> float:
    """Fraction of entries whose sign differs between ``before`` and ``after`` (arrays or tensors
    of one shape; sign(x) = +1 for x >= 0): ``mean((before >= 0) != (after >= 0))``, in [0, 1].

    Raises:
        ValueError: when the shapes differ or the arrays are empty.
    """
    before, after = np.asarray(before), np.asarray(after)
    if before.shape != after.shape:
        raise ValueError(f"flip_ratio needs arrays of one shape, got {before.shape} and "
                         f"{after.shape}")
    if before.size == 0:
        raise ValueError("flip_ratio of empty arrays is undefined; pass at least one weight")
    return float(np.mean((before >= 0) != (after >= 0)))


class FlipRatio(keras.callbacks.Callback):
    """Keras callback: fraction of binary weights whose sign flipped since the last measurement.

    Watches the binary kernels of every layer (``layer.binary_kernels()``: the kernels a layer
    with ``quantized`` True binarizes). At each measurement it computes, for each such layer and overall (flips over
    all binary weights / number of binary weights), the fraction of signs that changed since the
    previous measurement (the first one compares with the weights at the start of training).

    * ``every="epoch"``: one measurement at the end of each epoch; nothing runs between.
    * ``every="batch"``: one measurement after each training batch, also written to the batch
      ``logs``; the epoch value is the mean over the epoch's batches.

    At each epoch end it writes ``flip_ratio`` and ``flip_ratio/<layer name>`` into the epoch
    ``logs``, so ``History`` and a ``keras.callbacks.TensorBoard`` placed *after* it in the
    callback list record them. Every measurement is appended to :attr:`history` as a dict with
    ``epoch``, ``batch`` (None for epoch measurements) and the ratios.

    Cost: one boolean sign snapshot per binary kernel, kept on the kernel's device; a measurement
    transfers one integer per output unit (kept in :attr:`unit_ratios`, which the trainer's
    TensorBoard histograms show).
    """

    def __init__(self, every: str = "epoch"):
        super().__init__()
        if every not in _EVERY:
            raise ValueError(f"FlipRatio every must be one of {_EVERY}, got {every!r}")
        self.every = every
        self.history: list[dict[str, Any]] = []
        self._layers: list = []
        self._signs: list = []
        self._epoch_values: list[dict[str, float]] = []
        self._epoch = 0
        #: ``{kernel path: ratios}``: for each output unit (the kernel's last axis) of each
        #: binary kernel, the fraction of its weights that flipped at the last measurement.
        self.unit_ratios: dict[str, np.ndarray] = {}
        if every == "batch":
            # Bound only in batch mode, so epoch mode leaves Keras' asynchronous batch dispatch on.
            self.on_train_batch_end = self._on_train_batch_end

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._layers = binary_kernel_layers(self.model)
        if not self._layers:
            raise ValueError(
                f"FlipRatio found no binary kernels in model {self.model.name!r} (no layer with "
                "quantized=True and a kernel_quantizer); remove the callback for float models"
            )
        self._signs = [[ops.greater_equal(kernel, 0) for kernel in layer.binary_kernels()]
                       for layer in self._layers]
        self._epoch_values = []

    def _measure(self) -> dict[str, float]:
        values, total_flips, total_size = {}, 0, 0
        for i, layer in enumerate(self._layers):
            flips, size = 0, 0
            for j, kernel in enumerate(layer.binary_kernels()):
                signs = ops.greater_equal(kernel, 0)
                flipped = ops.cast(ops.not_equal(signs, self._signs[i][j]), "int32")
                per_unit = ops.convert_to_numpy(
                    ops.sum(flipped, axis=tuple(range(len(kernel.shape) - 1))))
                self._signs[i][j] = signs
                flips += int(per_unit.sum())
                units = int(np.prod(kernel.shape[:-1]))
                self.unit_ratios[kernel.path] = per_unit / units
                size += units * int(kernel.shape[-1])
            values[f"flip_ratio/{layer.name}"] = flips / size
            total_flips, total_size = total_flips + flips, total_size + size
        return {"flip_ratio": total_flips / total_size, **values}

    def _on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        values = self._measure()
        self._epoch_values.append(values)
        self.history.append({"epoch": self._epoch, "batch": batch, **values})
        if logs is not None:
            logs.update(values)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._epoch = epoch
        self._epoch_values = []

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self.every == "epoch":
            values = self._measure()
            self.history.append({"epoch": epoch, "batch": None, **values})
        elif self._epoch_values:
            values = {key: float(np.mean([v[key] for v in self._epoch_values]))
                      for key in self._epoch_values[0]}
        else:
            return
        if logs is not None:
            logs.update(values)
