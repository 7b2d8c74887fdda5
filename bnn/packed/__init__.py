"""Packed inference: a trained binary model described as stages (:mod:`~bnn.packed.stages`,
with batch norm and sign folded into integer thresholds by :mod:`~bnn.packed.fold`), run by
:class:`~bnn.packed.model.PackedModel` (each stage in :mod:`~bnn.packed.runtime`), stored in
``.bnn`` files (:mod:`~bnn.packed.format`), exported, loaded and timed for users
(:mod:`~bnn.packed.export`, :mod:`~bnn.packed.throughput`)."""
