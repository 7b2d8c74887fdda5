"""TensorFlow's CPU memory allocator: bnn's runs select the pooling one.

TensorFlow's default CPU allocator passes every request to the C library, which on Linux maps
fresh pages for each block above 32 MiB and unmaps them when the block is freed. An XLA-compiled
train step takes its scratch memory as one block per call, so a step whose scratch is larger than
that page-faults through all of it on every step: the BinaryNet MLP's binary step (batch 100,
62 MiB of scratch) spent about a third of its time there on a 2-core CPU, about 15 000 page faults
per step, one per 4 KiB page of the block. TensorFlow's BFC allocator keeps freed blocks for
reuse instead.

:func:`select_pooling_allocator` selects it by setting ``TF_CPU_ALLOCATOR_USE_BFC=true`` unless
that variable is already set (``TF_CPU_ALLOCATOR_USE_BFC=false`` keeps TensorFlow's default).
Every ``bnn`` command that runs TensorFlow calls it, and so do the scripts in ``benchmarks/``;
importing bnn does not (a library import changes no process-wide setting). In your own training
script, call it before TensorFlow's first operation::

    import bnn
    bnn.allocator.select_pooling_allocator()

TensorFlow reads the variable once, when it first allocates CPU memory: importing TensorFlow
first is fine, but a process that has already run TensorFlow operations keeps the allocator it
started with. Subprocesses inherit the setting, so a benchmark's reference process runs with the
same allocator as bnn's.
"""

from __future__ import annotations

import os

__all__ = ["ENV_VAR", "select_pooling_allocator", "allocator_name"]

ENV_VAR = "TF_CPU_ALLOCATOR_USE_BFC"


def select_pooling_allocator() -> None:
    """Sets ``TF_CPU_ALLOCATOR_USE_BFC=true`` unless it is set already."""
    os.environ.setdefault(ENV_VAR, "true")


def allocator_name() -> str:
    """``"bfc"`` or ``"default"``: the CPU allocator the variable asks TensorFlow for (as
    TensorFlow parses it: true/1 or false/0, any case)."""
    value = os.environ.get(ENV_VAR, "").strip().lower()
    return "bfc" if value in ("true", "1") else "default"
