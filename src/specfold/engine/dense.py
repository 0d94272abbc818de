"""Dense verification: one batched forward over every branch (the Spiffy baseline's cost model)."""

from __future__ import annotations

import torch

from specfold.engine.base import BatchBranches, BatchVerifyResult, VerifyResult
from specfold.engine.stats import FoldStats
from specfold.model.cache import PrefixCache
from specfold.model.transformer import DLLM


class DenseVerifier:
    def __init__(self, net: DLLM) -> None:
        self.net = net

    @torch.no_grad()
    def verify(
        self,
        cache: PrefixCache,
        states: torch.Tensor,  # [K, N]
        parents: torch.Tensor,  # [K] (unused: every row is computed in full)
    ) -> VerifyResult:
        raw = self.net(states, cache, mask="bidirectional")
        rows = states.shape[0] * states.shape[1]
        return VerifyResult(self.net.position_logits(raw), FoldStats(rows=rows))

    @torch.no_grad()
    def verify_batch(self, batch: BatchBranches) -> BatchVerifyResult:
        """Every request's real branches in one ragged forward; padding rows are never computed."""
        r, k, n = batch.states.shape
        full = all(b == k for b in batch.branches)
        raw = self.net.forward_ragged(batch.states, batch.cache, batch.slots, batch.lengths,
                                      valid=None if full else batch.valid)
        logits = self.net.position_logits(raw.reshape(-1, n, raw.shape[-1]))  # [B', N, V]
        stats = [FoldStats(rows=b * n) for b in batch.branches]
        return BatchVerifyResult(list(torch.split(logits, batch.branches)), stats)
