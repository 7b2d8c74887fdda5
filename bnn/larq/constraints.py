"""Larq's ``larq.constraints``: ``WeightClip`` (alias ``weight_clip``) on bnn's."""

from __future__ import annotations

from typing import Any

import keras

from bnn.layers import constraints as bc
from bnn.larq._saving import saves_as

__all__ = ["WeightClip", "weight_clip", "get"]


@saves_as(bc.WeightClip)
class WeightClip(bc.WeightClip):
    """Larq's ``WeightClip(clip_value=1)``: clips weights to ``[-clip_value, clip_value]`` after
    every optimizer step (:class:`bnn.layers.WeightClip`)."""

    def __init__(self, clip_value: float = 1):
        super().__init__(clip_value)


weight_clip = WeightClip


def get(identifier: Any) -> Any:
    """A constraint from ``"weight_clip"`` / ``"WeightClip"``, a Larq or Keras config dict, a
    constraint object or callable, or ``None``; anything else as ``keras.constraints.get``."""
    if isinstance(identifier, str) and identifier in ("weight_clip", "WeightClip"):
        return WeightClip()
    if isinstance(identifier, dict) and identifier.get("class_name") in (
            "weight_clip", "WeightClip") and not str(
            identifier.get("registered_name")).startswith("bnn"):
        return WeightClip(**(identifier.get("config") or {}))
    return keras.constraints.get(identifier)
