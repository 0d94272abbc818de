"""specfold.engine.kernels."""
