"""TensorFlow ops that bnn's layers are made of, with no Keras layer among them: the
custom-gradient toolkit (:mod:`~bnn.ops.gradients`), the sign (:mod:`~bnn.ops.sign`), the one
bit layout (:mod:`~bnn.ops.bitpack`), exact ±1 products by xor-popcount (:mod:`~bnn.ops.xnor`),
fused elementwise work (:mod:`~bnn.ops.fused`) and the XLA helpers they share
(:mod:`~bnn.ops.xla`)."""
