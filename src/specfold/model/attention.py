"""Attention of block rows over a shared prefix cache and their own block, keeping the streaming-softmax state.

Dims: ``B`` branches (block states verified together), ``T`` block rows, ``P`` cached prefix length,
``Hq`` query heads, ``Hkv`` key/value heads (GQA group ``G = Hq / Hkv``), ``D`` head dim.

The prefix K/V is stored once (``[Hkv, P, D]``) and shared by every branch without being copied: the prefix
part of the scores is one GEMM in which the rows of all branches are stacked as queries. The block part is a
per-branch GEMM. The two parts are merged with the streaming-softmax state ``(m, Z, O)``:

    m = max over keys of s,   Z = Σ e^{s - m},   O = Σ e^{s - m} v / Z

which is exactly the state the folded engine corrects (SPEC §4, Eq. 8), so it is returned rather than hidden.
Scores and the state are kept in fp32 (fp64 for fp64 models); the P·V products run in the value dtype.

A long prefix is streamed: when the prefix scores of all rows and heads would exceed :data:`SCORE_BUDGET`
elements, :func:`attend` visits the prefix in key tiles and merges them with the same ``(m, Z, O)`` rescaling, so
memory stays ``rows × tile`` whatever ``P`` is. Below the budget (32 rows up to 64k positions at 8 query heads)
it is the single-GEMM path, bit for bit. :func:`attend` is the explicit form, the reference of the fused paths
below and of the folded engine's row attention (:mod:`specfold.engine.attention_rows`).

Rows that need no softmax state, only outputs, run through ``torch.nn.functional.scaled_dot_product_attention``
(a flash kernel on CPU and GPU: no ``rows × keys`` scores per head): prefill rows (:func:`attend_prefill`, over the
cache written so far plus the rows' own keys), the dense forward's branch blocks (:func:`attend_fused`, whose
reference is :func:`attend`) and the batched passes' blocks over ragged prefixes (:func:`attend_ragged`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

# NOTE: the largest prefix score tensor (elements, all rows and heads) attend builds in one piece: 2**26 fp32 is
# 256 MiB. Larger ones are streamed in key tiles of at least MIN_TILE keys.
SCORE_BUDGET = 1 << 26
MIN_TILE = 256


@dataclass
class AttnState:
    """Streaming-softmax state per row and head. ``m``, ``z``: ``[B, T, Hq]``; ``o``: ``[B, T, Hq, D]``
    (normalised by ``z``). All in the accumulation dtype (fp32, or fp64 for fp64 inputs)."""

    m: torch.Tensor
    z: torch.Tensor
    o: torch.Tensor


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def block_bias(
    kind: str, n: int, chunk: int, dtype: torch.dtype, device: torch.device | str = "cpu"
) -> torch.Tensor | None:
    """Additive mask ``[n, n]`` for the block part: ``bidirectional`` (None), ``causal`` or ``block_causal``
    (bidirectional inside each ``chunk``-aligned chunk, causal across chunks; rows are assumed to start at a
    chunk boundary)."""
    if kind == "bidirectional":
        return None
    idx = torch.arange(n, device=device)
    if kind == "causal":
        allowed = idx[None, :] <= idx[:, None]
    elif kind == "block_causal":
        allowed = (idx[None, :] // chunk) <= (idx[:, None] // chunk)
    else:
        raise ValueError(f"unknown attention mask kind {kind!r}")
    bias = torch.zeros(n, n, dtype=dtype, device=device)
    return bias.masked_fill(~allowed, float("-inf"))


def attend(
    q: torch.Tensor,  # [B, T, Hq, D] (RoPE'd, query-scaled)
    prefix_k: torch.Tensor | None,  # [Hkv, P, D] shared by every branch, or None when P = 0
    prefix_v: torch.Tensor | None,  # [Hkv, P, D]
    block_k: torch.Tensor,  # [B, S, Hkv, D] each branch's own block keys
    block_v: torch.Tensor,  # [B, S, Hkv, D]
    bias: torch.Tensor | None,  # [T, S] additive (0 / -inf), None = every row sees every block key
    scale: float,
    budget: int | None = SCORE_BUDGET,
) -> AttnState:
    """Rows of every branch over the shared prefix and their own block. ``budget``: the most prefix score
    elements built at once (``None``: no limit); a longer prefix is streamed in key tiles."""
    b, t, hq, d = q.shape
    hkv = block_k.shape[2]
    g = hq // hkv
    acc = accumulation_dtype(q.dtype)
    qg = q.view(b, t, hkv, g, d)

    # Block part: [B, Hkv, T*G, S]
    qb = qg.permute(0, 2, 1, 3, 4).reshape(b, hkv, t * g, d)
    kb = block_k.permute(0, 2, 3, 1)  # [B, Hkv, D, S]
    s_blk = torch.matmul(qb, kb).to(acc) * scale
    s_blk = s_blk.view(b, hkv, t, g, -1)
    if bias is not None:
        s_blk = s_blk + bias.to(acc)[None, None, :, None, :]
    m = s_blk.amax(dim=-1)  # [B, Hkv, T, G]

    s_pre = qp = None
    tile = 0
    if prefix_k is not None and prefix_k.shape[1] > 0:
        # NOTE: all branches' rows are stacked as queries so the shared prefix is read once, never expanded.
        qp = qg.permute(2, 0, 1, 3, 4).reshape(hkv, b * t * g, d)  # [Hkv, B*T*G, D]
        p_len, rows = prefix_k.shape[1], hkv * b * t * g
        tile = p_len if budget is None or rows * p_len <= budget else max(MIN_TILE, budget // rows)
        if tile >= p_len:
            s_pre = torch.matmul(qp, prefix_k.transpose(1, 2)).to(acc) * scale  # [Hkv, B*T*G, P]
            s_pre = s_pre.view(hkv, b, t, g, -1).permute(1, 0, 2, 3, 4)  # [B, Hkv, T, G, P]
            m = torch.maximum(m, s_pre.amax(dim=-1))

    p_blk = torch.exp(s_blk - m[..., None])
    z = p_blk.sum(dim=-1)
    vb = block_v.permute(0, 2, 1, 3)  # [B, Hkv, S, D]
    o = torch.matmul(p_blk.reshape(b, hkv, t * g, -1).to(block_v.dtype), vb).to(acc).view(b, hkv, t, g, d)
    if s_pre is not None:
        p_pre = torch.exp(s_pre - m[..., None])
        z = z + p_pre.sum(dim=-1)
        pp = p_pre.permute(1, 0, 2, 3, 4).reshape(hkv, b * t * g, -1).to(prefix_v.dtype)
        o = o + torch.matmul(pp, prefix_v).to(acc).view(hkv, b, t, g, d).permute(1, 0, 2, 3, 4)
    elif qp is not None:
        m, z, o = _stream_prefix(qp, prefix_k, prefix_v, m, z, o, tile, scale)
    o = o / z[..., None]
    # [B, Hkv, T, G, ...] -> [B, T, Hq, ...]
    return AttnState(
        m=m.permute(0, 2, 1, 3).reshape(b, t, hq),
        z=z.permute(0, 2, 1, 3).reshape(b, t, hq),
        o=o.permute(0, 2, 1, 3, 4).reshape(b, t, hq, d),
    )


def _stream_prefix(
    qp: torch.Tensor,  # [Hkv, B*T*G, D] stacked query rows
    prefix_k: torch.Tensor,  # [Hkv, P, D]
    prefix_v: torch.Tensor,  # [Hkv, P, D]
    m: torch.Tensor,  # [B, Hkv, T, G] state of the block part
    z: torch.Tensor,  # [B, Hkv, T, G]
    o: torch.Tensor,  # [B, Hkv, T, G, D] unnormalised
    tile: int,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Merge the prefix into ``(m, Z, O)`` one key tile at a time (online softmax); ``O`` stays unnormalised."""
    b, hkv, t, g, d = o.shape
    acc = m.dtype
    # Work in the prefix GEMM's layout [Hkv, B, T, G, ...]; permute back at the end.
    m, z, o = m.transpose(0, 1), z.transpose(0, 1), o.transpose(0, 1)
    for start in range(0, prefix_k.shape[1], tile):
        kt, vt = prefix_k[:, start : start + tile], prefix_v[:, start : start + tile]
        s = (torch.matmul(qp, kt.transpose(1, 2)).to(acc) * scale).view(hkv, b, t, g, -1)
        m_new = torch.maximum(m, s.amax(dim=-1))
        alpha = torch.exp(m - m_new)
        p = torch.exp(s - m_new[..., None])
        z = z * alpha + p.sum(dim=-1)
        pv = torch.matmul(p.reshape(hkv, b * t * g, -1).to(vt.dtype), vt).to(acc).view(hkv, b, t, g, d)
        o = o * alpha[..., None] + pv
        m = m_new
    return m.transpose(0, 1), z.transpose(0, 1), o.transpose(0, 1)


def attend_prefill(
    q: torch.Tensor,  # [T, Hq, D] (RoPE'd, query-scaled) rows being prefilled
    k: torch.Tensor,  # [Hkv, S, D] every key the rows may see: the cache so far, then the rows' own
    v: torch.Tensor,  # [Hkv, S, D]
    bias: torch.Tensor | None,  # [T, S] additive (0 / -inf) in q's dtype, None = every row sees every key
    scale: float,
    causal: bool = False,
) -> torch.Tensor:
    """Attention outputs ``[T, Hq, D]`` (q's dtype) through the fused SDPA kernel; no softmax state is kept.
    ``causal`` (with ``bias=None``, ``S == T``): row ``i`` sees keys ``<= i``, and the kernel skips the rest."""
    gqa = q.shape[1] != k.shape[0]
    o = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k[None], v[None], attn_mask=bias, scale=scale, is_causal=causal, enable_gqa=gqa
    )  # [1, Hq, T, D]
    return o[0].transpose(0, 1)



def attend_fused(
    q: torch.Tensor,  # [B, T, Hq, D] (RoPE'd, query-scaled)
    prefix_k: torch.Tensor | None,  # [Hkv, P, D] shared by every branch, or None when P = 0
    prefix_v: torch.Tensor | None,  # [Hkv, P, D]
    block_k: torch.Tensor,  # [B, S, Hkv, D] each branch's own block keys (S = T where bias is given)
    block_v: torch.Tensor,  # [B, S, Hkv, D]
    bias: torch.Tensor | None,  # [T, T] additive inside the block, None = every row sees every block key
    scale: float,
) -> torch.Tensor:
    """:func:`attend`'s output ``o [B, T, Hq, D]`` (q's dtype) through the fused SDPA kernel, without the softmax
    state (its reference: ``attend(...).o``). The dense forward's attention: on CPU a flash kernel, no ``rows × keys``
    scores per head; each branch's keys are the prefix (copied once per branch, grouped under
    :data:`SCORE_BUDGET` like :func:`attend_ragged`) followed by its block. NOTE: one branch's copy is one layer's
    prefix K/V, transient, whatever the budget (at a 64k prefix with 8 KV heads of 128 dims: 134 MB each in bf16);
    :func:`attend` streams the prefix in tiles where even that must be avoided. ``scripts/dense_attention_ab.py`` times
    the embedded model's dense pass with either form (docs/results.md: eager passes 10–24 % shorter at 1–8 branches)."""
    b = q.shape[0]
    if prefix_k is None or prefix_k.shape[1] == 0:
        return _ragged_group(q, None, None, None, None, block_k, block_v, bias, scale)
    request = torch.zeros(b, dtype=torch.long, device=q.device)
    return attend_ragged(q, prefix_k[None], prefix_v[None], None, request, block_k, block_v, bias, scale)


def attend_ragged(
    q: torch.Tensor,  # [B, T, Hq, D] (RoPE'd, query-scaled): branch blocks of several requests
    prefix_k: torch.Tensor,  # [S, Hkv, P, D] each request's prefix, padded past its length (a view)
    prefix_v: torch.Tensor,  # [S, Hkv, P, D]
    lengths: torch.Tensor | None,  # [S] long, each request's cached length (<= P); None: every key is live
    request: torch.Tensor,  # [B] long: the request each branch belongs to
    block_k: torch.Tensor,  # [B, T, Hkv, D] each branch's own block keys
    block_v: torch.Tensor,  # [B, T, Hkv, D]
    bias: torch.Tensor | None,  # [T, T] additive inside the block, None = bidirectional
    scale: float,
) -> torch.Tensor:
    """Branch blocks of several requests, each over its request's ragged prefix and its own block. Returns
    ``o [B, T, Hq, D]`` in q's dtype, as the fused kernel writes it (it accumulates in fp32 inside; widening its
    output would add no digits, only two copies per layer); no softmax state (the folded engine's Eq. 8 path keeps
    its own).

    Only the branches given are computed (requests may have different numbers of branches: no padding blocks).
    One fused SDPA call per group of branches: each branch's keys are its request's prefix followed by its own
    block, padded prefix keys masked. The prefix is gathered per branch (a copy of ``P`` keys per branch, far
    cheaper than the ``rows × P`` score passes it replaces: measured 8 ms vs 34 ms for 8 requests × 8 branches at
    P = 200 on this project's CPU); branches are grouped so one copy stays under :data:`SCORE_BUDGET` elements."""
    b, t, hq, d = q.shape
    hkv, p_len = block_k.shape[2], prefix_k.shape[2]
    request = request.to(q.device)
    live = None if lengths is None else lengths.to(q.device).index_select(0, request)  # [B] each branch's prefix
    # NOTE: no loop over a range of b and no division in the test: under torch.compile the one would specialise every
    # block count, the other make a floor-division symbol (slow to simplify)
    if b * (p_len + t) * hkv * d <= SCORE_BUDGET:
        return _ragged_group(q, prefix_k, prefix_v, live, request, block_k, block_v, bias, scale)
    group = max(1, SCORE_BUDGET // max(1, (p_len + t) * hkv * d))
    outs = [_ragged_group(q[a:a + group], prefix_k, prefix_v, None if live is None else live[a:a + group],
                          request[a:a + group],
                          block_k[a:a + group], block_v[a:a + group], bias, scale) for a in range(0, b, group)]
    return torch.cat(outs)


def _ragged_group(
    q: torch.Tensor,  # [n, T, Hq, D]
    prefix_k: torch.Tensor | None,  # [S, Hkv, P, D], or None: no prefix
    prefix_v: torch.Tensor | None,  # [S, Hkv, P, D]
    live: torch.Tensor | None,  # [n] long: each branch's prefix length; None: all P keys
    request: torch.Tensor | None,  # [n] long
    block_k: torch.Tensor,  # [n, T, Hkv, D]
    block_v: torch.Tensor,  # [n, T, Hkv, D]
    bias: torch.Tensor | None,  # [T, T]
    scale: float,
) -> torch.Tensor:
    """:func:`attend_ragged` for one group of branches: ``o [n, T, Hq, D]``. The SDPA mask is built only where a key
    is masked (padding or ``bias``): the kernel is faster without one."""
    n, t, hq, _ = q.shape
    hkv = block_k.shape[2]
    p_len = 0 if prefix_k is None else prefix_k.shape[2]
    qs = q.transpose(1, 2)  # [n, Hq, T, D]
    bk = block_k.transpose(1, 2)  # [n, Hkv, T, D]
    bv = block_v.transpose(1, 2)
    mask = None
    if live is not None or bias is not None:
        mask = torch.zeros(n if live is not None else 1, 1, t, p_len + t, dtype=q.dtype, device=q.device)
    if p_len:
        if live is not None:
            pad = torch.arange(p_len, device=q.device)[None, :] >= live[:, None]  # [n, P]
            mask[:, 0, :, :p_len].masked_fill_(pad[:, None, :], float("-inf"))
        bk = torch.cat([prefix_k.index_select(0, request), bk], dim=2)  # [n, Hkv, P+T, D]
        bv = torch.cat([prefix_v.index_select(0, request), bv], dim=2)
    if bias is not None:
        mask[:, 0, :, p_len:] = bias.to(q.dtype)
    o = F.scaled_dot_product_attention(qs, bk, bv, attn_mask=mask, scale=scale, enable_gqa=bool(hq != hkv))
    return o.transpose(1, 2)
