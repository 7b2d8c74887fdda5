"""What the CPU can do: its instruction-set flags, by which bnn picks the faster of two kernels."""

from __future__ import annotations

import functools
import platform

__all__ = ["flags", "model_name", "is_x86"]


def _cpuinfo_field(name: str) -> str | None:
    """The first ``name`` field of Linux's /proc/cpuinfo; None where it cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(name):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


@functools.lru_cache(maxsize=1)
def flags() -> frozenset[str]:
    """The CPU's feature flags as Linux lists them in /proc/cpuinfo (``avx2``, ``avx512f``,
    ``avx512_vpopcntdq``, ...); empty where that file cannot be read."""
    return frozenset((_cpuinfo_field("flags") or "").split())


def model_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what the platform module reports."""
    return _cpuinfo_field("model name") or platform.processor() or platform.machine()


def is_x86() -> bool:
    """Whether this is an x86-64 machine."""
    return platform.machine().lower() in ("x86_64", "amd64")
