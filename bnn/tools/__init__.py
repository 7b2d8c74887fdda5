"""Tools on top of the library: train-step benchmarks (:mod:`~bnn.tools.benchmark`, its flags
in :mod:`~bnn.tools.benchmark_flags`, :mod:`~bnn.tools.step_phases`) and the report of a
``bnn compare`` run (:mod:`~bnn.tools.report`, :mod:`~bnn.tools.figures`). Importing the
package imports no TensorFlow."""
