"""The verifier interface shared by dense and folded execution.

Dims: ``K`` = number of branches (main + drafts, at most ``B+1``), ``N`` block length, ``V`` vocabulary.

``verify(cache, states, parents)`` runs the model once over every branch state against the one shared prefix
cache and returns the logits *per block position* (the family's shift already applied), so that the decoder can
apply the unmasking rule to any row. ``parents[k] < k`` is the draft graph edge of row ``k`` (``parents[0] = -1``);
the dense verifier ignores it, the folded one gates each row against its parent.

``verify_batch(batch)`` is the same pass for ``R`` requests at once (:class:`BatchBranches`): each request's
branch blocks padded to ``K`` rows, each over its own prefix in a :class:`~specfold.model.cache.BatchCache`.
Parents point inside the request; padding rows are copies of the request's main row (parent 0), never counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from specfold.engine.stats import FoldStats
from specfold.model.cache import BatchCache, PrefixCache


@dataclass
class VerifyResult:
    logits: torch.Tensor  # [K, N, V]
    stats: FoldStats = field(default_factory=FoldStats)  # summed over passes by the decoder (``+``)


@dataclass
class BatchBranches:
    """One verification pass over ``R`` requests, each with ``branches[r] <= K`` real rows first, then padding."""

    cache: BatchCache
    slots: torch.Tensor  # [R] long: each request's cache slot
    lengths: torch.Tensor  # [R] long: each request's cached prefix length
    states: torch.Tensor  # [R, K, N] long: row 0 = the request's main state; padding rows = copies of row 0
    parents: torch.Tensor  # [R, K] long, inside the request: parents[r, 0] = -1, padding rows 0
    branches: list[int]  # [R] real rows per request

    @property
    def valid(self) -> torch.Tensor:  # [R, K] bool: real (not padding) rows
        k = self.states.shape[1]
        real = torch.tensor(self.branches, device=self.states.device)
        return torch.arange(k, device=self.states.device)[None, :] < real[:, None]


@dataclass
class BatchVerifyResult:
    logits: list[torch.Tensor]  # [R] of [branches[r], N, V]: each request's real rows (padding is never returned)
    stats: list[FoldStats]  # per request, over its real rows only


class Verifier(Protocol):
    def verify(
        self,
        cache: PrefixCache,
        states: torch.Tensor,  # [K, N] long
        parents: torch.Tensor,  # [K] long, parents[0] = -1
    ) -> VerifyResult: ...

    def verify_batch(self, batch: BatchBranches) -> BatchVerifyResult: ...
