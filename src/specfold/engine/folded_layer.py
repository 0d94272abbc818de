"""One folded layer given its plan (:mod:`specfold.engine.plan`), torch backend: SPEC §4 steps 2–6 as
:mod:`specfold.engine.folded` lists them — Q/K/V of the recomputed rows, their direct attention, Eq. 8 for folded
rows whose context changed, the o_proj, and the FFN under its own gate.

Dims: ``K`` branches, ``N`` block positions, ``E`` hidden size, ``Hq``/``Hkv`` heads, ``D`` head dim, ``R``
recomputed rows of the layer (packed over all branches), ``G`` guard fallbacks.

The Triton backend's layer step (:func:`specfold.engine.triton_backend.folded_layer_triton`) has the same
signature as :func:`folded_layer`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specfold.engine.attention_rows import attend_rows, attend_split
from specfold.engine.correction import correct_rows
from specfold.engine.cost import LayerCost
from specfold.engine.gate import fold_mask, relative_residual
from specfold.engine.layer_types import FoldConfig, LayerContext, LayerCounts, LayerTrace
from specfold.engine.plan import FoldPlan, StaticPlan, correction_plan, dense_plan, pool_index, pool_rows
from specfold.engine.profiling import part
from specfold.model.attention import accumulation_dtype, attend_fused, attend_ragged
from specfold.model.linear import bucket_index
from specfold.model.transformer import Layer


def take(pool: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """``pool[table]`` for a pool ``[R, ...]`` and an index table ``[K, N]``: ``[K, N, ...]`` (index_select, several
    times faster than advanced indexing on CPU)."""
    return pool.index_select(0, table.reshape(-1)).view(*table.shape, *pool.shape[1:])


def qkv_rows(
    layer: Layer,
    h: torch.Tensor,  # [K*N, E] layer input
    rows: torch.Tensor,  # [R] flat row indices
    ctx: LayerContext,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """RMSNorm + fused QKV GEMM + RoPE on the packed rows only. Returns q ``[R, Hq, D]``, k, v ``[R, Hkv, D]``."""
    r = rows.shape[0]
    idx = bucket_index(rows, h)  # GEMM-ready row count, no padding copy
    pos = idx % ctx.cos.shape[0]
    qscale = None if ctx.qscale is None else ctx.qscale.index_select(0, pos)
    q, k, v = layer.qkv(h.index_select(0, idx), ctx.cos.index_select(0, pos), ctx.sin.index_select(0, pos), qscale)
    return q[:r], k[:r], v[:r]


def ffn_rows(
    layer: Layer,
    h: torch.Tensor,  # [K*N, E] post-attention residual
    rows: torch.Tensor,  # [R] flat row indices
) -> torch.Tensor:
    """RMSNorm + gate/up GEMM + SiLU·mul + down on the packed rows only. Returns ``[R, E]``."""
    return layer.ffn(h.index_select(0, bucket_index(rows, h)))[: rows.shape[0]]


@dataclass
class _Attention:
    """What the attention part of a layer hands to the FFN part and to the trace."""

    h1: torch.Tensor  # [K*N, E] post-attention residual
    q: torch.Tensor | None  # [K, N, Hq, D] each row's (possibly inherited) query (direct attention: traces only)
    k: torch.Tensor  # [K, N, Hkv, D] each branch's block keys
    v: torch.Tensor  # [K, N, Hkv, D]
    o: torch.Tensor  # [K, N, Hq, D] attention output (acc dtype; the model dtype from fused attention)
    flagged: torch.Tensor  # [G] long: rows the guard sent to direct attention
    guard: torch.Tensor  # [K] number of those rows per branch
    corrected: torch.Tensor  # [K] folded rows per branch whose attention Eq. 8 corrected


def folded_layer(
    layer: Layer,
    h: torch.Tensor,  # [K*N, E] layer input (model dtype)
    plan: FoldPlan,
    ctx: LayerContext,
    prefix_k: torch.Tensor | None,  # [Hkv, P, D], or [R, Hkv, P, D] per request (see LayerContext)
    prefix_v: torch.Tensor | None,  # same layout as prefix_k
    cfg: FoldConfig,
    trace: bool = False,
    cost: LayerCost | None = None,
) -> tuple[torch.Tensor, LayerCounts, LayerTrace | None]:
    """One SpecFold layer (SPEC §4 steps 2–6) given the layer's plan. Returns ``H_next [K*N, E]``.

    The attention part runs as ``cfg.attention`` says: ``"correct"`` (Eq. 8 for folded rows whose context
    changed), ``"direct"`` (every row's attention computed directly over its branch's own, partly inherited K/V in
    one batched call — the same result, cheaper when attention is a small share of the layer) or ``"auto"``: the
    cheaper of the two by ``cost`` (:mod:`specfold.engine.cost`), or a dense attention part when even that does not
    pay (``cfg.dense_fallback``). The FFN part gets the same choice, made after its own gate."""
    k, n = plan.recompute.shape
    m, r = k * n, plan.rows.numel()
    mode = cfg.attention
    if cost is not None:
        options = ("direct", "correct") if mode == "auto" else (mode,)
        prefix = 0 if prefix_k is None else prefix_k.shape[-2]
        options += ("dense",) if cfg.dense_fallback else ()
        # Eq. 8's cost grows with the corrected rows C and the others' do not depend on it: decided at C = 0 first,
        # C (a host read, as r's: the torch engine's row counts are host ints) is counted only where Eq. 8 could win
        mode = cost.attention_plan(m, n, prefix, r, 0, options)
        if mode == "correct":
            mode = cost.attention_plan(m, n, prefix, r, int(plan.changed.sum()), options)
    elif mode == "auto":  # no cost rule: Eq. 8
        mode = "correct"
    if mode == "dense" and r < m:
        plan = dense_plan(plan.rho)
    if plan.rows.numel() == m or mode == "direct":
        att = _direct_attention(layer, h, plan, ctx, prefix_k, prefix_v, trace)
    else:
        att = _corrected_attention(layer, h, plan, ctx, prefix_k, prefix_v, cfg.guard)
    h2, f_tab, ffn_recompute = _ffn_step(layer, att.h1, plan, ctx, cfg, cost)
    counts = LayerCounts(
        folded=(~plan.recompute).sum(dim=1), ffn_folded=(~ffn_recompute).sum(dim=1),
        guard=att.guard, recomputed=plan.recompute.sum(dim=1),
        corrected=att.corrected,
        dense=plan.rows.numel() == m,
    )
    info = None
    if trace:
        info = LayerTrace(
            h=h.view(k, n, -1).clone(), rho=plan.rho, recompute=plan.recompute, src=plan.src, q=att.q, k=att.k,
            v=att.v, o=att.o.to(accumulation_dtype(h.dtype)), f=f_tab.view(k, n, -1), flagged=att.flagged,
            h1=att.h1.view(k, n, -1).clone(), ffn_recompute=ffn_recompute,
        )
    return h2, counts, info


def _direct_attention(layer, h, plan, ctx, prefix_k, prefix_v, trace: bool = False) -> _Attention:
    """Every row's attention computed directly over its branch's own (partly inherited) block K/V. A dense plan runs
    the dense pass's attention; otherwise the prefix part runs once per pool row (a folded row's query, hence its
    prefix scores, are its source's) and the block part per row (:func:`attend_split`). The query table of every
    row is gathered for a ``trace`` only (``q`` is None otherwise)."""
    k, n = plan.recompute.shape
    with part("qkv"):
        q, kk, vv = qkv_rows(layer, h, plan.rows, ctx)
    dense = plan.rows.numel() == k * n
    if dense:  # the pool is the table
        q_tab, k_tab, v_tab = q.view(k, n, *q.shape[1:]), kk.view(k, n, *kk.shape[1:]), vv.view(k, n, *vv.shape[1:])
    else:
        with part("packing"):
            k_tab, v_tab = take(kk, plan.table), take(vv, plan.table)
    with part("attention"):
        if not dense:
            o = attend_split(q, plan.rows, plan.table, prefix_k, prefix_v, k_tab, v_tab, ctx.scale, ctx.prefix_len,
                             ctx.branch_request)
        elif prefix_k is not None and prefix_k.dim() == 4:  # several requests, each over its own prefix
            s = prefix_k.shape[0]
            live = ctx.prefix_len if ctx.prefix_len is not None else torch.full((s,), prefix_k.shape[2])
            request = ctx.branch_request
            if request is None:
                request = torch.arange(s, device=h.device).repeat_interleave(k // s)
            o = attend_ragged(q_tab, prefix_k, prefix_v, live.long(), request, k_tab, v_tab, None, ctx.scale)
        else:
            o = attend_fused(q_tab, prefix_k, prefix_v, k_tab, v_tab, None, ctx.scale)
    with part("o_proj"):
        h1 = h + layer.attn_out(o.to(h.dtype).reshape(k * n, *q.shape[1:]))
    zero = torch.zeros(k, dtype=torch.long, device=h.device)
    q_tab = q_tab if dense else take(q, plan.table) if trace else None
    return _Attention(h1=h1, q=q_tab, k=k_tab, v=v_tab, o=o, flagged=zero[:0], guard=zero, corrected=zero)


def _corrected_attention(layer, h, plan, ctx, prefix_k, prefix_v, guard: float) -> _Attention:
    """Direct attention for recomputed rows, Eq. 8 for folded rows whose context changed (guarded), and the
    o_proj GEMM on those rows only: a folded row with Δ = ∅ has exactly its source's ``O``, hence its ``W_o·O``."""
    k, n = plan.recompute.shape
    with part("packing"):
        fix_plan = correction_plan(plan)
    rows, corrected, table = plan.rows, fix_plan.corrected, plan.table
    with part("qkv"):
        q, kk, vv = qkv_rows(layer, h, rows, ctx)  # the layer's Q/K/V pools
    with part("packing"):
        k_tab, v_tab = take(kk, table), take(vv, table)  # [K, N, Hkv, D] each branch's block K/V
    with part("attention"):
        state = attend_rows(q, rows, prefix_k, prefix_v, k_tab, v_tab, ctx.scale, ctx.prefix_len, ctx.branch_request)
    with part("correction"):
        src_slot = table.reshape(-1)[corrected]  # [C] pool row of each corrected row's source
        q_c = q[src_slot]
        fix = correct_rows(
            q_c, state.m[src_slot], state.z[src_slot], state.o[src_slot], kk, vv,
            fix_plan.branch_rows, fix_plan.source_rows, fix_plan.delta, ctx.scale, guard,
        )
        o_c = fix.o
        hit = fix.flagged.nonzero().squeeze(1)  # [G] guard fallbacks, recomputed by direct attention
        flagged = corrected[hit]
        if hit.numel():
            direct = attend_rows(q_c[hit], flagged, prefix_k, prefix_v, k_tab, v_tab, ctx.scale, ctx.prefix_len,
                                 ctx.branch_request)
            o_c = o_c.index_copy(0, hit, direct.o)
        o_all = torch.cat([state.o, o_c])  # [R + C, Hq, D]
    with part("o_proj"):
        attn = layer.attn_out(o_all.to(h.dtype))
    with part("packing"):
        h1 = h + attn.index_select(0, fix_plan.out_index)
        o_tab = o_all.index_select(0, fix_plan.out_index).view(k, n, *state.o.shape[1:])
    return _Attention(h1=h1, q=take(q, table), k=k_tab, v=v_tab, o=o_tab, flagged=flagged,
                      guard=torch.bincount(flagged // n, minlength=k),
                      corrected=torch.bincount(corrected // n, minlength=k))


def _ffn_step(
    layer: Layer,
    h1: torch.Tensor,  # [K*N, E] post-attention residual
    plan: FoldPlan,
    ctx: LayerContext,
    cfg: FoldConfig,
    cost: LayerCost | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SPEC §4 step 6 with the chosen FFN gate. Returns ``H_next [K*N, E]``, the FFN table ``[K*N, E]`` and the
    FFN's recompute mask ``[K, N]``."""
    k, n = plan.recompute.shape
    with part("gate"):
        if cfg.ffn == "residual":
            rho_f = relative_residual(h1.view(k, n, -1), ctx.graph, exact_zero=cfg.delta == 0)
            ffn_recompute = ~fold_mask(rho_f, cfg.delta, ctx.graph)
        else:
            ffn_recompute = plan.recompute
        r_ffn = int(ffn_recompute.sum())
    if r_ffn == k * n or (cfg.dense_fallback and cost is not None and not cost.ffn_folds(k * n, r_ffn)):
        with part("ffn"):
            f_tab = layer.ffn(h1)
            return h1 + f_tab, f_tab, torch.ones_like(ffn_recompute)
    with part("packing"):
        if ffn_recompute is plan.recompute:
            ff_rows, ff_table = plan.rows, plan.table
        else:
            _, ff_rows, ff_table = pool_index(ffn_recompute, ctx.graph)
    with part("ffn"):
        f_pool = ffn_rows(layer, h1, ff_rows)
    with part("packing"):
        f_tab = f_pool.index_select(0, ff_table.reshape(-1))
        return h1 + f_tab, f_tab, ffn_recompute


# --- the layer in static shapes with bucketed pools (compiled by specfold.engine.compiled) -----------------------
#
# The same layer as folded_layer with attention "direct" (split, attend_split) and the FFN under its gate, cut into
# pieces whose shapes are fixed by (K, N, the pool bucket, P): compaction is a scatter to ranks (StaticPlan), a pool
# is the first `size` rows of the plan's order, padded to a bucket, and nothing inside reads the host. The compiled
# layer reads each pool's count once (two reads per layer: the attention pool, the FFN pool) to pick its bucket.


def attention_pooled(
    layer: Layer,
    h: torch.Tensor,  # [K*N, E] layer input
    plan: StaticPlan,
    size: int,  # the pool bucket (>= plan.count)
    ctx: LayerContext,
    prefix_k: torch.Tensor | None,  # [Hkv, P, D] or [S, Hkv, P, D]
    prefix_v: torch.Tensor | None,
    group_rows: int | None,  # the most pool rows (padding included) of one request (4-dim prefix)
) -> torch.Tensor:
    """Q/K/V of the bucketed pool, split attention of every row (:func:`attend_split`), ``H' = H + W_o·O``. Returns
    ``H' [K*N, E]``."""
    k, n = plan.recompute.shape
    rows = pool_rows(plan, size)
    q, kk, vv = qkv_rows(layer, h, rows, ctx)
    k_tab, v_tab = take(kk, plan.table), take(vv, plan.table)
    o = attend_split(q, rows, plan.table, prefix_k, prefix_v, k_tab, v_tab, ctx.scale, ctx.prefix_len,
                     ctx.branch_request, group_rows)
    return h + layer.attn_out(o.to(h.dtype).reshape(k * n, *q.shape[1:]))


def ffn_pooled(
    layer: Layer,
    h1: torch.Tensor,  # [K*N, E] post-attention residual
    plan: StaticPlan,  # the FFN gate's plan
    size: int,  # the FFN pool bucket (>= plan.count)
) -> torch.Tensor:
    """The FFN on the first ``size`` rows of the plan's order (padding rows are folded rows whose results nobody
    reads), each row taking its pool row's output: ``H_next [K*N, E]``."""
    f_pool = layer.ffn(h1.index_select(0, plan.order[:size]))
    return h1 + f_pool.index_select(0, plan.table.reshape(-1))
