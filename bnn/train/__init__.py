"""Training from experiment files: the validated config (:mod:`~bnn.train.config`, no
TensorFlow), the data (:mod:`~bnn.train.data`), which twins to train (:mod:`~bnn.train.twins`),
the runtime (:mod:`~bnn.train.runtime`), losses and schedules, distillation
(:mod:`~bnn.train.distill`, :mod:`~bnn.train.fitting`), callbacks and metrics, the run
directory (:mod:`~bnn.train.rundir`) and the trainer itself (:mod:`~bnn.train.trainer`).
Importing the package imports no TensorFlow."""
