"""Verification executors: one forward over ``B+1`` block states sharing a prefix cache, behind one interface.

``DenseVerifier`` computes every row (the Spiffy baseline); ``FoldedVerifier`` folds draft rows into their
ancestors where the relative residual is small (SpecFold).
"""

from specfold.engine.base import Verifier, VerifyResult
from specfold.engine.dense import DenseVerifier
from specfold.engine.folded import FoldedVerifier
from specfold.engine.stats import FoldStats

__all__ = ["DenseVerifier", "FoldStats", "FoldedVerifier", "Verifier", "VerifyResult"]
