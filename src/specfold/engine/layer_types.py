"""Types every folded-layer backend shares: the pass settings, what a layer step reads, and what it reports.

Dims: ``K`` branches (roots have parent ``-1``), ``N`` block positions, ``E`` hidden size, ``Hq``/``Hkv`` heads,
``D`` head dim, ``G`` guard fallbacks.

:mod:`specfold.engine.folded` (torch) and :mod:`specfold.engine.triton_backend` both import from here and never
from each other; a layer step of either backend has the signature
``layer_fn(layer, h, plan, ctx, prefix_k, prefix_v, cfg, trace) -> (h_next, LayerCounts, LayerTrace | None)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from specfold.engine.correction import DEFAULT_GUARD
from specfold.engine.gate import BranchGraph

BACKENDS = ("torch", "triton")  # "triton": specfold.engine.triton_backend, imported only when chosen
FFN_MODES = ("residual", "paper")
# "correct": Eq. 8 for folded rows; "direct": every row's attention computed directly over its branch's own K/V;
# "auto": per layer, whichever the cost rule of specfold.engine.cost says is cheaper.
ATTENTION_MODES = ("auto", "correct", "direct")
PASS_CHOICES = ("auto", "fold", "dense")


@dataclass(frozen=True)
class FoldConfig:
    """Settings of a folded verification pass.

    ``delta``: the recompute threshold δ of Eq. 5 (finite, in [0, 1]); ``guard``: the cancellation-guard fraction
    of :mod:`specfold.engine.correction`; ``ffn``: ``"residual"`` (FFN gated on its own input, exact at δ = 0) or
    ``"paper"`` (SPEC §4 step 6 literally); ``attention``: see :data:`ATTENTION_MODES`; ``backend``: ``"torch"``
    or ``"triton"``; ``dense_fallback``: run a layer densely when the cost rule says folding would not pay;
    ``imposed_fold``: benchmarks only — fold this fraction of every layer's non-root rows (a fixed pseudo-random
    pattern per layer and branch count) instead of Eq. 5's decisions, so a decode runs at a chosen fold ratio;
    its tokens are then not vanilla's; ``pass_choice``: per pass, before the first gate, ``"auto"`` runs the dense
    pass when the pass cost rule (:class:`specfold.engine.cost.PassCost`) says folding cannot pay (only with
    ``dense_fallback`` and a cost rule), ``"fold"`` never does, ``"dense"`` always does (tests, benchmarks)."""

    delta: float = 0.1
    guard: float = DEFAULT_GUARD
    ffn: str = "residual"
    attention: str = "auto"
    backend: str = "torch"
    dense_fallback: bool = True
    imposed_fold: float | None = None
    pass_choice: str = "auto"

    def __post_init__(self) -> None:
        if self.imposed_fold is not None and not 0.0 <= self.imposed_fold <= 1.0:
            raise ValueError(f"imposed_fold must be a fraction in [0, 1], got {self.imposed_fold}")
        if not (isinstance(self.delta, int | float) and math.isfinite(self.delta) and 0.0 <= self.delta <= 1.0):
            raise ValueError(f"delta must be a finite number in [0, 1], got {self.delta}")
        if not 0.0 < self.guard <= 1.0:
            raise ValueError(f"guard must be in (0, 1], got {self.guard}")
        if self.ffn not in FFN_MODES:
            raise ValueError(f"unknown ffn mode {self.ffn!r}; available: {', '.join(FFN_MODES)}")
        if self.attention not in ATTENTION_MODES:
            raise ValueError(f"unknown attention mode {self.attention!r}; available: {', '.join(ATTENTION_MODES)}")
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown folded backend {self.backend!r}; available: {', '.join(BACKENDS)}")
        if self.pass_choice not in PASS_CHOICES:
            raise ValueError(f"unknown pass choice {self.pass_choice!r}; available: {', '.join(PASS_CHOICES)}")
        if self.backend == "triton" and self.attention == "direct":
            raise ValueError("the triton backend implements attention='correct' (the Eq. 8 kernel)")


@dataclass
class LayerContext:
    """What every layer step of one pass shares: RoPE tables of the block positions, the score scale, the graph.

    One request: ``cos``/``sin`` ``[N, D]`` (every branch at the same positions), the prefix ``[Hkv, P, D]``.
    Several requests (:meth:`FoldedVerifier.verify_batch`): ``R`` requests of ``K / R`` branches each, or as many
    as ``branch_request`` assigns them (the torch engine packs real branches only); one table row per (branch,
    position) ``[K*N, D]``; the prefix ``[R, Hkv, P, D]`` padded past each request's ``prefix_len [R]``; the graph
    has one root per request. ``prefix_len [1]`` with a ``[Hkv, P, D]`` prefix is a CUDA-graph bucket (keys past
    it unused)."""

    cos: torch.Tensor  # [N, D] or [K*N, D]
    sin: torch.Tensor  # [N, D] or [K*N, D]
    qscale: torch.Tensor | None  # [N] or [K*N]
    scale: float
    parents: torch.Tensor  # [K] long, -1 for a root (a main branch)
    prefix_len: torch.Tensor | None = None  # [R] int32: live prefix keys per request (None: the whole view)
    branch_request: torch.Tensor | None = None  # [K] long, ascending: request of each branch (None: K / R each)
    graph: BranchGraph | None = None  # ``parents`` as the torch engine's gates read them (built once per pass)


@dataclass
class LayerCounts:
    """One layer's statistics per branch, as tensors (no device sync in the layer loop; :func:`fold_stats` reads
    them once and sums them per request)."""

    folded: torch.Tensor  # [K] positions folded at the layer input
    ffn_folded: torch.Tensor  # [K] positions that reused an ancestor's FFN output
    guard: torch.Tensor  # [K] guard fallbacks
    recomputed: torch.Tensor  # [K] positions whose Q/K/V were computed
    corrected: torch.Tensor  # [K] folded positions whose attention Eq. 8 corrected
    dense: bool = False  # the layer ran densely (cost rule or no fold)


@dataclass
class LayerTrace:
    """Per-layer tables of one pass, for tests (``trace=True``); every table is ``[K, N, ...]``."""

    h: torch.Tensor  # [K, N, E] layer input
    rho: torch.Tensor  # [K, N]
    recompute: torch.Tensor  # [K, N] bool
    src: torch.Tensor  # [K, N] long
    q: torch.Tensor  # [K, N, Hq, D]
    k: torch.Tensor  # [K, N, Hkv, D]
    v: torch.Tensor  # [K, N, Hkv, D]
    o: torch.Tensor  # [K, N, Hq, D] attention output (acc dtype)
    f: torch.Tensor  # [K, N, E] FFN output table
    flagged: torch.Tensor  # [G] long: flat index of rows the guard sent to direct attention
    h1: torch.Tensor  # [K, N, E] post-attention residual (the FFN's input)
    ffn_recompute: torch.Tensor  # [K, N] bool: rows whose FFN ran


@dataclass
class FoldTrace:
    layers: list[LayerTrace] = field(default_factory=list)
