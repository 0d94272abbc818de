"""Attention for a packed set of block rows drawn from different branches (SPEC §4 step 3, §5 kernel 4).

Dims: ``K`` branches, ``N`` block positions, ``R`` packed rows (any subset of the ``K·N`` (branch, position)
pairs), ``P`` cached prefix length, ``Hq`` query heads, ``Hkv`` key/value heads (GQA group ``G = Hq / Hkv``),
``D`` head dim.

Each packed row ``r`` (flat index ``rows[r] = branch·N + position``) attends to the shared prefix and to its own
branch's block K/V, and keeps the streaming-softmax state ``(m, Z, O)`` of :mod:`specfold.model.attention`
(same conventions: scores and state in fp32, fp64 for fp64 models; P·V products in the value dtype). This is
the torch reference of the row-attention kernel; the folded engine's correction (Eq. 8) starts from its state.
"""

from __future__ import annotations

import torch

from specfold.model.attention import AttnState, accumulation_dtype


def attend_rows(
    q: torch.Tensor,  # [R, Hq, D] RoPE'd, query-scaled queries of the packed rows
    rows: torch.Tensor,  # [R] long, flat (branch·N + position) index of each packed row
    prefix_k: torch.Tensor | None,  # [Hkv, P, D] shared by every branch, or None when P = 0
    prefix_v: torch.Tensor | None,  # [Hkv, P, D]
    block_k: torch.Tensor,  # [K, N, Hkv, D] each branch's block key table
    block_v: torch.Tensor,  # [K, N, Hkv, D]
    scale: float,
) -> AttnState:
    """Bidirectional block attention of packed rows. Returns ``m, z [R, Hq]`` and ``o [R, Hq, D]`` (acc dtype)."""
    r, hq, d = q.shape
    k, n, hkv, _ = block_k.shape
    g = hq // hkv
    acc = accumulation_dtype(q.dtype)

    # Block part. NOTE: rows are scattered into a zero-padded per-branch query table so that the block scores are
    # one batched GEMM per (branch, kv head) instead of R tiny GEMMs; the padding costs K·N·N·Hq·D, small next to
    # the prefix part (N ≪ P) and free of a [R, N, Hkv, D] per-row key gather.
    qpad = q.new_zeros(k * n, hq, d).index_copy_(0, rows, q)
    qb = qpad.view(k, n, hkv, g, d).permute(0, 2, 1, 3, 4).reshape(k, hkv, n * g, d)
    s_blk = torch.matmul(qb, block_k.permute(0, 2, 3, 1)).to(acc) * scale  # [K, Hkv, N*G, N]
    s_blk = s_blk.view(k, hkv, n, g, n).permute(0, 2, 1, 3, 4).reshape(k * n, hq, n)[rows]  # [R, Hq, N]
    m = s_blk.amax(dim=-1)  # [R, Hq]

    s_pre = None
    if prefix_k is not None and prefix_k.shape[1] > 0:
        # NOTE: all packed rows are stacked as queries: the shared prefix is read once, never expanded per branch.
        qp = q.view(r, hkv, g, d).permute(1, 0, 2, 3).reshape(hkv, r * g, d)
        s_pre = torch.matmul(qp, prefix_k.transpose(1, 2)).to(acc) * scale  # [Hkv, R*G, P]
        m = torch.maximum(m, s_pre.amax(dim=-1).view(hkv, r, g).permute(1, 0, 2).reshape(r, hq))

    p_blk = torch.exp(s_blk - m[..., None])  # [R, Hq, N]
    z = p_blk.sum(dim=-1)
    ppad = p_blk.new_zeros(k * n, hq, n).index_copy_(0, rows, p_blk)
    pb = ppad.view(k, n, hkv, g, n).permute(0, 2, 1, 3, 4).reshape(k, hkv, n * g, n).to(block_v.dtype)
    o = torch.matmul(pb, block_v.permute(0, 2, 1, 3)).to(acc)  # [K, Hkv, N*G, D]
    o = o.view(k, hkv, n, g, d).permute(0, 2, 1, 3, 4).reshape(k * n, hq, d)[rows]  # [R, Hq, D]
    if s_pre is not None:
        m_pre = m.view(r, hkv, g).permute(1, 0, 2).reshape(hkv, r * g, 1)
        p_pre = torch.exp(s_pre - m_pre)  # [Hkv, R*G, P]
        z = z + p_pre.sum(dim=-1).view(hkv, r, g).permute(1, 0, 2).reshape(r, hq)
        o_pre = torch.matmul(p_pre.to(prefix_v.dtype), prefix_v).to(acc)  # [Hkv, R*G, D]
        o = o + o_pre.view(hkv, r, g, d).permute(1, 0, 2, 3).reshape(r, hq, d)
    return AttnState(m=m, z=z, o=o / z[..., None])
