"""bnn's native kernels: framework-free C++ kernels (``src/core``, a plain reference kernel
beside each optimized one, with C++ tests in ``tests/``), thin TensorFlow op glue (``src/tf``),
the build that compiles and loads them (:mod:`~bnn.native.build`), the one module that decides
which kernel runs (:mod:`~bnn.native.dispatch`) and the ops' Python wrappers
(:mod:`~bnn.native.ops`). Nothing in bnn requires them: where they cannot be built, everything
runs on pure-TensorFlow kernels that give the same integers."""
