"""The verifier interface shared by dense and folded execution.

Dims: ``K`` = number of branches (main + drafts, at most ``B+1``), ``N`` block length, ``V`` vocabulary.

``verify(cache, states, parents)`` runs the model once over every branch state against the one shared prefix
cache and returns the logits *per block position* (the family's shift already applied), so that the decoder can
apply the unmasking rule to any row. ``parents[k] < k`` is the draft graph edge of row ``k`` (``parents[0] = -1``);
the dense verifier ignores it, the folded one gates each row against its parent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from specfold.model.cache import PrefixCache


@dataclass
class VerifyResult:
    logits: torch.Tensor  # [K, N, V]
    stats: dict[str, float] = field(default_factory=dict)  # summed over passes by the decoder


class Verifier(Protocol):
    def verify(
        self,
        cache: PrefixCache,
        states: torch.Tensor,  # [K, N] long
        parents: torch.Tensor,  # [K] long, parents[0] = -1
    ) -> VerifyResult: ...


def fold_ratio(stats: dict[str, float], gate: str = "attention") -> float | None:
    """Folded ÷ draft (branch, position, layer) triples of summed verifier stats, at the layer-input (attention)
    gate or, with ``gate="ffn"``, at the FFN gate; None when nothing was drafted."""
    if gate not in ("attention", "ffn"):
        raise ValueError(f"unknown gate {gate!r}; available: attention, ffn")
    draft = stats.get("draft_triples", 0.0)
    key = "folded_triples" if gate == "attention" else "ffn_folded_triples"
    return stats.get(key, 0.0) / draft if draft else None
