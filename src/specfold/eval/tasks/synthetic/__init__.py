"""Synthetic task suite (math, code, instruction following) for training and testing the embedded DLLM.

See :mod:`specfold.eval.tasks.synthetic.suite` for the splits and the scoring entry point.
"""

from specfold.eval.tasks.synthetic.suite import (
    SPLITS,
    TASKS,
    Sample,
    iter_train,
    load_split,
    score,
    split_of,
)

__all__ = ["SPLITS", "TASKS", "Sample", "iter_train", "load_split", "score", "split_of"]
