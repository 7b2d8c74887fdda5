"""Folding a binary layer's batch normalization and sign into integers.

The batch normalization and sign after a product of ±1 operands, ``sign(BN(a + bias))``, is a
monotone decision on the integer ``a``, so it folds into one integer threshold per channel and
a flip for channels whose scale is negative (:func:`fold_sign_threshold`): a packed model's
hidden stages then do no float math at all. The same holds for a first layer's exact integer
products of 8-bit pixels (:func:`pixel_thresholds`). The logits' batch normalization folds into
one multiply-add per channel (:func:`logit_affine`).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from bnn.ops.bitpack import pack_bits

__all__ = ["fold_sign_threshold", "norm_arrays", "sign_thresholds", "pixel_thresholds",
           "logit_affine"]


def fold_sign_threshold(values: np.ndarray, positive: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Folds a per-channel monotone decision ``sign(f_c(a))`` over integers into a threshold.

    Args:
        values: ``(m,)`` increasing integers, every pre-activation value ``a`` that can occur.
        positive: ``(m, channels)`` bool, ``f_c(a) >= 0`` evaluated by the source model.

    Returns:
        ``(threshold, flip)``: int32 and bool ``(channels,)`` such that for every listed ``a``
        ``positive[a, c] == ((a >= threshold[c]) XOR flip[c])``. An increasing ``f_c``
        (gamma > 0) gives ``flip=False``; a decreasing one (gamma < 0) gives ``flip=True``.

    Raises:
        ValueError: if some channel's decision is not monotone in ``a`` (not a sign of an affine
            function), naming the channel.
    """
    values = np.asarray(values, np.int64)
    positive = np.asarray(positive, bool)
    thresholds = np.empty(positive.shape[1], np.int32)
    flips = np.zeros(positive.shape[1], bool)
    for c in range(positive.shape[1]):
        col = positive[:, c]
        for flip in (False, True):
            up = col ^ flip  # must be False...False True...True
            first = int(np.argmax(up)) if up.any() else len(up)
            if not up[first:].all():
                continue
            thresholds[c] = values[first] if first < len(up) else values[-1] + 1
            flips[c] = flip
            break
        else:
            raise ValueError(f"channel {c}: sign(batch_norm(a)) is not monotone in a, so it "
                             "cannot fold into a threshold")
    return thresholds, flips


def norm_arrays(bn) -> tuple[dict[str, np.ndarray], float]:
    """A batch normalization's moving statistics, scale and offset as float32 arrays (those it
    has), and its epsilon."""
    arrays = {"bn_mean": bn.moving_mean.numpy(), "bn_variance": bn.moving_variance.numpy()}
    if bn.scale:
        arrays["bn_gamma"] = bn.gamma.numpy()
    if bn.center:
        arrays["bn_beta"] = bn.beta.numpy()
    return {k: np.asarray(v, np.float32) for k, v in arrays.items()}, float(bn.epsilon)


def sign_thresholds(bn, bias, fan_in: int) -> dict[str, np.ndarray]:
    """Integer thresholds reproducing ``sign(BN(a + bias))`` of the source for every integer
    pre-activation ``a`` in ``[-fan_in, fan_in]``, evaluated with the same float32 ops.

    Raises:
        ValueError: where a channel's decision is not monotone (see :func:`fold_sign_threshold`).
    """
    values = np.arange(-fan_in, fan_in + 1)
    pre = np.broadcast_to(values.astype(np.float32)[:, None],
                          (len(values), bn.moving_mean.shape[0]))
    pre = tf.constant(pre)
    if bias is not None:
        pre = pre + bias
    norm, eps = norm_arrays(bn)
    y = tf.nn.batch_normalization(pre, norm["bn_mean"], norm["bn_variance"], norm.get("bn_beta"),
                                  norm.get("bn_gamma"), eps)
    threshold, flip = fold_sign_threshold(values, (y >= 0).numpy())
    return {"threshold": threshold, "flip": pack_bits(np.where(flip, 1.0, -1.0))}


def pixel_thresholds(bn, bias, kernel: np.ndarray,
                              encoding: dict[str, float]) -> dict[str, np.ndarray]:
    """Integer thresholds on ``z = u . w`` (uint8 pixels ``u``, ±1 kernel ``w`` (n, units))
    reproducing ``sign(BN(x . w + bias))`` for ``x = scale * u + offset``.

    The pre-activation is ``float32(scale * z + offset * sum(w))`` (float64, rounded once),
    plus ``bias``, then the source's float32 batch norm. Every step is monotone in ``z``, so per
    channel a bisection over ``[-255 n, 255 n]`` finds the first ``z`` whose sign differs from
    the sign at ``-255 n``: ``bit = (z >= threshold) XOR flip`` with ``flip`` that first sign.
    """
    n, units = kernel.shape
    col_sum = kernel.astype(np.float64).sum(axis=0)
    norm, eps = norm_arrays(bn)

    def positive(z: np.ndarray) -> np.ndarray:
        pre = (encoding["scale"] * z + encoding["offset"] * col_sum).astype(np.float32)
        if bias is not None:
            pre = pre + bias
        y = tf.nn.batch_normalization(pre[None], norm["bn_mean"], norm["bn_variance"],
                                      norm.get("bn_beta"), norm.get("bn_gamma"), eps)
        return (y >= 0).numpy()[0]

    low, high = np.full(units, -255 * n, np.int64), np.full(units, 255 * n + 1, np.int64)
    flip = positive(low)
    while (high - low > 1).any():  # positive(low) == flip; positive(high) != flip or past the end
        mid = (low + high) // 2
        changed = positive(mid) != flip
        low, high = np.where(changed, low, mid), np.where(changed, mid, high)
    return {"threshold": high.astype(np.int32), "flip": pack_bits(np.where(flip, 1.0, -1.0))}


def logit_affine(arrays: dict[str, np.ndarray], epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """Batch norm (and bias) of the logits as ``a * scale + shift`` per channel, folded in
    float64 and rounded once to float32: the bias commutes with max-pooling (it is the same
    across a window), so it folds into ``shift`` even when the stage pools."""
    var = np.asarray(arrays["bn_variance"], np.float64)
    scale = 1.0 / np.sqrt(var + float(epsilon))
    if "bn_gamma" in arrays:
        scale = scale * np.asarray(arrays["bn_gamma"], np.float64)
    shift = -np.asarray(arrays["bn_mean"], np.float64) * scale
    if "bn_beta" in arrays:
        shift = shift + np.asarray(arrays["bn_beta"], np.float64)
    if "bias" in arrays:
        shift = shift + np.asarray(arrays["bias"], np.float64) * scale
    return scale.astype(np.float32), shift.astype(np.float32)
