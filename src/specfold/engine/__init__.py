"""Verification executors: one forward over ``B+1`` block states sharing a prefix cache, behind one interface."""

from specfold.engine.base import Verifier, VerifyResult
from specfold.engine.dense import DenseVerifier

__all__ = ["DenseVerifier", "Verifier", "VerifyResult"]
