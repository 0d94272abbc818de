"""specfold.model."""
