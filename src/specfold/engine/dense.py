"""Dense verification: one batched forward over every branch (the Spiffy baseline's cost model)."""

from __future__ import annotations

import torch

from specfold.engine.base import BatchBranches, BatchVerifyResult, VerifyResult, window_head, window_logits
from specfold.engine.stats import FoldStats
from specfold.model.cache import PrefixCache
from specfold.model.transformer import DLLM


class DenseVerifier:
    """``compile``: run the forwards through :func:`specfold.engine.compiled.compiled_forwards` (shared per model);
    the statistics then carry the compile seconds and graphs of each pass."""

    def __init__(self, net: DLLM, compile: bool = False) -> None:
        self.net = net
        self.compiled = None
        if compile:
            from specfold.engine.compiled import compiled_forwards

            self.compiled = compiled_forwards(net)

    @torch.no_grad()
    def verify(
        self,
        cache: PrefixCache,
        states: torch.Tensor,  # [K, N] (or [K, W]: a window, with rows)
        parents: torch.Tensor,  # [K] (unused: every row is computed in full)
        rows: slice | None = None,  # a window's rows whose logits are returned
    ) -> VerifyResult:
        if rows is not None:
            raw = self.net(states, cache, mask="bidirectional", logit_rows=window_head(rows), start=cache.start)
            return VerifyResult(window_logits(self.net, raw, rows), FoldStats(rows=states.numel()))
        rows = states.shape[0] * states.shape[1]
        if self.compiled is None:
            raw = self.net(states, cache, mask="bidirectional")
            return VerifyResult(self.net.position_logits(raw), FoldStats(rows=rows))
        raw, seconds, graphs = self.compiled.forward(states, cache, mask="bidirectional")
        stats = FoldStats(rows=rows, compile_seconds=seconds, compiled_graphs=graphs)
        return VerifyResult(self.net.position_logits(raw), stats)

    @torch.no_grad()
    def verify_batch(self, batch: BatchBranches) -> BatchVerifyResult:
        """Every request's real branches in one ragged forward; padding rows are never computed."""
        r, k, n = batch.states.shape
        full = all(b == k for b in batch.branches)
        args = (batch.states, batch.cache, batch.slots, batch.lengths)
        valid = None if full else batch.valid
        seconds, graphs = 0.0, 0
        if self.compiled is None or batch.starts is not None:  # (the compiled forwards place blocks at the lengths)
            raw = self.net.forward_ragged(*args, valid=valid, starts=batch.starts)
        else:
            raw, seconds, graphs = self.compiled.forward_ragged(*args, valid=valid)
        logits = self.net.position_logits(raw.reshape(-1, n, raw.shape[-1]))  # [B', N, V]
        stats = [FoldStats(rows=b * n) for b in batch.branches]
        if graphs:  # the pass's compile cost, on its first request
            stats[0] = FoldStats(rows=stats[0].rows, compile_seconds=seconds, compiled_graphs=graphs)
        return BatchVerifyResult(list(torch.split(logits, batch.branches)), stats)
