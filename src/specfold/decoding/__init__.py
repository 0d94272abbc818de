"""specfold.decoding."""
