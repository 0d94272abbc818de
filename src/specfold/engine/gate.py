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

import torch


def relative_residual(
    h: torch.Tensor,  # [K, N, E] layer input of every branch
    parents: torch.Tensor,  # [K] long, -1 for a root (a main branch)
) -> torch.Tensor:
    """Eq. 4. Returns ρ ``[K, N]`` (fp32; fp64 for fp64 models); a root (main) row is ``+inf`` (always recompute).

    A row identical to its parent's has ρ = 0 and any other row ρ > 0; a zero-norm parent row gives ``+inf`` unless
    the child equals it (the ratio is undefined there)."""
    par = parents.clamp(min=0).to(h.device)
    hp = h[par]  # [K, N, E]
    # NOTE: norms in fp32 (fp64 for fp64 models) — an fp64 pass costs more than the gate is worth. Exactness at
    # δ = 0 comes from the explicit bit-identity test: a row folds at δ = 0 only if it equals its parent's exactly;
    # a distinct row whose squared differences underflow still gets ρ > 0 (the smallest normal number).
    acc = torch.float64 if h.dtype == torch.float64 else torch.float32
    hp_w = hp.to(acc)
    num = torch.linalg.vector_norm(h.to(acc) - hp_w, dim=-1)
    den = torch.linalg.vector_norm(hp_w, dim=-1)
    identical = (h == hp).all(dim=-1)
    tiny = torch.finfo(acc).tiny
    rho = torch.where(den == 0, math.inf, (num / den).clamp(min=tiny))
    rho = torch.where(identical, 0.0, rho)
    return rho.masked_fill((parents < 0).to(h.device)[:, None], math.inf)


def fold_mask(rho: torch.Tensor, delta: float, parents: torch.Tensor | None = None) -> torch.Tensor:
    """Eq. 5. rho: ``[K, N]``; parents ``[K]`` (-1 for a root; default: row 0 is the only root). Returns folded
    ``[K, N]`` bool (ρ ≤ δ); a root never folds."""
    roots = torch.zeros(rho.shape[0], dtype=torch.bool, device=rho.device)
    if parents is None:
        roots[0] = True
    else:
        roots = (parents < 0).to(rho.device)
    return (rho <= delta) & ~roots[:, None]


def depth_steps(branches: int) -> int:
    """Pointer-jumping rounds that resolve any chain in a graph of ``branches`` nodes (depth ≤ branches − 1)."""
    return max(0, math.ceil(math.log2(branches))) if branches > 1 else 0


def resolve_sources(
    recompute: torch.Tensor,  # [K, N] bool, roots all True
    parents: torch.Tensor,  # [K] long, -1 for a root
) -> torch.Tensor:
    """Nearest ancestor (self included) in which each position is recomputed. Returns src ``[K, N]`` long.

    One hop is ``next[i,n] = i`` if recomputed else ``par(i)``; pointer jumping (``ptr ← ptr[ptr]``) doubles the
    walked distance per round, so ``⌈log2 K⌉`` rounds reach the root of every chain — a loop over graph depth,
    never over rows. Requires every root's row all True (a main branch is every chain's end)."""
    k, n = recompute.shape
    rows = torch.arange(k, device=recompute.device)[:, None].expand(k, n)
    par = parents.to(recompute.device).clamp(min=0)[:, None].expand(k, n)
    ptr = torch.where(recompute, rows, par)
    for _ in range(depth_steps(k)):
        ptr = ptr.gather(0, ptr)
    return ptr


def branch_depths(parents: list[int]) -> list[int]:
    """Graph depth of each branch (distance to row 0 via parents); host-side, for statistics only."""
    depth = [0] * len(parents)
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
    return depth
