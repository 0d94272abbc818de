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
    exact_zero: bool = True,
) -> torch.Tensor:
    """Eq. 4. Returns ρ ``[K, N]`` (fp32; fp64 for fp64 models); a root (main) row is ``+inf`` (always recompute).

    A row identical to its parent's has ρ = 0 and any other row ρ > 0; a zero-norm parent row gives ``+inf`` unless
    the child equals it (the ratio is undefined there). ``exact_zero=False`` skips the identity test (one pass of
    five): a row whose difference norm is 0 (identical, or squares underflowed) gets the smallest normal ρ
    instead, so Eq. 5 decides alike for every δ > 0 — the gate of a pass at δ > 0."""
    par = parents.clamp(min=0).to(h.device)
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
    rho = torch.where(den == 0, math.inf, (num / den).clamp(min=tiny))
    if exact_zero:
        rho = torch.where(d.abs().sum(dim=-1, **wide) == 0, 0.0, rho)  # bit-identical rows
    else:
        rho = torch.where(num == 0, tiny, rho)
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
