"""The folded layer on the Triton kernels (``FoldedVerifier(backend="triton")``), step for step the torch engine.

Dims as in :mod:`specfold.engine.folded`: ``K`` branches, ``N`` block positions, ``E`` hidden size, ``Hq``/``Hkv``
heads, ``D`` head dim, ``R`` recomputed rows (pool rows), ``C`` corrected rows.

Per layer (kernels in :mod:`specfold.engine.kernels`):

1. ``gate_compact`` — Eq. 4/5 + atomic compaction; ``count.item()`` is the layer's one host sync (it sizes the
   pools), then ``resolve_sources`` gives each (branch, position) its pool row (``table``).
2. ``qkv_rope`` on the compacted rows → Q/K/V pools (pool row = compaction slot).
3. ``attend_rows`` over the per-branch lists → ``(m, Z, O)`` per pool row.
4. ``correct_folded`` over all (branch, position) in one launch; guard-flagged rows go back through
   ``attend_rows`` with their source's query.
5. ``H' = H + W_o·O`` in torch (o_proj on recomputed + corrected rows only, as the torch engine).
6. FFN gate (``ffn="residual"``: the gate kernels again on ``H'``), ``ffn_rows`` scatters the recomputed rows into
   the FFN table and folded rows gather their source's row.

The compaction order varies from run to run (atomics), so nothing here depends on it: rows are addressed by slot
(``table``) or by flat (branch, position), and the corrected rows are taken in flat order from the flags.
Embedding and LM head stay in torch (:class:`~specfold.engine.folded.FoldedVerifier`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specfold.engine.cost import LayerCost
from specfold.engine.kernels.attention import attend_rows
from specfold.engine.kernels.correction import correct_folded
from specfold.engine.kernels.ffn import ffn_rows
from specfold.engine.kernels.gate import gate_compact
from specfold.engine.kernels.qkv import qkv_rope
from specfold.engine.kernels.resolve import resolve_sources
from specfold.engine.layer_types import FoldConfig, LayerContext, LayerCounts, LayerTrace
from specfold.engine.reference import GUARDED
from specfold.model.transformer import Layer


@dataclass
class TritonPlan:
    """One layer's gate decisions and packing (every field on the model's device)."""

    rho: torch.Tensor  # [K, N] fp64 Eq. 4
    recompute: torch.Tensor  # [K, N] bool
    src: torch.Tensor  # [K, N] long: nearest recomputing ancestor
    rows: torch.Tensor  # [R] int32: flat (branch·N + position) of pool row r (compaction order)
    table: torch.Tensor  # [K, N] long: pool row each (branch, position) holds
    lists: torch.Tensor  # [K, N] int32: recomputed positions per branch (first counts[i] valid)
    counts: torch.Tensor  # [K] int32
    parents: torch.Tensor  # [K] long: the correction walks fold chains


def plan_layer(
    h: torch.Tensor,  # [K, N, E] layer input
    parents: torch.Tensor,  # [K] long
    delta: float,
    fold: torch.Tensor | None = None,  # [K, N] bool imposed decisions (benchmarks)
) -> TritonPlan:
    """Gate + compaction + source resolution (kernels 1 and 2)."""
    g = gate_compact(h, parents, delta, fold)
    r = int(g.count.item())  # NOTE: the layer's one host sync — the pools and the GEMM grids are sized by R
    src, table = resolve_sources(g.recompute, parents, g.slot)
    return TritonPlan(g.rho, g.recompute, src, g.rows[:r], table, g.branch_lists, g.branch_counts, parents)


def _guard_lists(flagged: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """flagged ``[K, N]`` bool → per-branch position lists ``[K, N]`` and counts ``[K]`` for ``attend_rows``."""
    lists = torch.sort((~flagged).to(torch.int8), dim=1, stable=True).indices.to(torch.int32)
    return lists, flagged.sum(dim=1).to(torch.int32)


def folded_layer_triton(
    layer: Layer,
    h: torch.Tensor,  # [K*N, E] layer input (model dtype)
    plan: TritonPlan,
    ctx: LayerContext,
    prefix_k: torch.Tensor | None,  # [Hkv, P, D]
    prefix_v: torch.Tensor | None,  # [Hkv, P, D]
    cfg: FoldConfig,
    trace: bool = False,
    cost: LayerCost | None = None,
) -> tuple[torch.Tensor, LayerCounts, LayerTrace | None]:
    """:func:`specfold.engine.folded.folded_layer` on the kernels; same arguments and results. Always folds with
    Eq. 8 (the cost rule's dense fallback and direct attention are the torch engine's; ``cost`` is unused)."""
    k, n = plan.recompute.shape
    e = h.shape[1]
    r = plan.rows.numel()
    table = plan.table
    q, kk, vv = qkv_rope(h, plan.rows, layer.input_norm, layer.eps, layer.wqkv, layer.bqkv, ctx.cos, ctx.sin,
                         ctx.qscale, layer.hq, layer.hkv)
    state = attend_rows(q, table, plan.lists, plan.counts, prefix_k, prefix_v, kk, vv, table, ctx.scale, table, r)
    fix = correct_folded(
        q, state.m, state.z, state.o, kk, vv, table, plan.src, plan.recompute, plan.parents, ctx.scale, cfg.guard
    )
    corrected = (fix.flag > 0).nonzero().squeeze(1)  # [C] flat (branch, position), ascending
    guarded = fix.flag == GUARDED  # [K*N]
    o_fix = fix.o
    n_guard = guarded.sum()
    if int(n_guard):  # direct attention for the rows the guard flagged, with their source's query
        lists, counts = _guard_lists(guarded.view(k, n))
        flat = torch.arange(k * n, device=h.device).view(k, n)
        direct = attend_rows(q, table, lists, counts, prefix_k, prefix_v, kk, vv, table, ctx.scale, flat, k * n)
        o_fix = torch.where(guarded[:, None, None], direct.o, fix.o)
    o_c = o_fix[corrected]

    o_all = torch.cat([state.o, o_c]).to(h.dtype)  # [R + C, Hq, D]
    attn = layer.attn_out(o_all)  # NOTE: o_proj skips folded rows with Δ = ∅ (their W_o·O is the source's)
    out_index = table.reshape(-1).clone()
    out_index[corrected] = r + torch.arange(corrected.numel(), device=h.device)
    h1 = h + attn[out_index]

    if cfg.ffn == "residual":
        fplan = plan_layer(h1.view(k, n, e), ctx.parents, cfg.delta)
        ff_rec, ff_rows, ff_src = fplan.recompute, fplan.rows, fplan.src
    else:
        ff_rec, ff_rows, ff_src = plan.recompute, plan.rows, plan.src
    f_tab = ffn_rows(h1, ff_rows, layer.post_norm, layer.eps, layer.w_gate_up, layer.w_down, torch.empty_like(h1))
    src_flat = (ff_src * n + torch.arange(n, device=h.device)).reshape(-1)
    f_tab = f_tab[src_flat]  # folded rows take their FFN source's row
    h2 = h1 + f_tab

    counts = LayerCounts(
        folded=(~plan.recompute).sum(dim=1), ffn_folded=(~ff_rec).sum(), guard=n_guard,
        recomputed=torch.tensor(r), corrected=torch.tensor(corrected.numel()),
    )
    info = None
    if trace:
        o_tab = torch.cat([state.o, o_c])[out_index].view(k, n, *state.o.shape[1:])
        info = LayerTrace(
            h=h.view(k, n, -1).clone(), rho=plan.rho, recompute=plan.recompute, src=plan.src,
            q=q[table], k=kk[table], v=vv[table], o=o_tab, f=f_tab.view(k, n, -1),
            flagged=guarded.nonzero().squeeze(1), h1=h1.view(k, n, -1).clone(), ffn_recompute=ff_rec,
        )
    return h2, counts, info
