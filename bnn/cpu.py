"""What the CPU can do: its instruction-set flags, by which bnn picks the faster of two kernels."""

from __future__ import annotations

import functools
import platform

__all__ = ["flags", "is_x86"]


@functools.lru_cache(maxsize=1)
def flags() -> frozenset[str]:
    """The CPU's feature flags as Linux lists them in /proc/cpuinfo (``avx2``, ``avx512f``,
    ``avx512_vpopcntdq``, ...); empty where that file cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def is_x86() -> bool:
    """Whether this is an x86-64 machine."""
    return platform.machine().lower() in ("x86_64", "amd64")
