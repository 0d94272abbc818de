"""The folded layer on the Triton kernels (``FoldedVerifier(backend="triton")``), step for step the torch engine,
without a host sync.

Dims as in :mod:`specfold.engine.folded`: ``K`` branches, ``N`` block positions, ``M = K·N`` rows, ``E`` hidden
size, ``Hq``/``Hkv`` heads, ``D`` head dim. Every pool is sized at the upper bound ``M``; how many of its rows are
live is a device-side count, written by the gate kernel, that every consumer reads itself.

Per layer (kernels in :mod:`specfold.engine.kernels`):

1. ``gate_compact`` — Eq. 4/5 + atomic compaction: the row list (``M`` entries, the first ``count`` valid) and the
   device-side ``count``; ``resolve_sources`` gives each (branch, position) its pool row (``table``).
2. ``qkv_rope`` on the upper-bound grid (with the per-head q/k RMSNorm of qk-norm models); blocks past ``count``
   exit → Q/K/V pools ``[M, ...]``.
3. ``attend_rows`` over the per-branch lists → ``(m, Z, O)`` per pool row.
4. ``correct_folded`` over all (branch, position) in one launch; guard-flagged rows go back through
   ``attend_rows`` with their source's query — always launched, over per-branch lists of the flagged rows, whose
   programs exit at once where a branch has none (no host branch on the number of fallbacks).
5. ``H' = H + W_o·O``: ``linear_rows`` projects recomputed + corrected rows only (compacted on device); a folded
   row with Δ = ∅ takes its source's projected row.
6. FFN gate (``ffn="residual"``: the gate kernels again on ``H'``), ``ffn_rows`` on the upper-bound grid scatters the
   recomputed rows into the FFN table and folded rows gather their source's row.

The layer's :class:`LayerCounts` are device tensors; the pass reads them once, after the LM head
(:func:`specfold.engine.stats.fold_stats`). The compaction order varies from run to run (atomics), so nothing
here depends on it: rows are addressed by slot (``table``) or by flat (branch, position). Embedding and LM head
stay in torch (:class:`~specfold.engine.folded.FoldedVerifier`); :mod:`specfold.engine.cuda_graphs` captures the whole
pass in a CUDA graph, passing the prefix length as a device tensor (:class:`GraphContext`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specfold.engine.cost import LayerCost
from specfold.engine.kernels.attention import attend_rows
from specfold.engine.kernels.correction import correct_folded
from specfold.engine.kernels.ffn import ffn_rows, linear_rows
from specfold.engine.kernels.gate import gate_compact
from specfold.engine.kernels.qkv import qkv_rope
from specfold.engine.kernels.resolve import resolve_sources
from specfold.engine.layer_types import FoldConfig, LayerContext, LayerCounts, LayerTrace
from specfold.engine.reference import GUARDED
from specfold.model.transformer import Layer

# A LayerContext whose prefix view may be longer than the live prefix: ``prefix_len [1]`` int32 on the device
# says how many keys are live (one captured graph per prefix-length bucket).
GraphContext = LayerContext


@dataclass
class TritonPlan:
    """One layer's gate decisions and packing (every field on the model's device, nothing read by the host)."""

    rho: torch.Tensor  # [K, N] fp64 Eq. 4
    recompute: torch.Tensor  # [K, N] bool
    src: torch.Tensor  # [K, N] long: nearest recomputing ancestor
    rows: torch.Tensor  # [M] int32: flat (branch·N + position) of pool row r (compaction order); first count valid
    count: torch.Tensor  # [1] int32: R, the live pool rows
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
    """Gate + compaction + source resolution (kernels 1 and 2); no host sync."""
    g = gate_compact(h, parents, delta, fold)
    src, table = resolve_sources(g.recompute, parents, g.slot)
    return TritonPlan(g.rho, g.recompute, src, g.rows, g.count, table, g.branch_lists, g.branch_counts, parents)


def _branch_lists(flagged: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """flagged ``[K, N]`` bool → per-branch position lists ``[K, N]`` and counts ``[K]`` for ``attend_rows``."""
    lists = torch.sort((~flagged).to(torch.int8), dim=1, stable=True).indices.to(torch.int32)
    return lists, flagged.sum(dim=1).to(torch.int32)


def _compact(keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """keep ``[M]`` bool → the kept indices first (ascending) in an ``[M]`` int32 list, and their count ``[1]``
    int32 — on device, no sync (the tail of the list is 0, never read)."""
    m = keep.shape[0]
    pos = torch.cumsum(keep, 0) - 1
    dest = torch.where(keep, pos, m)  # dropped rows go to a dump slot
    out = torch.zeros(m + 1, dtype=torch.int32, device=keep.device)
    out.scatter_(0, dest, torch.arange(m, dtype=torch.int32, device=keep.device))
    return out[:m], keep.sum().to(torch.int32).reshape(1)


def folded_layer_triton(
    layer: Layer,
    h: torch.Tensor,  # [K*N, E] layer input (model dtype)
    plan: TritonPlan,
    ctx: LayerContext,
    prefix_k: torch.Tensor | None,  # [Hkv, P, D], or [R, Hkv, P, D] per request (see LayerContext)
    prefix_v: torch.Tensor | None,  # same layout as prefix_k
    cfg: FoldConfig,
    trace: bool = False,
    cost: LayerCost | None = None,
) -> tuple[torch.Tensor, LayerCounts, LayerTrace | None]:
    """:func:`specfold.engine.folded_layer.folded_layer` on the kernels; same arguments and results, no host sync (every
    launch is sized by ``K·N``; live counts stay on the device). Always folds with Eq. 8 (the cost rule's dense
    fallback and direct attention are the torch engine's; ``cost`` is unused)."""
    k, n = plan.recompute.shape
    m, e, dev = k * n, h.shape[1], h.device
    table, flat_table = plan.table, plan.table.reshape(-1)
    plen = ctx.prefix_len
    q, kk, vv = qkv_rope(h, plan.rows, layer.input_norm, layer.eps, layer.wqkv, layer.bqkv, ctx.cos, ctx.sin,
                         ctx.qscale, layer.hq, layer.hkv, count=plan.count, q_norm=layer.q_norm,
                         k_norm=layer.k_norm)  # pools [M, ...], first R live
    state = attend_rows(q, table, plan.lists, plan.counts, prefix_k, prefix_v, kk, vv, table, ctx.scale, table, m,
                        prefix_len=plen)
    fix = correct_folded(
        q, state.m, state.z, state.o, kk, vv, table, plan.src, plan.recompute, plan.parents, ctx.scale, cfg.guard
    )
    guarded = fix.flag == GUARDED  # [M]
    # direct attention for the rows the guard flagged, with their source's query; empty lists cost nothing
    g_lists, g_counts = _branch_lists(guarded.view(k, n))
    flat = torch.arange(m, device=dev)
    direct = attend_rows(q, table, g_lists, g_counts, prefix_k, prefix_v, kk, vv, table, ctx.scale, flat.view(k, n),
                         m, prefix_len=plen)
    corrected = fix.flag > 0  # [M]
    o_fix = torch.where(guarded[:, None, None], direct.o, fix.o)
    # each row's own attention output: corrected (Eq. 8 or direct), else its pool row's (own or its source's)
    o_tab = torch.where(corrected[:, None, None], o_fix, state.o[flat_table])  # [M, Hq, D] acc dtype
    # NOTE: o_proj on recomputed + corrected rows only; a folded row with Δ = ∅ takes its source's projected row
    project = plan.recompute.reshape(-1) | corrected
    p_rows, p_count = _compact(project)
    attn = linear_rows(o_tab.to(h.dtype).reshape(m, -1), p_rows, layer.wo, torch.empty_like(h), p_count, gather=True)
    src_flat = (plan.src * n + torch.arange(n, device=dev)).reshape(-1)
    h1 = h + attn[torch.where(project, flat, src_flat)]

    if cfg.ffn == "residual":
        fplan = plan_layer(h1.view(k, n, e), ctx.parents, cfg.delta)
    else:
        fplan = plan
    f_tab = ffn_rows(h1, fplan.rows, layer.post_norm, layer.eps, layer.w_gate_up, layer.w_down, torch.empty_like(h1),
                     count=fplan.count)
    ff_src = (fplan.src * n + torch.arange(n, device=dev)).reshape(-1)
    f_tab = f_tab[ff_src]  # folded rows take their FFN source's row
    h2 = h1 + f_tab

    counts = LayerCounts(
        folded=(~plan.recompute).sum(dim=1), ffn_folded=(~fplan.recompute).sum(dim=1),
        guard=guarded.view(k, n).sum(dim=1), recomputed=plan.recompute.sum(dim=1),
        corrected=corrected.view(k, n).sum(dim=1),
    )
    info = None
    if trace:
        info = LayerTrace(
            h=h.view(k, n, -1).clone(), rho=plan.rho, recompute=plan.recompute, src=plan.src,
            q=q[table], k=kk[table], v=vv[table], o=o_tab.view(k, n, *state.o.shape[1:]), f=f_tab.view(k, n, -1),
            flagged=guarded.nonzero().squeeze(1), h1=h1.view(k, n, -1).clone(), ffn_recompute=fplan.recompute,
        )
    return h2, counts, info
