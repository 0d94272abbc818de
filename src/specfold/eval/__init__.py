"""Evaluation: benchmark tasks, exact scorers and the sandbox that runs untrusted code."""
