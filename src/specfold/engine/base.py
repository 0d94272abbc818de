"""The verifier interface shared by dense and folded execution.

Dims: ``K`` = number of branches (main + drafts, at most ``B+1``), ``N`` block length, ``V`` vocabulary.

``verify(cache, states, parents)`` runs the model once over every branch state against the one shared prefix
cache and returns the logits *per block position* (the family's shift already applied), so that the decoder can
apply the unmasking rule to any row. ``parents[k] < k`` is the draft graph edge of row ``k`` (``parents[0] = -1``);
the dense verifier ignores it, the folded one gates each row against its parent.

``verify_batch(batch)`` is the same pass for ``R`` requests at once (:class:`BatchBranches`): each request's
branch blocks padded to ``K`` rows, each over its own prefix in a :class:`~specfold.model.cache.BatchCache`.
Parents point inside the request; padding rows are copies of the request's main row (parent 0), never counted.

``verify(..., rows=slice(a, b))``: the states are a *window* of ``W`` rows (a fully bidirectional family's block
with the rows around it, :mod:`specfold.decoding.sequence`), run at positions ``cache.start ..`` over the cache;
only rows ``a .. b-1`` get logits (``[K, b - a, V]``), read as :func:`window_logits` says.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from specfold.engine.stats import FoldStats
from specfold.model.cache import BatchCache, PrefixCache
from specfold.model.transformer import DLLM


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
    # [R] long: each block's first absolute position when it is not the cached length (Fast-dLLM v1's dual cache
    # holds the suffix keys after the prefix); None: the lengths
    starts: torch.Tensor | None = None

    @property
    def valid(self) -> torch.Tensor:  # [R, K] bool: real (not padding) rows
        k = self.states.shape[1]
        real = torch.tensor(self.branches, device=self.states.device)
        return torch.arange(k, device=self.states.device)[None, :] < real[:, None]


@dataclass
class BatchVerifyResult:
    logits: list[torch.Tensor]  # [R] of [branches[r], N, V]: each request's real rows (padding is never returned)
    stats: list[FoldStats]  # per request, over its real rows only


def window_head(rows: slice) -> slice:
    """The raw rows the LM head runs on for a window's logit rows ``rows``: one more before them (a shifted family
    reads position ``i`` from row ``i - 1``), none before the window's first row."""
    return slice(max(rows.start - 1, 0), rows.stop)


def window_logits(net: DLLM, raw: torch.Tensor, rows: slice) -> torch.Tensor:
    """Position logits ``[K, b - a, V]`` of window rows ``rows = slice(a, b)`` from the raw rows ``[K, *, V]`` of
    :func:`window_head` (shifted: position ``i`` from row ``i - 1``, the window's first row from itself, as
    Fast-dLLM v1's Dream reads a window)."""
    return net.sequence_logits(raw)[:, raw.shape[1] - (rows.stop - rows.start):]


class Verifier(Protocol):
    def verify(
        self,
        cache: PrefixCache,
        states: torch.Tensor,  # [K, N] long (or [K, W]: a window, with rows)
        parents: torch.Tensor,  # [K] long, parents[0] = -1
        rows: slice | None = None,  # a window's rows whose logits are returned (None: block states, all rows)
    ) -> VerifyResult: ...

    def verify_batch(self, batch: BatchBranches) -> BatchVerifyResult: ...
