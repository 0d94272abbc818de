"""PyTorch references of the Triton kernels: ``<op>_ref`` with the signature of the kernel launcher ``<op>``.

Dims: ``K`` branches, ``N`` block positions, ``M = K·N`` hidden-state rows, ``E`` hidden size, ``F`` FFN size,
``R`` recomputed rows (pool rows), ``P`` prefix length, ``Hq``/``Hkv`` heads, ``D`` head dim.

Each reference is a thin wrapper over the torch engine's own functions (:mod:`specfold.engine.gate`,
:mod:`~specfold.engine.attention_rows`, :mod:`~specfold.engine.correction`, :class:`~specfold.model.transformer.Layer`),
so a kernel that matches its reference matches the torch backend. Only the index plumbing differs: the kernels
take the gate's per-branch lists and pool tables where the torch engine sorts. Nothing here imports Triton; the
result containers (:class:`GateCompact`, :class:`FoldCorrection`) are defined here and shared with the kernels.

==================  ==============================================================
kernel (``kernels``)  reference
==================  ==============================================================
``gate_compact``      :func:`gate_compact_ref`
``resolve_sources``   :func:`resolve_sources_ref`
``qkv_rope``          :func:`qkv_rope_ref`
``attend_rows``       :func:`attend_rows_ref`
``correct_folded``    :func:`correct_folded_ref`
``ffn_rows``          :func:`ffn_rows_ref`
``linear_rows``       :func:`linear_rows_ref`
==================  ==============================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch

from specfold.engine.attention_rows import attend_rows
from specfold.engine.correction import correct_rows
from specfold.engine.gate import fold_mask, relative_residual, resolve_sources
from specfold.model.attention import AttnState
from specfold.model.transformer import Layer

NOT_CORRECTED, CORRECTED, GUARDED = 0, 1, 2  # FoldCorrection.flag values


@dataclass
class GateCompact:
    """Gate (Eq. 4/5) and compaction of one layer. The lists' order is unspecified (the kernel's comes from
    atomic counters): index by ``slot``, or compare lists as sets."""

    rho: torch.Tensor  # [K, N] fp64 Eq. 4 (row 0 = +inf)
    recompute: torch.Tensor  # [K, N] bool
    hop: torch.Tensor  # [K, N] long: self if recomputed, else the parent (one hop of the fold chain)
    slot: torch.Tensor  # [K, N] int32: slot in the global list ``rows`` of a recomputed row, -1 if folded
    rows: torch.Tensor  # [K*N] int32: flat ``branch·N + position`` of recomputed rows; the first ``count`` valid
    branch_lists: torch.Tensor  # [K, N] int32: recomputed positions per branch; first ``branch_counts[i]`` valid
    branch_counts: torch.Tensor  # [K] int32
    count: torch.Tensor  # [1] int32: R


@dataclass
class FoldCorrection:
    """Eq. 8 results per (branch, position), flat ``K·N``; only rows with ``flag > 0`` are meaningful."""

    m: torch.Tensor  # [K*N, Hq] m'
    z: torch.Tensor  # [K*N, Hq] Z'
    o: torch.Tensor  # [K*N, Hq, D] O'
    flag: torch.Tensor  # [K*N] int8: 0 recomputed or Δ = ∅, 1 corrected, 2 corrected and flagged by the guard


def gate_compact_ref(
    h: torch.Tensor,  # [K, N, E]
    parents: torch.Tensor,  # [K] long, parents[0] = -1
    delta: float,
    fold: torch.Tensor | None = None,  # [K, N] bool imposed fold decisions
) -> GateCompact:
    k, n, _ = h.shape
    rho = relative_residual(h, parents)
    folded = fold_mask(rho, delta, parents) if fold is None else fold.clone()
    folded &= (parents >= 0).to(h.device)[:, None]  # a root (a request's main branch) never folds
    rec = ~folded
    flat = rec.reshape(-1)
    slot = torch.where(rec, (torch.cumsum(flat, 0) - 1).view(k, n), -1).to(torch.int32)
    rows = torch.full((k * n,), -1, dtype=torch.int32, device=h.device)
    listed = flat.nonzero().squeeze(1)
    rows[: listed.numel()] = listed.to(torch.int32)
    counts = rec.sum(dim=1).to(torch.int32)
    # recomputed positions first, ascending; the tail is padding
    order = torch.sort((~rec).to(torch.int8), dim=1, stable=True).indices
    pos = torch.arange(n, device=h.device)
    lists = torch.where(pos[None, :] < counts[:, None], order, -1).to(torch.int32)
    par = parents.to(h.device).clamp(min=0)[:, None].expand(k, n)
    hop = torch.where(rec, torch.arange(k, device=h.device)[:, None], par)
    count = torch.tensor([listed.numel()], dtype=torch.int32, device=h.device)
    return GateCompact(rho, rec, hop, slot, rows, lists, counts, count)


def resolve_sources_ref(
    recompute: torch.Tensor,  # [K, N] bool
    parents: torch.Tensor,  # [K] long
    slot: torch.Tensor,  # [K, N] int: pool slot of recomputed rows
) -> tuple[torch.Tensor, torch.Tensor]:
    src = resolve_sources(recompute, parents)
    return src, slot.long().gather(0, src)


def qkv_rope_ref(
    h: torch.Tensor,  # [M, E]
    rows: torch.Tensor,  # [R] int
    norm_weight: torch.Tensor,  # [E]
    eps: float,
    w_qkv: torch.Tensor,  # [(Hq + 2·Hkv)·D, E]
    b_qkv: torch.Tensor | None,  # [(Hq + 2·Hkv)·D]
    cos: torch.Tensor,  # [N, D]
    sin: torch.Tensor,  # [N, D]
    qscale: torch.Tensor | None,  # [N]
    num_heads: int,
    num_kv_heads: int,
    count: torch.Tensor | None = None,  # [1] int: only rows[:count] computed; the rest of the pools is zero
    q_norm: torch.Tensor | None = None,  # [D] per-head RMSNorm on q (qk-norm), or None
    k_norm: torch.Tensor | None = None,  # [D] on k
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    d = w_qkv.shape[0] // (num_heads + 2 * num_kv_heads)
    if count is not None:
        live = qkv_rope_ref(h, rows[: int(count)], norm_weight, eps, w_qkv, b_qkv, cos, sin, qscale, num_heads,
                            num_kv_heads, q_norm=q_norm, k_norm=k_norm)
        return tuple(torch.cat([t, t.new_zeros(rows.shape[0] - t.shape[0], *t.shape[1:])]) for t in live)
    layer = SimpleNamespace(input_norm=norm_weight, eps=eps, wqkv=w_qkv, bqkv=b_qkv, hq=num_heads,
                            hkv=num_kv_heads, d=d, q_norm=q_norm, k_norm=k_norm)
    rows = rows.long()
    pos = rows % cos.shape[0]
    return Layer.qkv(layer, h[rows], cos[pos], sin[pos], None if qscale is None else qscale[pos])


def attend_rows_ref(
    q: torch.Tensor,  # [Rq, Hq, D]
    qrow: torch.Tensor,  # [K, N] int
    lists: torch.Tensor,  # [K, N] int
    counts: torch.Tensor,  # [K] int
    prefix_k: torch.Tensor | None,  # [Hkv, P, D] or [S, Hkv, P, D] (S requests of K/S branches)
    prefix_v: torch.Tensor | None,
    pool_k: torch.Tensor,  # [Rk, Hkv, D]
    pool_v: torch.Tensor,  # [Rk, Hkv, D]
    table: torch.Tensor,  # [K, N] int
    scale: float,
    orow: torch.Tensor,  # [K, N] int
    out_rows: int,
    prefix_len: torch.Tensor | None = None,  # [1] or [S] int: live keys of each request's prefix view
) -> AttnState:
    k, n = table.shape
    if prefix_k is not None and prefix_k.dim() == 4 and prefix_k.stride(0) == 0:  # one prefix, broadcast
        prefix_k, prefix_v = prefix_k[0], prefix_v[0]
    if prefix_len is not None and prefix_k is not None and prefix_k.dim() == 3:
        live = int(prefix_len[0])
        prefix_k, prefix_v = prefix_k[..., :live, :], prefix_v[..., :live, :]
    elif prefix_len is not None and prefix_k is not None:
        prefix_len = prefix_len.long().expand(prefix_k.shape[0])
    listed = torch.arange(n, device=q.device)[None, :] < counts[:, None].long()
    rows = ((torch.arange(k, device=q.device)[:, None] * n + lists.long().clamp(min=0))[listed])  # [R']
    table = table.long()
    st = attend_rows(q[qrow.reshape(-1)[rows].long()], rows, prefix_k, prefix_v, pool_k[table],
                                    pool_v[table], scale, prefix_len if prefix_k is not None and prefix_k.dim() == 4
                                    else None)
    dest = orow.reshape(-1)[rows].long()
    hq, d = q.shape[1:]
    m = st.m.new_zeros(out_rows, hq).index_copy_(0, dest, st.m)
    z = st.z.new_zeros(out_rows, hq).index_copy_(0, dest, st.z)
    o = st.o.new_zeros(out_rows, hq, d).index_copy_(0, dest, st.o)
    return AttnState(m=m, z=z, o=o)


def correct_folded_ref(
    q: torch.Tensor,  # [R, Hq, D]
    m: torch.Tensor,  # [R, Hq]
    z: torch.Tensor,  # [R, Hq]
    o: torch.Tensor,  # [R, Hq, D]
    pool_k: torch.Tensor,  # [R, Hkv, D]
    pool_v: torch.Tensor,  # [R, Hkv, D]
    table: torch.Tensor,  # [K, N] int
    src: torch.Tensor,  # [K, N] int
    recompute: torch.Tensor,  # [K, N] bool
    parents: torch.Tensor,  # [K] long (the torch engine gets the chains from src alone)
    scale: float,
    guard: float,
) -> FoldCorrection:
    k, n = table.shape
    table, src = table.long(), src.long()
    fold_rows = (~recompute.reshape(-1)).nonzero().squeeze(1)
    branch_rows = table[fold_rows // n]
    source_rows = table[src.reshape(-1)[fold_rows]]
    dmask = branch_rows != source_rows
    changed = dmask.any(dim=1)
    rows = fold_rows[changed]
    s = table.reshape(-1)[rows]
    fix = correct_rows(q[s], m[s], z[s], o[s], pool_k, pool_v, branch_rows[changed], source_rows[changed],
                       dmask[changed], scale, guard)
    hq, d = q.shape[1:]
    flag = torch.zeros(k * n, dtype=torch.int8, device=q.device)
    flag[rows] = (CORRECTED + fix.flagged.to(torch.int8)).to(torch.int8)
    return FoldCorrection(
        m=fix.m.new_zeros(k * n, hq).index_copy_(0, rows, fix.m),
        z=fix.z.new_zeros(k * n, hq).index_copy_(0, rows, fix.z),
        o=fix.o.new_zeros(k * n, hq, d).index_copy_(0, rows, fix.o),
        flag=flag,
    )


def ffn_rows_ref(
    h: torch.Tensor,  # [M, E]
    rows: torch.Tensor,  # [R] int
    norm_weight: torch.Tensor,  # [E]
    eps: float,
    w_gate_up: torch.Tensor,  # [2F, E]
    w_down: torch.Tensor,  # [E, F]
    out: torch.Tensor,  # [M, E]
    count: torch.Tensor | None = None,  # [1] int: only rows[:count] computed
) -> torch.Tensor:
    layer = SimpleNamespace(post_norm=norm_weight, eps=eps, w_gate_up=w_gate_up, w_down=w_down)
    rows = rows.long()[: None if count is None else int(count)]
    out[rows] = Layer.ffn(layer, h[rows])
    return out


def linear_rows_ref(
    x: torch.Tensor,  # [R, F] (with gather: [M, F])
    rows: torch.Tensor,  # [R] int
    w: torch.Tensor,  # [E, F]
    out: torch.Tensor,  # [M, E]
    count: torch.Tensor | None = None,  # [1] int: only rows[:count] projected
    gather: bool = False,
) -> torch.Tensor:
    rows = rows.long()[: None if count is None else int(count)]
    out[rows] = torch.nn.functional.linear(x[rows] if gather else x[: rows.shape[0]], w)
    return out
