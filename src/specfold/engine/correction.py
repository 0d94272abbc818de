"""The folded-row attention correction (SPEC §4 step 4, Eq. 8) and its cancellation guard.

Dims: ``F`` folded rows being corrected (of any branches, all at once), ``N`` block positions, ``R`` pooled
block K/V rows of the layer, ``Hq`` query heads, ``Hkv`` key/value heads (``G = Hq / Hkv``), ``D`` head dim.

A folded row of branch ``i`` at position ``n`` inherits its query from its source ``a`` (the nearest ancestor
where ``n`` is recomputed), whose attention state ``(m, Z, O)`` was computed directly over ``a``'s block K/V.
Branch ``i``'s block K/V differs from ``a``'s exactly on ``Δ`` (positions whose K/V source branch differs). With
``s_p = q·k_a[p]/√d`` and ``s'_p = q·k_i[p]/√d``:

    m' = max(m, max_{p∈Δ} s'_p)
    Z' = e^{m−m'} Z − Σ_{p∈Δ} e^{s_p−m'} + Σ_{p∈Δ} e^{s'_p−m'}
    O' = ( e^{m−m'} Z·O − Σ_{p∈Δ} e^{s_p−m'} v_a[p] + Σ_{p∈Δ} e^{s'_p−m'} v_i[p] ) / Z'        (Eq. 8)

Block K/V are passed as a *pool* — the layer's distinct K/V rows (one per recomputed (branch, position)) —
plus, per folded row, the pool row the branch and its source hold at each position. Every branch's block is a
gather of the pool, so this is the same information as "the branch's and the source's block K/V" without a
``[F, N, Hkv, D]`` copy, and Δ is exactly where the two index rows differ.

**Cancellation guard.** The subtraction removes mass that the source's direct attention accumulated. That mass
carries the source's rounding error (P·V runs in the model dtype, so relative error ε of bf16/fp16), which
survives the subtraction while the kept mass shrinks: the corrected row's relative error grows like
``1 / (1 − removed / (e^{m−m'} Z))``. :data:`DEFAULT_GUARD` = 0.5 caps that amplification at 2× — the FlashAttention
acceptance rule (a kernel may carry at most ~2× the error of the same math done at low precision) — and a row
(any head) whose removed mass reaches that fraction is flagged; the caller recomputes it by direct attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specfold.model.attention import accumulation_dtype

DEFAULT_GUARD = 0.5  # removed-mass fraction of e^{m-m'}Z at which a corrected row is recomputed (≤ 2× error)


@dataclass
class Corrected:
    """Corrected streaming state per folded row and head (acc dtype) and the guard flags."""

    m: torch.Tensor  # [F, Hq]
    z: torch.Tensor  # [F, Hq]
    o: torch.Tensor  # [F, Hq, D]
    flagged: torch.Tensor  # [F] bool: removed mass ≥ guard · e^{m−m'}Z in some head → recompute directly


def correct_rows(
    q: torch.Tensor,  # [F, Hq, D] inherited (source's) query of each folded row
    m: torch.Tensor,  # [F, Hq] source row's running max
    z: torch.Tensor,  # [F, Hq] source row's denominator
    o: torch.Tensor,  # [F, Hq, D] source row's normalised output
    pool_k: torch.Tensor,  # [R, Hkv, D] the layer's block key rows
    pool_v: torch.Tensor,  # [R, Hkv, D] the layer's block value rows
    branch_rows: torch.Tensor,  # [F, N] long: pool row branch i holds at each position
    source_rows: torch.Tensor,  # [F, N] long: pool row the source ancestor a holds at each position
    delta: torch.Tensor,  # [F, N] bool: Δ(i, a), i.e. branch_rows != source_rows
    scale: float,
    guard: float = DEFAULT_GUARD,
) -> Corrected:
    """Eq. 8 for all folded rows at once. Returns the corrected ``(m', Z', O')`` and the guard flags."""
    f, hq, d = q.shape
    r, hkv, _ = pool_k.shape
    g = hq // hkv
    acc = accumulation_dtype(q.dtype)

    # Scores of every folded query against every pooled key; Δ entries of both tables are gathered from it.
    # NOTE: computed in the model dtype and then widened, exactly as the direct attention computed the source's
    # scores, so the removed terms match what the source accumulated.
    qh = q.view(f, hkv, g, d).permute(1, 0, 2, 3).reshape(hkv, f * g, d)
    s = torch.matmul(qh, pool_k.permute(1, 2, 0)).to(acc) * scale  # [Hkv, F*G, R]
    s = s.view(hkv, f, g, r).permute(1, 0, 2, 3).reshape(f, hq, r)
    idx_i = branch_rows[:, None, :].expand(f, hq, -1)
    idx_a = source_rows[:, None, :].expand(f, hq, -1)
    dmask = delta[:, None, :]
    s_new = s.gather(2, idx_i).masked_fill(~dmask, float("-inf"))  # [F, Hq, N] s'_p on Δ
    s_old = s.gather(2, idx_a).masked_fill(~dmask, float("-inf"))  # [F, Hq, N] s_p on Δ

    m_new = torch.maximum(m, s_new.amax(dim=-1))
    kept = torch.exp(m - m_new) * z  # e^{m-m'} Z
    e_add = torch.exp(s_new - m_new[..., None])
    e_rem = torch.exp(s_old - m_new[..., None])
    removed = e_rem.sum(dim=-1)
    z_new = kept - removed + e_add.sum(dim=-1)

    # Signed weights over the pool: +e^{s'-m'} at the branch's Δ rows, -e^{s-m'} at the source's Δ rows.
    w = s.new_zeros(f, hq, r).scatter_add_(2, idx_i, e_add).scatter_add_(2, idx_a, -e_rem)
    wh = w.view(f, hkv, g, r).permute(1, 0, 2, 3).reshape(hkv, f * g, r)
    dv = torch.matmul(wh, pool_v.to(acc).permute(1, 0, 2))  # [Hkv, F*G, D]
    dv = dv.view(hkv, f, g, d).permute(1, 0, 2, 3).reshape(f, hq, d)
    o_new = (kept[..., None] * o + dv) / z_new[..., None]
    flagged = (removed >= guard * kept).any(dim=-1)
    return Corrected(m=m_new, z=z_new, o=o_new, flagged=flagged)
