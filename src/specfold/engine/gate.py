"""The fold gate (SPEC §4, Eq. 4/5) and fold-chain source resolution.

Dims: ``K`` branches (row 0 = main, ``parents[k] < k`` for ``k >= 1``), ``N`` block positions, ``E`` hidden size.

Eq. 4 and Eq. 5 live here and nowhere else:

    ρ[i,n] = ‖H[i,n] − H[par(i),n]‖₂ / ‖H[par(i),n]‖₂          (Eq. 4)
    folded  ⇔  ρ[i,n] ≤ δ,  the main branch never folds          (Eq. 5)

A folded position inherits its parent's table entry, which may itself be inherited: :func:`resolve_sources`
walks those chains to the nearest ancestor (self included) where the position is recomputed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class BranchGraph:
    """A pass's branch graph in the forms the gate reads, built once per pass rather than in every layer's gates
    (the folded engine's layer loop is op-bound: each small op it saves is ~5–20 µs per layer, twice per layer).

    ``ancestors[i, j]`` is the ``j``-th ancestor of branch ``i`` (``j = 0``: ``i`` itself), repeating the root once
    reached; ``A`` = the deepest chain's length. A graph may hold several roots (one per request)."""

    parents: torch.Tensor  # [K] long, -1 for a root
    par: torch.Tensor  # [K] long: the parent, a root its own index
    nonroot: torch.Tensor  # [K] bool
    ancestors: torch.Tensor  # [K, A] long
    rank: torch.Tensor  # [A, 1]: A - j for column j (uint8 while A < 256), so a max finds the first hit

    @classmethod
    def of(cls, parents: torch.Tensor | Sequence[int], device: torch.device | str | None = None) -> BranchGraph:
        """From parents ``[K]`` (``parents[i] < i``, -1 for a root); a tensor is read to the host once."""
        if isinstance(parents, torch.Tensor):
            device = parents.device if device is None else device
            parents = parents.tolist()
        host = [int(p) for p in parents]
        chains = []
        for i, p in enumerate(host):
            if p >= i:
                raise ValueError(f"parents must satisfy parents[i] < i, got {host}")
            chains.append([i] if p < 0 else [i, *chains[p]])
        width = max((len(c) for c in chains), default=1)
        anc = [c + [c[-1]] * (width - len(c)) for c in chains]
        par = [i if p < 0 else p for i, p in enumerate(host)]
        t = lambda x, dt=torch.long: torch.tensor(x, dtype=dt, device=device)  # noqa: E731
        return cls(parents=t(host), par=t(par), nonroot=t([p >= 0 for p in host], torch.bool),
                   ancestors=t(anc).view(len(host), width),
                   rank=t(list(range(width, 0, -1)), torch.uint8 if width < 256 else torch.int32)[:, None])


def as_graph(parents: torch.Tensor | BranchGraph) -> BranchGraph:
    return parents if isinstance(parents, BranchGraph) else BranchGraph.of(parents)


def relative_residual(
    h: torch.Tensor,  # [K, N, E] layer input of every branch
    parents: torch.Tensor | BranchGraph,  # [K] long, -1 for a root (a main branch)
    exact_zero: bool = True,
) -> torch.Tensor:
    """Eq. 4. Returns ρ ``[K, N]`` (fp32; fp64 for fp64 models); a root (main) row is ``+inf`` (always recompute).

    A row identical to its parent's has ρ = 0 and any other row ρ > 0; a zero-norm parent row gives ``+inf`` unless
    the child equals it (the ratio is undefined there). ``exact_zero=False`` skips the identity test (one pass of
    five): a row whose difference norm is 0 (identical, or squares underflowed) gets the smallest normal ρ
    instead, so Eq. 5 decides alike for every δ > 0 — the gate of a pass at δ > 0."""
    g = as_graph(parents)
    par = g.par.to(h.device)
    acc = torch.float64 if h.dtype == torch.float64 else torch.float32
    # NOTE: five vectorised passes over the rows (0.2 ms vs 1.2 ms for an fp32-upcast, eq/all form at K = N = 32,
    # E = 256 bf16 on this project's CPU). The difference is taken in the model dtype: IEEE subtraction gives exactly
    # 0 iff h == hp, and its L1 norm (a sum of non-negative terms, each at least the dtype's smallest subnormal) is 0
    # iff the rows are bit-identical — the identity test that keeps δ = 0 exact, free of the underflow of squared
    # differences; a distinct row whose squares underflow still gets ρ > 0 (the smallest normal number). Norms
    # accumulate in fp32 (fp64 for fp64 models); bf16 rounds them to its 8-bit mantissa (ρ within 1 %, a gate
    # threshold, not an output), fp16 returns them in fp32 (its range would overflow).
    d = h - h.index_select(0, par)  # [K, N, E] model dtype
    wide = {"dtype": acc} if h.dtype == torch.float16 else {}
    num = torch.linalg.vector_norm(d, dim=-1, **wide).to(acc)
    den = torch.linalg.vector_norm(h, dim=-1, **wide).to(acc).index_select(0, par)  # ‖H[par(i)]‖: one norm of H
    tiny = torch.finfo(acc).tiny
    ratio = (num / den).clamp_(min=tiny)  # 0 / 0 = nan (clamp keeps it), x / 0 = inf
    if exact_zero:
        rho = torch.where(den == 0, math.inf, ratio)
        rho = torch.where(d.abs().sum(dim=-1, **wide) == 0, 0.0, rho)  # bit-identical rows
    else:  # a zero difference under a zero-norm parent (0 / 0) is a fold too
        rho = torch.nan_to_num_(ratio, nan=tiny, posinf=math.inf)
    return rho.masked_fill_(~g.nonroot.to(h.device)[:, None], math.inf)


def fold_mask(rho: torch.Tensor, delta: float, parents: torch.Tensor | BranchGraph | None = None) -> torch.Tensor:
    """Eq. 5. rho: ``[K, N]``; parents ``[K]`` (-1 for a root; default: row 0 is the only root). Returns folded
    ``[K, N]`` bool (ρ ≤ δ); a root never folds."""
    if parents is None:
        nonroot = torch.ones(rho.shape[0], dtype=torch.bool, device=rho.device)
        nonroot[0] = False
    elif isinstance(parents, BranchGraph):
        nonroot = parents.nonroot.to(rho.device)
    else:
        nonroot = (parents >= 0).to(rho.device)
    return (rho <= delta) & nonroot[:, None]


def resolve_sources(
    recompute: torch.Tensor,  # [K, N] bool, roots all True
    parents: torch.Tensor | BranchGraph,  # [K] long, -1 for a root
) -> torch.Tensor:
    """Nearest ancestor (self included) in which each position is recomputed. Returns src ``[K, N]`` long.

    Every branch's chain of ancestors is a row of :attr:`BranchGraph.ancestors`; gathering the recompute flags
    along it gives ``[K, A, N]``, and the first ancestor that recomputes is the source — four ops whatever the
    graph's depth, never a loop over rows. Requires every root's row all True (a main branch is every chain's
    end)."""
    g = as_graph(parents)
    k, n = recompute.shape
    anc = g.ancestors.to(recompute.device)
    a = anc.shape[1]
    hit = recompute.index_select(0, anc.reshape(-1)).view(k, a, n)  # [K, A, N]
    # the nearest recomputing ancestor has the largest rank A - j among the hits (an amax: 5x faster here than an
    # argmax over the middle dimension)
    first = a - (hit.view(torch.uint8) * g.rank.to(hit.device)).amax(dim=1)  # [K, N]
    return anc.gather(1, first.long())


def branch_depths(parents: list[int]) -> list[int]:
    """Graph depth of each branch (distance to row 0 via parents); host-side, for statistics only."""
    depth = [0] * len(parents)
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
    return depth


def check_parents(parents: list[int]) -> None:
    """Refuse a branch graph that is not ``[-1, p1, p2, ...]`` with ``0 <= p_k < k`` (host lists)."""
    if parents[0] != -1 or any(not 0 <= p < i for i, p in enumerate(parents) if i > 0):
        raise ValueError(f"parents must be -1 for row 0 and in [0, k) for row k; got {parents}")


def safe_parents(par: torch.Tensor) -> torch.Tensor:  # [..., K] long on the model's device, local per request
    """``par`` with every invalid entry replaced by a safe one (-1 for row 0, 0 for the others), without a host
    read: no kernel reads out of bounds, and :func:`~specfold.engine.stats.fold_stats` raises once it reads the
    original ``par``."""
    idx = torch.arange(par.shape[-1], device=par.device)
    ok = torch.where(idx == 0, par == -1, (par >= 0) & (par < idx))
    return torch.where(ok, par, torch.where(idx == 0, -1, 0))
