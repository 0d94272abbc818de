"""Attention for a packed set of block rows drawn from different branches (SPEC §4 step 3, §5 kernel 4).

Dims: ``K`` branches, ``N`` block positions, ``R`` packed rows (any subset of the ``K·N`` (branch, position)
pairs), ``P`` cached prefix length, ``Hq`` query heads, ``Hkv`` key/value heads (GQA group ``G = Hq / Hkv``),
``D`` head dim.

Each packed row ``r`` (flat index ``rows[r] = branch·N + position``) attends to the shared prefix and to its own
branch's block K/V, and keeps the streaming-softmax state ``(m, Z, O)`` of :mod:`specfold.model.attention`
(same conventions: scores and state in fp32, fp64 for fp64 models; P·V products in the value dtype). With
several requests in one pass each row reads its own request's prefix (a padded ``[S, Hkv, P, D]`` view). This is
the torch reference of the row-attention kernel; the folded engine's correction (Eq. 8) starts from its state.
"""

from __future__ import annotations

import torch

from specfold.model.attention import AttnState, accumulation_dtype


def attend_rows(
    q: torch.Tensor,  # [R, Hq, D] RoPE'd, query-scaled queries of the packed rows
    rows: torch.Tensor,  # [R] long, flat (branch·N + position) index of each packed row, ascending
    prefix_k: torch.Tensor | None,  # [Hkv, P, D] shared by every branch, [S, Hkv, P, D] per request, or None
    prefix_v: torch.Tensor | None,  # same layout as prefix_k
    block_k: torch.Tensor,  # [K, N, Hkv, D] each branch's block key table
    block_v: torch.Tensor,  # [K, N, Hkv, D]
    scale: float,
    prefix_len: torch.Tensor | None = None,  # [S] long: live keys of each request's prefix (4-dim prefix only)
    branch_request: torch.Tensor | None = None,  # [K] long, ascending: each branch's request (4-dim prefix only)
) -> AttnState:
    """Bidirectional block attention of packed rows. Returns ``m, z [R, Hq]`` and ``o [R, Hq, D]`` (acc dtype).

    A 4-dim prefix holds ``S`` requests of ``K / S`` consecutive branches each, or of the branches
    ``branch_request`` assigns them; a row attends to its request's prefix up to ``prefix_len`` (keys past it are
    masked)."""
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

    pre = None
    if prefix_k is not None and prefix_k.shape[-2] > 0:
        group = None if branch_request is None else branch_request.index_select(0, rows // n)  # [R]
        pre = _PrefixRows.of(q, rows, prefix_k, prefix_len, k * n, group)
        s_pre = pre.scores(prefix_k, scale, acc)  # [S, Hkv, Y*G, P]
        m = torch.maximum(m, pre.to_rows(s_pre.amax(dim=-1)))

    p_blk = torch.exp(s_blk - m[..., None])  # [R, Hq, N]
    z = p_blk.sum(dim=-1)
    ppad = p_blk.new_zeros(k * n, hq, n).index_copy_(0, rows, p_blk)
    pb = ppad.view(k, n, hkv, g, n).permute(0, 2, 1, 3, 4).reshape(k, hkv, n * g, n).to(block_v.dtype)
    o = torch.matmul(pb, block_v.permute(0, 2, 1, 3)).to(acc)  # [K, Hkv, N*G, D]
    o = o.view(k, hkv, n, g, d).permute(0, 2, 1, 3, 4).reshape(k * n, hq, d)[rows]  # [R, Hq, D]
    if pre is not None:
        p_pre = torch.exp(s_pre - pre.from_rows(m)[..., None])  # [S, Hkv, Y*G, P]; masked keys: 0
        z = z + pre.to_rows(p_pre.sum(dim=-1))
        pv = prefix_v if prefix_v.dim() == 4 else prefix_v[None]
        o = o + pre.to_rows(torch.matmul(p_pre.to(pv.dtype), pv).to(acc))
    return AttnState(m=m, z=z, o=o / z[..., None])


class _PrefixRows:
    """The packed rows laid out as prefix queries: ``S`` groups (requests) of ``Y`` rows each, ``[S, Hkv, Y*G, D]``.

    One shared prefix: ``S = 1``, ``Y = R`` (every row stacked, the prefix read once). Per-request prefixes: row
    ``j`` goes to its request's group (``group[j]``, by default ``rows[j] // (span / S)``) at its rank inside the
    group, ``Y`` the largest group (zero-padded)."""

    def __init__(self, q4: torch.Tensor, index: torch.Tensor | None, mask: torch.Tensor | None, hq: int) -> None:
        self.q4, self.index, self.mask, self.hq = q4, index, mask, hq  # index [R] into S*Y; mask [S, P] padding

    @classmethod
    def of(cls, q, rows, prefix_k, prefix_len, span: int, group: torch.Tensor | None = None,
           y: int | None = None) -> _PrefixRows:
        """``y``: the largest group's row count when the caller knows it (else read here from the device)."""
        r, hq, d = q.shape
        hkv = prefix_k.shape[-3]
        g = hq // hkv
        if prefix_k.dim() == 3:
            return cls(q.view(1, r, hkv, g, d).permute(0, 2, 1, 3, 4).reshape(1, hkv, r * g, d), None, None, hq)
        s, p = prefix_k.shape[0], prefix_k.shape[2]
        if group is None:  # [R] request of each row (rows ascend, so groups are contiguous)
            group = rows // (span // s)
        sizes = torch.zeros(s, dtype=torch.long, device=q.device).index_add_(0, group, torch.ones_like(group))
        if y is None:
            y = int(sizes.max())  # NOTE: one host read: the padded group size
        rank = torch.arange(r, device=q.device) - (torch.cumsum(sizes, 0) - sizes)[group]
        index = group * y + rank
        qpad = q.new_zeros(s * y, hq, d).index_copy_(0, index, q)
        q4 = qpad.view(s, y, hkv, g, d).permute(0, 2, 1, 3, 4).reshape(s, hkv, y * g, d)
        live = prefix_len if prefix_len is not None else torch.full((s,), p, device=q.device)
        mask = torch.arange(p, device=q.device)[None, :] >= live.to(q.device)[:, None]  # [S, P]
        return cls(q4, index, mask, hq)

    def scores(self, prefix_k: torch.Tensor, scale: float, acc: torch.dtype) -> torch.Tensor:
        pk = prefix_k if prefix_k.dim() == 4 else prefix_k[None]
        s = torch.matmul(self.q4, pk.transpose(-1, -2)).to(acc) * scale  # [S, Hkv, Y*G, P]
        if self.mask is not None:
            s = s.masked_fill(self.mask[:, None, None, :], float("-inf"))
        return s

    def to_rows(self, t: torch.Tensor) -> torch.Tensor:
        """``[S, Hkv, Y*G, ...]`` -> ``[R, Hq, ...]``."""
        s, hkv, yg = t.shape[:3]
        g = self.hq // hkv
        rest = t.shape[3:]
        t = t.view(s, hkv, yg // g, g, *rest).transpose(1, 2).reshape(s * (yg // g), self.hq, *rest)
        return t if self.index is None else t[self.index]

    def from_rows(self, t: torch.Tensor) -> torch.Tensor:
        """``[R, Hq]`` -> ``[S, Hkv, Y*G]`` (padding rows 0)."""
        s, hkv, yg = self.q4.shape[:3]
        g = self.hq // hkv
        if self.index is not None:
            t = t.new_zeros(s * (yg // g), self.hq).index_copy_(0, self.index, t)
        return t.view(s, yg // g, hkv, g).transpose(1, 2).reshape(s, hkv, yg)


# --- split attention: the prefix part per pool row, the block part per (branch, position) -----------------------


def softmax_lse(
    q: torch.Tensor,  # [B, H, L, D] queries
    k: torch.Tensor,  # [B, H, S, D]
    v: torch.Tensor,  # [B, H, S, D]
    bias: torch.Tensor | None,  # [B, 1, 1, S] additive (0 / -inf) in q's dtype, or None
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention output ``o [B, H, L, D]`` (q's dtype) and its log-sum-exp ``[B, H, L]`` (acc dtype). A row whose keys
    are all masked has ``lse = -inf`` (its ``o`` is unused). The streaming state of :mod:`specfold.model.attention`
    is ``(m, Z, O) = (lse, 1, o)``.

    NOTE: on CPU the fused flash kernel (no ``L × S`` score matrix, 5–6× faster than the explicit GEMM + exp form at
    a verification pass's size on this project's AVX2 CPU); elsewhere :func:`softmax_lse_ref`."""
    if q.device.type != "cpu":
        return softmax_lse_ref(q, k, v, bias, scale)
    o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=bias, scale=scale)[:2]
    lse = lse.to(accumulation_dtype(q.dtype))
    if bias is not None:  # the kernel reports lse = 0 for a fully masked row
        lse = lse.masked_fill(bias.amax(dim=-1) == float("-inf"), float("-inf"))
    return o, lse


def softmax_lse_ref(q, k, v, bias, scale) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`softmax_lse` by explicit scores (same signature; the reference the tests compare it with)."""
    acc = accumulation_dtype(q.dtype)
    s = torch.matmul(q, k.transpose(-1, -2)).to(acc) * scale
    if bias is not None:
        s = s + bias.to(acc)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.masked_fill(lse == float("-inf"), 0.0)[..., None])
    return torch.matmul(p.to(v.dtype), v), lse


def attend_split(
    q: torch.Tensor,  # [R, Hq, D] the pool rows' queries (rows[r]'s)
    rows: torch.Tensor,  # [R] long, flat (branch·N + position) of each pool row, ascending
    table: torch.Tensor,  # [K, N] long: pool row each (branch, position) holds (its query's row)
    prefix_k: torch.Tensor | None,  # [Hkv, P, D] shared, [S, Hkv, P, D] per request, or None
    prefix_v: torch.Tensor | None,  # same layout as prefix_k
    block_k: torch.Tensor,  # [K, N, Hkv, D] each branch's own block key table
    block_v: torch.Tensor,  # [K, N, Hkv, D]
    scale: float,
    prefix_len: torch.Tensor | None = None,  # [S] live keys of each request's prefix (4-dim prefix only)
    branch_request: torch.Tensor | None = None,  # [K] long, ascending: each branch's request (4-dim prefix only)
    group_rows: int | None = None,  # the most pool rows of one request (4-dim prefix; None: read from the device)
) -> torch.Tensor:
    """Every (branch, position)'s attention over the prefix and its own branch's block, with its pool row's query.
    Returns ``o [K, N, Hq, D]`` (acc dtype).

    A folded row holds its source's query, so its prefix scores are its source's: the prefix part (``R × P``, the
    expensive one) runs once per pool row; the block part (``K·N × N``) runs for every row over its own branch's
    block K/V; the two streaming states merge exactly (``lse = logaddexp``). No subtraction, so no cancellation
    guard: the same result as direct attention of every row, at the recomputed rows' prefix cost."""
    k, n, hkv, d = block_k.shape
    hq = q.shape[1]
    g = hq // hkv
    acc = accumulation_dtype(q.dtype)
    q_tab = q.index_select(0, table.reshape(-1)).view(k, n, hkv, g, d)
    qb = q_tab.permute(0, 2, 1, 3, 4).reshape(k, hkv, n * g, d)
    o_b, lse_b = softmax_lse(qb, block_k.permute(0, 2, 1, 3), block_v.permute(0, 2, 1, 3), None, scale)
    o_b = o_b.view(k, hkv, n, g, d).permute(0, 2, 1, 3, 4).reshape(k, n, hq, d).to(acc)
    lse_b = lse_b.view(k, hkv, n, g).permute(0, 2, 1, 3).reshape(k, n, hq)
    if prefix_k is None or prefix_k.shape[-2] == 0:
        return o_b
    group = None if branch_request is None else branch_request.index_select(0, rows // n)  # [R]
    pre = _PrefixRows.of(q, rows, prefix_k, prefix_len, k * n, group, group_rows)
    pk, pv = (prefix_k, prefix_v) if prefix_k.dim() == 4 else (prefix_k[None], prefix_v[None])
    bias = None if pre.mask is None else torch.zeros(pre.mask.shape, dtype=q.dtype, device=q.device).masked_fill(
        pre.mask, float("-inf"))[:, None, None, :]
    o_p, lse_p = softmax_lse(pre.q4, pk, pv, bias, scale)  # [S, Hkv, Y*G, D], [S, Hkv, Y*G]
    flat = table.reshape(-1)
    o_p = pre.to_rows(o_p).index_select(0, flat).view(k, n, hq, d).to(acc)
    lse_p = pre.to_rows(lse_p).index_select(0, flat).view(k, n, hq)
    lse = torch.logaddexp(lse_p, lse_b)  # lse_b is finite: every row sees its own block
    return o_p * torch.exp(lse_p - lse)[..., None] + o_b * torch.exp(lse_b - lse)[..., None]
