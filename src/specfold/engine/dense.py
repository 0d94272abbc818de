"""Dense verification: one batched forward over every branch (the Spiffy baseline's cost model)."""

from __future__ import annotations

import torch

from specfold.engine.base import VerifyResult
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
        return VerifyResult(self.net.position_logits(raw), {"rows": float(rows)})
