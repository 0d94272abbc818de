"""A folded layer's plan (SPEC §4 step 1): the gate's decisions, source resolution and compaction.

Dims: ``K`` branches (row 0 = main, ``parents[k] < k``), ``N`` block positions, ``E`` hidden size, ``R``
recomputed rows of a layer (packed over all branches), ``C`` folded rows whose attention context changed
(``Δ ≠ ∅``) and is corrected by Eq. 8.

:func:`gate_and_compact` applies Eq. 4/5 (:mod:`specfold.engine.gate`) to the layer input ``H`` against the
immediate parent and packs the recomputed rows; for every (branch, position) the plan names the *pool row* it
holds: the recomputed row of its nearest recomputing ancestor (:func:`~specfold.engine.gate.resolve_sources`).
The per-layer Q/K/V, attention-output and FFN tables of SPEC §4 are gathers of pools indexed this way; a folded
row never owns a copy. :func:`correction_plan` is what Eq. 8 needs of a plan, :func:`dense_plan` the plan of a
layer that recomputes every row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specfold.engine.gate import BranchGraph, as_graph, fold_mask, relative_residual, resolve_sources
from specfold.engine.profiling import part


@dataclass
class FoldPlan:
    """One layer's gate decisions and packing (all index tensors on the model's device)."""

    rho: torch.Tensor  # [K, N] Eq. 4 (roots = inf)
    recompute: torch.Tensor  # [K, N] bool, complement of Eq. 5's folded set
    src: torch.Tensor  # [K, N] long: branch whose Q/K/V (and F) row (i, n) holds
    rows: torch.Tensor  # [R] long: flat (branch·N + position) of the recomputed rows, in pool order
    table: torch.Tensor  # [K, N] long: pool row held by (i, n), i.e. the slot of (src[i, n], n)
    graph: BranchGraph | None = None  # the pass's branch graph (what :attr:`changed` resolves owners in)
    _changed: torch.Tensor | None = None

    @property
    def changed(self) -> torch.Tensor:
        """``[K, N]`` bool: folded rows whose attention context differs from their source's (Δ ≠ ∅). Made when first
        read: only Eq. 8 (and the cost rule weighing it) needs it, direct attention does not.

        Δ of a folded row ``(i, n)`` with source ``s = src[i, n]`` is empty iff ``s`` is ``i``'s nearest
        ancestor-or-self that recomputes any position (``owner[i]``): branches below ``owner[i]`` recompute nothing
        and hold its table row; any source above it misses a position ``owner[i]`` recomputed. So ``changed`` costs
        ops on ``[K, N]`` and ``[K]``, not a comparison of table rows."""
        if self._changed is None:
            owner = resolve_sources(self.recompute.any(dim=1, keepdim=True), self.graph)  # [K, 1]
            self._changed = ~self.recompute & (self.src != owner)
        return self._changed


@dataclass
class CorrectionPlan:
    """What Eq. 8 needs of a layer's plan (:func:`correction_plan`; built only when a layer corrects)."""

    corrected: torch.Tensor  # [C] long: flat index of folded rows with Δ ≠ ∅
    branch_rows: torch.Tensor  # [C, N] long: table row of each corrected row's branch
    source_rows: torch.Tensor  # [C, N] long: table row of each corrected row's source
    delta: torch.Tensor  # [C, N] bool: Δ = branch_rows != source_rows
    out_index: torch.Tensor  # [K*N] long: row of the packed (recomputed ++ corrected) outputs each row takes


def gate_and_compact(
    h: torch.Tensor,  # [K, N, E] layer input of every branch
    parents: torch.Tensor | BranchGraph,  # [K] long, on h's device; -1 for a root
    delta: float,
    fold: torch.Tensor | None = None,  # [K, N] bool: use these decisions instead of Eq. 5 (benchmarks)
) -> FoldPlan:
    """Gate (Eq. 4/5), source resolution and compaction of one layer. ``fold`` still pays for computing ρ, so a
    benchmark that imposes a fold ratio times the same work."""
    with part("gate"):
        rho = relative_residual(h, parents, exact_zero=delta == 0)
        if fold is None:
            folded = fold_mask(rho, delta, parents)
        else:  # imposed decisions; a root still never folds
            folded = fold & as_graph(parents).nonroot.to(fold.device)[:, None]
    with part("packing"):
        return plan_from_recompute(rho, ~folded, parents)


def plan_from_recompute(
    rho: torch.Tensor,  # [K, N]
    recompute: torch.Tensor,  # [K, N] bool, roots all True
    parents: torch.Tensor | BranchGraph,  # [K] long
) -> FoldPlan:
    """Source resolution and compaction of given recompute decisions (:func:`gate_and_compact` after the gate)."""
    parents = as_graph(parents)
    src, rows, table = pool_index(recompute, parents)
    return FoldPlan(rho=rho, recompute=recompute, src=src, rows=rows, table=table, graph=parents)


def correction_plan(plan: FoldPlan) -> CorrectionPlan:
    """The corrected rows of a plan with their branch and source table rows (Eq. 8's inputs)."""
    k, n = plan.recompute.shape
    corrected = plan.changed.reshape(-1).nonzero().squeeze(1)  # [C]
    branch_rows = plan.table.index_select(0, corrected // n)  # [C, N]
    source_rows = plan.table.index_select(0, plan.src.reshape(-1).index_select(0, corrected))
    out_index = plan.table.reshape(-1).clone()
    out_index[corrected] = plan.rows.numel() + torch.arange(corrected.numel(), device=corrected.device)
    return CorrectionPlan(corrected=corrected, branch_rows=branch_rows, source_rows=source_rows,
                          delta=branch_rows != source_rows, out_index=out_index)


def dense_plan(rho: torch.Tensor) -> FoldPlan:  # rho: [K, N]
    """The plan of a layer that recomputes every row (the cost rule's dense fallback)."""
    k, n = rho.shape
    dev = rho.device
    flat = torch.arange(k * n, device=dev)
    every = torch.ones(k, n, dtype=torch.bool, device=dev)
    return FoldPlan(rho=rho, recompute=every, src=torch.arange(k, device=dev)[:, None].expand(k, n), rows=flat,
                    table=flat.view(k, n), _changed=~every)


def pool_index(
    recompute: torch.Tensor,  # [K, N] bool, roots all True
    parents: torch.Tensor | BranchGraph,  # [K] long
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Source resolution + compaction: ``src [K, N]`` (nearest recomputing ancestor), the packed recomputed rows
    ``rows [R]`` (flat ``branch·N + position``) and ``table [K, N]``: the pool row each (branch, position) holds."""
    k, n = recompute.shape
    src = resolve_sources(recompute, parents)
    flat = recompute.reshape(-1)
    rows = flat.nonzero().squeeze(1)
    slot = (torch.cumsum(flat, 0) - 1).view(k, n)  # pool slot of every recomputed (i, n)
    return src, rows, slot.gather(0, src)


# --- static-shape plans (the compiled folded layer, :mod:`specfold.engine.compiled`) --------------------------------


@dataclass
class StaticPlan:
    """A layer's gate decisions and packing with every shape fixed by ``[K, N]``: the pool is the first ``count``
    entries of ``order`` (recomputed rows, ascending), followed by the other rows. No ``nonzero``, no host read: what
    a compiled graph can produce. :func:`pool_rows` cuts a bucketed pool from it after one host read."""

    rho: torch.Tensor  # [K, N] Eq. 4
    recompute: torch.Tensor  # [K, N] bool
    src: torch.Tensor  # [K, N] long: nearest recomputing ancestor
    table: torch.Tensor  # [K, N] long: pool row (slot) each (branch, position) holds
    order: torch.Tensor  # [K*N] long: flat rows, the recomputed ones first (ascending), then the folded ones
    count: torch.Tensor  # [] long: R, the recomputed rows
    sizes: torch.Tensor  # [S] long: recomputed rows per request (S = 1 without ``request``)


def static_plan(
    h: torch.Tensor,  # [K, N, E] layer input of every branch
    graph: BranchGraph,
    delta: float,
    fold: torch.Tensor | None = None,  # [K, N] bool imposed decisions (benchmarks), as in gate_and_compact
    request: torch.Tensor | None = None,  # [K] long, ascending: each branch's request
    requests: int = 1,  # S
) -> StaticPlan:
    """:func:`gate_and_compact` (Eq. 4/5, source resolution, compaction) in static shapes: the pool order is a
    scatter of every row to its rank (recomputed rows to their slot, the others after them)."""
    rho = relative_residual(h, graph, exact_zero=delta == 0)
    folded = fold_mask(rho, delta, graph) if fold is None else fold & graph.nonroot[:, None]
    return static_plan_of(rho, ~folded, graph, request, requests)


def static_plan_of(
    rho: torch.Tensor,  # [K, N]
    recompute: torch.Tensor,  # [K, N] bool, roots all True
    graph: BranchGraph,
    request: torch.Tensor | None = None,  # [K] long
    requests: int = 1,
) -> StaticPlan:
    """:func:`static_plan` after the gate (given decisions)."""
    k, n = recompute.shape
    src = resolve_sources(recompute, graph)
    flat = recompute.reshape(-1)
    seen = torch.cumsum(flat, 0)  # recomputed rows up to and including each row
    count = seen[-1]
    index = torch.arange(k * n, device=flat.device)
    rank = torch.where(flat, seen - 1, count + index - seen)  # folded rows after the pool, in order
    order = torch.empty_like(index).scatter_(0, rank, index)
    table = (seen - 1).view(k, n).gather(0, src)
    per_branch = recompute.sum(dim=1)
    if request is None:
        sizes = per_branch.sum().reshape(1)
    else:
        sizes = torch.zeros(requests, dtype=torch.long, device=flat.device).index_add_(0, request, per_branch)
    return StaticPlan(rho=rho, recompute=recompute, src=src, table=table, order=order, count=count, sizes=sizes)


def pool_rows(plan: StaticPlan, size: int) -> torch.Tensor:
    """``[size]`` long: the pool's rows, padded up to ``size`` (a bucket, at least ``count``) with copies of the last
    recomputed row (its request's group grows by the padding; nothing reads a padding row's results)."""
    rows = plan.order[:size]
    live = torch.arange(size, device=rows.device) < plan.count
    return torch.where(live, rows, plan.order.gather(0, (plan.count - 1).reshape(1)))  # a gather: no host read
