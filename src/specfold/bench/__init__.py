"""specfold.bench."""
