"""Folded verification (SpecFold, SPEC §4): the dense verifier's forward with draft rows folded into ancestors.

Dims: ``K`` branches (row 0 = main, ``parents[k] < k``), ``N`` block positions, ``E`` hidden size, ``Hq``/``Hkv``
heads, ``D`` head dim, ``V`` vocabulary, ``R`` recomputed rows of a layer (packed over all branches), ``C``
folded rows whose attention context changed (``Δ ≠ ∅``) and is corrected by Eq. 8.

Per layer, for every branch at once (a parent's layer-ℓ input is ready once layer ℓ−1 is done for all):

1. :func:`gate_and_compact` — Eq. 4/5 on the layer input ``H`` against the immediate parent, the packed list of
   recomputed rows, and for every (branch, position) the *pool row* it holds: the recomputed row of its nearest
   recomputing ancestor (:func:`~specfold.engine.gate.resolve_sources`). The per-layer Q/K/V, attention-output
   and FFN tables of SPEC §4 are gathers of pools indexed this way; a folded row never owns a copy.
2. :func:`qkv_rows` — RMSNorm + QKV GEMM + RoPE for recomputed rows only.
3. :func:`~specfold.engine.attention_rows.attend_rows` — direct attention of recomputed rows over the shared
   prefix and their own branch's block K/V, keeping ``(m, Z, O)``.
4. :func:`~specfold.engine.correction.correct_rows` — Eq. 8 for folded rows with ``Δ ≠ ∅`` starting from their
   source's state; rows the cancellation guard flags are recomputed by direct attention.
5. ``H' = H + W_o·O`` for every row. A folded row with ``Δ = ∅`` has exactly its source's ``O``, so its
   ``W_o·O`` is its source's row — exact, and the o_proj GEMM runs on recomputed + corrected rows only.
6. The FFN, gated like the layer (see below); ``H_next = H' + F``.

The residual stream ``H`` of every (branch, position) is its own and is never copied from a parent.

FFN reuse — two modes:

* ``ffn="residual"`` (default): the FFN's input ``H'`` gets its own residual gate (Eq. 4/5 on ``H'`` against the
  immediate parent, the same δ); folded rows take their FFN-source's ``F``. At δ = 0 only rows whose ``H'`` is
  bit-identical to the parent's reuse its ``F``, so the pass equals dense verification up to floating-point
  reassociation — the lossless identity SPEC §4 promises.
* ``ffn="paper"``: SPEC §4 step 6 / the paper literally — the FFN runs on the layer's recomputed set and every
  folded row reuses its source's ``F``. This reuses more, but it is *not* exact at δ = 0: a row folded at the
  layer input whose block context changed (Δ ≠ ∅) has a different ``H'`` than its source, and still gets the
  source's FFN output (measured: logits off by ~5 on random checkpoints). SPEC's δ = 0 claim needs the
  ``residual`` mode.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace

import torch

from specfold.engine.attention_rows import attend_rows
from specfold.engine.base import BatchBranches, BatchVerifyResult, VerifyResult
from specfold.engine.correction import correct_rows
from specfold.engine.cost import LayerCost, measure_machine
from specfold.engine.dense import DenseVerifier
from specfold.engine.gate import BranchGraph, as_graph, branch_depths, fold_mask, relative_residual, resolve_sources
from specfold.engine.layer_types import (
    FoldConfig,
    FoldTrace,
    LayerContext,
    LayerCounts,
    LayerTrace,
)
from specfold.model.attention import accumulation_dtype, attend, attend_ragged
from specfold.model.cache import PrefixCache
from specfold.model.linear import bucket_index
from specfold.model.transformer import DLLM, Layer

PARTS = ("gate", "packing", "qkv", "attention", "correction", "o_proj", "ffn", "head")


def part(name: str) -> contextlib.AbstractContextManager:
    """A profiler range named ``specfold::<name>`` (one of :data:`PARTS`), which ``specfold bench pass`` sums into
    its per-part breakdown. Outside a profile it is a no-op: a ``record_function`` costs ~12 µs even then, and a
    folded pass opens ten per layer (measured: 6 % of a batched pass of the embedded model on this project's CPU)."""
    if not torch.autograd.profiler._is_profiler_enabled:
        return contextlib.nullcontext()
    return torch.profiler.record_function(f"specfold::{name}")


@dataclass
class FoldPlan:
    """One layer's gate decisions and packing (all index tensors on the model's device)."""

    rho: torch.Tensor  # [K, N] Eq. 4 (roots = inf)
    recompute: torch.Tensor  # [K, N] bool, complement of Eq. 5's folded set
    src: torch.Tensor  # [K, N] long: branch whose Q/K/V (and F) row (i, n) holds
    rows: torch.Tensor  # [R] long: flat (branch·N + position) of the recomputed rows, in pool order
    table: torch.Tensor  # [K, N] long: pool row held by (i, n), i.e. the slot of (src[i, n], n)
    changed: torch.Tensor  # [K, N] bool: folded rows whose attention context differs from their source's (Δ ≠ ∅)


@dataclass
class CorrectionPlan:
    """What Eq. 8 needs of a layer's plan (:func:`correction_plan`; built only when a layer corrects)."""

    corrected: torch.Tensor  # [C] long: flat index of folded rows with Δ ≠ ∅
    branch_rows: torch.Tensor  # [C, N] long: table row of each corrected row's branch
    source_rows: torch.Tensor  # [C, N] long: table row of each corrected row's source
    delta: torch.Tensor  # [C, N] bool: Δ = branch_rows != source_rows
    out_index: torch.Tensor  # [K*N] long: row of the packed (recomputed ++ corrected) outputs each row takes


def gate_and_compact(
    h: torch.Tensor,  # [K, N, E] layer input of every branch
    parents: torch.Tensor | BranchGraph,  # [K] long, on h's device; -1 for a root
    delta: float,
    fold: torch.Tensor | None = None,  # [K, N] bool: use these decisions instead of Eq. 5 (benchmarks)
) -> FoldPlan:
    """Gate (Eq. 4/5), source resolution and compaction of one layer. ``fold`` still pays for computing ρ, so a
    benchmark that imposes a fold ratio times the same work."""
    with part("gate"):
        rho = relative_residual(h, parents, exact_zero=delta == 0)
        if fold is None:
            folded = fold_mask(rho, delta, parents)
        else:  # imposed decisions; a root still never folds
            folded = fold & as_graph(parents).nonroot.to(fold.device)[:, None]
    with part("packing"):
        return plan_from_recompute(rho, ~folded, parents)


def plan_from_recompute(
    rho: torch.Tensor,  # [K, N]
    recompute: torch.Tensor,  # [K, N] bool, roots all True
    parents: torch.Tensor | BranchGraph,  # [K] long
) -> FoldPlan:
    """Source resolution and compaction of given recompute decisions (:func:`gate_and_compact` after the gate).

    Δ of a folded row ``(i, n)`` with source ``s = src[i, n]`` is empty iff ``s`` is ``i``'s nearest
    ancestor-or-self that recomputes any position (``owner[i]``): branches below ``owner[i]`` recompute nothing
    and hold its table row; any source above it misses a position ``owner[i]`` recomputed. So ``changed`` costs
    ops on ``[K, N]`` and ``[K]``, not a comparison of table rows."""
    parents = as_graph(parents)
    src, rows, table = pool_index(recompute, parents)
    owner = resolve_sources(recompute.any(dim=1, keepdim=True), parents)  # [K, 1]
    return FoldPlan(rho=rho, recompute=recompute, src=src, rows=rows, table=table, changed=~recompute & (src != owner))


def correction_plan(plan: FoldPlan) -> CorrectionPlan:
    """The corrected rows of a plan with their branch and source table rows (Eq. 8's inputs)."""
    k, n = plan.recompute.shape
    corrected = plan.changed.reshape(-1).nonzero().squeeze(1)  # [C]
    branch_rows = plan.table.index_select(0, corrected // n)  # [C, N]
    source_rows = plan.table.index_select(0, plan.src.reshape(-1).index_select(0, corrected))
    out_index = plan.table.reshape(-1).clone()
    out_index[corrected] = plan.rows.numel() + torch.arange(corrected.numel(), device=corrected.device)
    return CorrectionPlan(corrected=corrected, branch_rows=branch_rows, source_rows=source_rows,
                          delta=branch_rows != source_rows, out_index=out_index)


def dense_plan(rho: torch.Tensor) -> FoldPlan:  # rho: [K, N]
    """The plan of a layer that recomputes every row (the cost rule's dense fallback)."""
    k, n = rho.shape
    dev = rho.device
    flat = torch.arange(k * n, device=dev)
    every = torch.ones(k, n, dtype=torch.bool, device=dev)
    return FoldPlan(rho=rho, recompute=every, src=torch.arange(k, device=dev)[:, None].expand(k, n), rows=flat,
                    table=flat.view(k, n), changed=~every)


def pool_index(
    recompute: torch.Tensor,  # [K, N] bool, roots all True
    parents: torch.Tensor | BranchGraph,  # [K] long
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Source resolution + compaction: ``src [K, N]`` (nearest recomputing ancestor), the packed recomputed rows
    ``rows [R]`` (flat ``branch·N + position``) and ``table [K, N]``: the pool row each (branch, position) holds."""
    k, n = recompute.shape
    src = resolve_sources(recompute, parents)
    flat = recompute.reshape(-1)
    rows = flat.nonzero().squeeze(1)
    slot = (torch.cumsum(flat, 0) - 1).view(k, n)  # pool slot of every recomputed (i, n)
    return src, rows, slot.gather(0, src)


def _take(pool: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
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
    q: torch.Tensor  # [K, N, Hq, D] each row's (possibly inherited) query
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
        c = int(plan.changed.sum())  # NOTE: a host read, as r's (the torch engine's row counts are host ints)
        mode = cost.attention_plan(m, n, prefix, r, c, options + (("dense",) if cfg.dense_fallback else ()))
    elif mode == "auto":  # no cost rule: Eq. 8
        mode = "correct"
    if mode == "dense" and r < m:
        plan = dense_plan(plan.rho)
    if plan.rows.numel() == m or mode == "direct":
        att = _direct_attention(layer, h, plan, ctx, prefix_k, prefix_v)
    else:
        att = _corrected_attention(layer, h, plan, ctx, prefix_k, prefix_v, cfg.guard)
    h2, f_tab, ffn_recompute = _ffn_step(layer, att.h1, plan, ctx, cfg, cost)
    counts = LayerCounts(
        folded=(~plan.recompute).sum(dim=1), ffn_folded=(~ffn_recompute).sum(dim=1),
        guard=torch.bincount(att.flagged // n, minlength=k), recomputed=plan.recompute.sum(dim=1),
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


def _direct_attention(layer, h, plan, ctx, prefix_k, prefix_v) -> _Attention:
    """Every row's attention computed directly over its branch's own (partly inherited) block K/V."""
    k, n = plan.recompute.shape
    with part("qkv"):
        q, kk, vv = qkv_rows(layer, h, plan.rows, ctx)
    if plan.rows.numel() == k * n:  # dense: the pool is the table
        q_tab, k_tab, v_tab = q.view(k, n, *q.shape[1:]), kk.view(k, n, *kk.shape[1:]), vv.view(k, n, *vv.shape[1:])
    else:
        with part("packing"):
            q_tab, k_tab, v_tab = (_take(x, plan.table) for x in (q, kk, vv))
    with part("attention"):
        if prefix_k is not None and prefix_k.dim() == 4:  # several requests, each over its own prefix
            s = prefix_k.shape[0]
            live = ctx.prefix_len if ctx.prefix_len is not None else torch.full((s,), prefix_k.shape[2])
            request = ctx.branch_request
            if request is None:
                request = torch.arange(s, device=h.device).repeat_interleave(k // s)
            o = attend_ragged(q_tab, prefix_k, prefix_v, live.long(), request, k_tab, v_tab, None, ctx.scale)
        else:
            o = attend(q_tab, prefix_k, prefix_v, k_tab, v_tab, None, ctx.scale).o
    with part("o_proj"):
        h1 = h + layer.attn_out(o.to(h.dtype).reshape(k * n, *q.shape[1:]))
    zero = torch.zeros(k, dtype=torch.long, device=h.device)
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
        k_tab, v_tab = _take(kk, table), _take(vv, table)  # [K, N, Hkv, D] each branch's block K/V
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
    return _Attention(h1=h1, q=_take(q, table), k=k_tab, v=v_tab, o=o_tab, flagged=flagged,
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


class FoldedVerifier:
    """SpecFold verification behind the :class:`~specfold.engine.base.Verifier` interface.

    Settings are a :class:`~specfold.engine.layer_types.FoldConfig` (``cfg``) or its fields as keywords.
    ``backend="triton"`` runs each layer on the Triton kernels (:mod:`specfold.engine.triton_backend`, imported
    only then; fp32/bf16/fp16 models). ``cost`` is the per-layer cost rule (default: measured on this machine for
    the model's device and dtype, see :mod:`specfold.engine.cost`); ``cost=None`` with ``dense_fallback=False``
    and an explicit attention mode folds unconditionally."""

    def __init__(
        self, net: DLLM, delta: float = 0.1, *, cfg: FoldConfig | None = None, cost: LayerCost | str | None = "auto",
        **settings,
    ) -> None:
        cfg = cfg if cfg is not None else FoldConfig(delta=delta, **settings)
        if cfg.backend == "triton":
            if net.dtype not in (torch.float32, torch.bfloat16, torch.float16):
                raise ValueError(f"the triton backend runs fp32/bf16/fp16 models, got {net.dtype}")
            try:
                import specfold.engine.triton_backend  # noqa: F401  (lazy: torch paths never import triton)
            except ImportError as err:
                raise ImportError("backend='triton' needs Triton: pip install 'specfold[triton]'") from err
        if cost == "auto":
            c = net.cfg
            machine = measure_machine(net.device, net.dtype)
            cost = LayerCost.of(c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size,
                                machine.op_macs)
        self.net, self.cfg, self.cost = net, cfg, cost
        self._imposed_masks: dict[tuple[int, int], torch.Tensor] = {}  # cfg.imposed_fold's, per (K, N)
        self._dense = DenseVerifier(net)  # passes without drafts (see _root_stats)
        self._root_stats_of: dict[int, dict[str, float]] = {}  # per N

    @property
    def delta(self) -> float:
        return self.cfg.delta

    @torch.no_grad()
    def verify(
        self,
        cache: PrefixCache,
        states: torch.Tensor,  # [K, N]
        parents: torch.Tensor,  # [K] long, parents[0] = -1
    ) -> VerifyResult:
        return self.run(cache, states, parents)[0]

    @torch.no_grad()
    def run(
        self,
        cache: PrefixCache,
        states: torch.Tensor,  # [K, N]
        parents: torch.Tensor,  # [K] long, parents[0] = -1
        trace: bool = False,
    ) -> tuple[VerifyResult, FoldTrace | None]:
        """The pass; with ``trace`` also every layer's tables (:class:`LayerTrace`)."""
        net = self.net
        k, n = states.shape
        if k == 1 and not trace:  # no drafts: nothing can fold
            return VerifyResult(self._dense.verify(cache, states, parents).logits, self._root_stats(n)), None
        par, checked = self._parents(parents[None])
        cos, sin, qscale = net.rope_tables(cache.length, n)
        graph = BranchGraph.of(checked[0], net.device) if self.cfg.backend == "torch" else None
        ctx = LayerContext(cos=cos, sin=sin, qscale=qscale, scale=net.scale, parents=par.reshape(-1), graph=graph)
        prefixes = [cache.layer(i) for i in range(len(net.layers))]
        logits, counts, out = self.forward(states, ctx, prefixes, trace)
        return VerifyResult(logits, fold_stats_batch(counts, checked, n, [k])[0]), out

    @torch.no_grad()
    def verify_batch(self, batch: BatchBranches) -> BatchVerifyResult:
        """One folded pass over every request's branches: one graph with a root per request (parents never cross
        requests), each request over its own prefix. The torch engine packs the real branches only, request after
        request (``LayerContext.branch_request`` names each branch's request). The triton kernels read ``K / R``
        branches per request, so that backend keeps the padding: padding rows copy their request's main row with
        parent 0, fold at every layer (ρ = 0 ≤ δ) and cost the gate only; their logits are not computed. A
        request's tokens do not depend on its neighbours except through the cost rule's per-layer dense fallback,
        which is decided for the whole pass."""
        net = self.net
        r, kb, n = batch.states.shape
        if all(b == 1 for b in batch.branches):  # no request has drafts (every block start at R = 1)
            logits = self._dense.verify_batch(batch).logits
            return BatchVerifyResult(logits, [dict(self._root_stats(n)) for _ in batch.branches])
        dev = net.device
        local, checked = self._parents(batch.parents)
        lengths = batch.lengths.to(dev)
        ragged = self.cfg.backend == "torch"
        counts_of = [kb] * r if not ragged else batch.branches  # rows per request in the pass
        starts = [sum(counts_of[:q]) for q in range(r)]
        keep = torch.tensor([q * kb + j for q, kr in enumerate(batch.branches) for j in range(kr)], device=dev)
        states = batch.states.reshape(r * kb, n).to(dev)
        request = torch.arange(r, device=dev).repeat_interleave(torch.tensor(counts_of, device=dev))  # [K']
        graph = None
        if ragged:  # the packed graph, from the host lists
            graph = BranchGraph.of([-1 if p < 0 else starts[q] + p for q, kr in enumerate(batch.branches)
                                    for p in checked[q][:kr]], dev)
            par, states = graph.parents, states.index_select(0, keep)
        else:
            par = torch.where(local >= 0, local + torch.tensor(starts, device=dev)[:, None], -1).reshape(-1)
        positions = lengths.index_select(0, request)[:, None] + torch.arange(n, device=dev)  # [K', N]
        cos, sin, qscale = net.rotary.tables(positions.reshape(-1), net.dtype)
        ctx = LayerContext(cos=cos, sin=sin, qscale=qscale, scale=net.scale, parents=par,
                           prefix_len=lengths.to(torch.int32), branch_request=request if ragged else None,
                           graph=graph)
        p_max = int(batch.lengths.max())  # NOTE: host-side lengths (the batch decoder's), read before the layers
        slots = batch.slots.to(dev)
        # BatchDecoder keeps its requests in slots 0..R-1, so the prefix is a view; otherwise it is gathered.
        rows = slice(0, r) if slots.tolist() == list(range(r)) else slots
        prefixes = [(batch.cache.k[i, rows, :, :p_max], batch.cache.v[i, rows, :, :p_max])
                    for i in range(len(net.layers))]
        logits, counts, _ = self.forward(states, ctx, prefixes, head_rows=None if ragged else keep)
        per_request = list(torch.split(logits, batch.branches))
        return BatchVerifyResult(per_request, fold_stats_batch(counts, checked, n, batch.branches, starts))

    def _root_stats(self, n: int) -> dict[str, float]:
        """The statistics of a one-branch request (every row recomputed at every layer), as
        :func:`fold_stats_batch` reports them. A pass in which no request has a draft has nothing to fold, so it
        runs as the dense pass: the same rows computed, without the gate, packing and cost-rule ops of every
        layer."""
        if n not in self._root_stats_of:
            one, none = torch.ones(1, dtype=torch.long), torch.zeros(1, dtype=torch.long)
            counts = [LayerCounts(folded=none, ffn_folded=none, guard=none, recomputed=one * n, corrected=none,
                                  dense=True) for _ in self.net.layers]
            self._root_stats_of[n] = fold_stats_batch(counts, [[-1]], n, [1])[0]
        return self._root_stats_of[n]

    def _parents(self, parents: torch.Tensor) -> tuple[torch.Tensor, list[list[int]] | torch.Tensor]:
        """Local parents ``[R, K]`` on the device, made safe, and what :func:`fold_stats_batch` validates: host lists
        (torch backend, checked now) or the raw device tensor (triton: read with the statistics, no sync here)."""
        net = self.net
        if self.cfg.backend == "triton":
            raw = parents.to(device=net.device, dtype=torch.long, non_blocking=True)
            return _safe_parents(raw), raw
        rows = [[int(p) for p in row] for row in parents.tolist()]
        for row in rows:
            _check_parents(row)
        return torch.as_tensor(rows, dtype=torch.long, device=net.device), rows

    def forward(
        self,
        states: torch.Tensor,  # [K, N]
        ctx: LayerContext,
        prefixes: list[tuple[torch.Tensor, torch.Tensor]],  # per layer (k [Hkv, P, D] or [R, Hkv, P, D], v alike)
        trace: bool = False,
        head_rows: torch.Tensor | None = None,  # [K'] long: branches whose logits are computed (default: all)
    ) -> tuple[torch.Tensor, list[LayerCounts], FoldTrace | None]:
        """Embedding, the folded layers and the LM head: logits ``[K, N, V]`` (``[K', N, V]``) and the per-layer
        counts (device tensors). With the triton backend this issues no host sync (what
        :mod:`specfold.engine.cuda_graphs` captures)."""
        net = self.net
        k, n = states.shape
        h = torch.nn.functional.embedding(states.reshape(-1).to(net.device), net.embed)  # [K*N, E]
        counts: list[LayerCounts] = []
        out = FoldTrace() if trace else None
        plan_fn, layer_fn = gate_and_compact, folded_layer
        if self.cfg.backend == "triton":
            from specfold.engine.triton_backend import folded_layer_triton as layer_fn
            from specfold.engine.triton_backend import plan_layer as plan_fn
        else:
            if ctx.graph is None:
                ctx = replace(ctx, graph=BranchGraph.of(ctx.parents))
        graph = ctx.parents if ctx.graph is None else ctx.graph
        imposed = self._imposed(k, n)
        for i, (layer, (pk, pv)) in enumerate(zip(net.layers, prefixes, strict=True)):
            plan = plan_fn(h.view(k, n, -1), graph, self.cfg.delta, None if imposed is None else imposed[i])
            h, c, info = layer_fn(layer, h, plan, ctx, pk, pv, self.cfg, trace, self.cost)
            counts.append(c)
            if out is not None:
                out.layers.append(info)
        with part("head"):
            h = h.view(k, n, -1)
            logits = net.position_logits(net.logits(h if head_rows is None else h[head_rows]))
        return logits, counts, out


    def _imposed(self, k: int, n: int) -> torch.Tensor | None:
        """``[L, K, N]`` bool: ``cfg.imposed_fold``'s decisions for a K-branch pass (made once per shape, on the
        device, so a captured pass reads the same tensor); None without an imposed ratio."""
        ratio = self.cfg.imposed_fold
        if ratio is None:
            return None
        masks = self._imposed_masks
        if (k, n) not in masks:
            gen = torch.Generator().manual_seed(0)
            draw = torch.rand(len(self.net.layers), k, n, generator=gen)
            masks[k, n] = (draw < ratio).to(self.net.device)
        return masks[k, n]


def _check_parents(parents: list[int]) -> None:
    if parents[0] != -1 or any(not 0 <= p < i for i, p in enumerate(parents) if i > 0):
        raise ValueError(f"parents must be -1 for row 0 and in [0, k) for row k; got {parents}")


def _safe_parents(par: torch.Tensor) -> torch.Tensor:  # [..., K] long on the model's device, local per request
    """``par`` with every invalid entry replaced by a safe one (-1 for row 0, 0 for the others), without a host
    read: no kernel reads out of bounds, and :func:`fold_stats` raises once it reads the original ``par``."""
    idx = torch.arange(par.shape[-1], device=par.device)
    ok = torch.where(idx == 0, par == -1, (par >= 0) & (par < idx))
    return torch.where(ok, par, torch.where(idx == 0, -1, 0))


def fold_stats(counts: list[LayerCounts], parents: list[int] | torch.Tensor, n: int) -> dict[str, float]:
    """:func:`fold_stats_batch` of a one-request pass (``parents [K]``)."""
    rows = [parents] if isinstance(parents, list) else parents[None]
    return fold_stats_batch(counts, rows, n, [counts[0].folded.shape[0]])[0]


def fold_stats_batch(
    counts: list[LayerCounts],
    parents: list[list[int]] | torch.Tensor,  # [R][K] local parents, or the pass's [R, K] device tensor
    n: int,
    branches: list[int],  # [R] real branches per request (the rest of its K rows are padding)
    starts: list[int] | None = None,  # [R] each request's first row in the pass (default: K rows per request)
) -> list[dict[str, float]]:
    """Per request: counts of (branch ≥ 1, position, layer) triples over its real branches, summed by layer and
    by graph depth (one device sync for the whole batch).

    ``folded_triples`` are folded at the attention gate (inherited Q/K/V), ``ffn_folded_triples`` at the FFN gate
    (inherited FFN output); ``dense_layers`` computed every row of the request (the cost rule's dense fallback, or
    nothing folded). ``parents`` given as the pass's device
    tensor (the triton backend, see :func:`_safe_parents`) are read in the same host read as the counts — the
    pass's only one — and validated then."""
    layers = len(counts)
    table = torch.stack([torch.stack([c.folded, c.ffn_folded, c.guard, c.recomputed, c.corrected]).long()
                         for c in counts])  # [L, 5, R*K]
    if isinstance(parents, torch.Tensor):
        flat = torch.cat([table.reshape(-1), parents.reshape(-1).to(table.device, torch.long)]).tolist()  # one read
        total = table.numel()
        kb = parents.shape[-1]
        parents = [[int(p) for p in flat[total + q * kb: total + (q + 1) * kb]] for q in range(len(branches))]
        width = table.shape[2]
        values = [[flat[(layer * 5 + f) * width:(layer * 5 + f + 1) * width] for f in range(5)]
                  for layer in range(layers)]
    else:
        values = table.tolist()  # [L][5][R*K]
    if starts is None:
        starts = [q * (table.shape[2] // len(branches)) for q in range(len(branches))]
    out = []
    for q, kr in enumerate(branches):
        local = parents[q][:kr]
        _check_parents(local)
        depth = branch_depths(local)
        lo = starts[q]
        stats: dict[str, float] = {"rows": float(kr * n), "draft_triples": float((kr - 1) * n * layers)}
        totals = {"folded_triples": 0.0, "ffn_folded_triples": 0.0, "guard_fallbacks": 0.0, "corrected_rows": 0.0}
        dense_layers = 0
        for layer, (folded, ffn_folded, guards, recomputed, corrected) in enumerate(values):
            per_branch = folded[lo:lo + kr]
            stats[f"folded_l{layer}"] = float(sum(per_branch))
            stats[f"draft_l{layer}"] = float((kr - 1) * n)
            stats[f"recomputed_rows_l{layer}"] = float(sum(recomputed[lo:lo + kr]))
            dense_layers += sum(recomputed[lo:lo + kr]) == kr * n  # every row of the request computed
            for b in range(1, kr):
                stats[f"folded_d{depth[b]}"] = stats.get(f"folded_d{depth[b]}", 0.0) + per_branch[b]
                stats[f"draft_d{depth[b]}"] = stats.get(f"draft_d{depth[b]}", 0.0) + n
            totals["folded_triples"] += sum(per_branch)
            totals["ffn_folded_triples"] += sum(ffn_folded[lo:lo + kr])
            totals["guard_fallbacks"] += sum(guards[lo:lo + kr])
            totals["corrected_rows"] += sum(corrected[lo:lo + kr])
        stats.update({key: float(v) for key, v in totals.items()})
        stats["dense_layers"] = float(dense_layers)
        stats["layers"] = float(layers)
        out.append(stats)
    return out
