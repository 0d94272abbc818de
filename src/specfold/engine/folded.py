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

from dataclasses import dataclass, field

import torch

from specfold.engine.attention_rows import attend_rows
from specfold.engine.base import VerifyResult
from specfold.engine.correction import DEFAULT_GUARD, correct_rows
from specfold.engine.gate import branch_depths, fold_mask, relative_residual, resolve_sources
from specfold.model.attention import attend
from specfold.model.cache import PrefixCache
from specfold.model.transformer import DLLM, Layer

BACKENDS = ("torch", "triton")  # "triton": specfold.engine.triton_backend, imported only when chosen
FFN_MODES = ("residual", "paper")
ATTENTION_MODES = ("correct", "direct")  # Eq. 8 for folded rows, or every row's attention computed directly


@dataclass
class FoldPlan:
    """One layer's gate decisions and packing (all index tensors on the model's device)."""

    rho: torch.Tensor  # [K, N] Eq. 4 (row 0 = inf)
    recompute: torch.Tensor  # [K, N] bool, complement of Eq. 5's folded set
    src: torch.Tensor  # [K, N] long: branch whose Q/K/V (and F) row (i, n) holds
    rows: torch.Tensor  # [R] long: flat (branch·N + position) of the recomputed rows, in pool order
    table: torch.Tensor  # [K, N] long: pool row held by (i, n), i.e. the slot of (src[i, n], n)
    corrected: torch.Tensor  # [C] long: flat index of folded rows with Δ ≠ ∅
    branch_rows: torch.Tensor  # [C, N] long: table row of each corrected row's branch
    source_rows: torch.Tensor  # [C, N] long: table row of each corrected row's source
    delta: torch.Tensor  # [C, N] bool: Δ = branch_rows != source_rows
    out_index: torch.Tensor  # [K*N] long: row of the packed (recomputed ++ corrected) outputs each row takes


@dataclass
class LayerContext:
    """What every layer step shares: RoPE tables for the block positions, the prefix, the score scale."""

    cos: torch.Tensor  # [N, D]
    sin: torch.Tensor  # [N, D]
    qscale: torch.Tensor | None  # [N]
    scale: float


@dataclass
class LayerTrace:
    """Per-layer tables of one pass, for tests (``trace=True``); every table is ``[K, N, ...]``."""

    h: torch.Tensor  # [K, N, E] layer input
    rho: torch.Tensor  # [K, N]
    recompute: torch.Tensor  # [K, N] bool
    src: torch.Tensor  # [K, N] long
    q: torch.Tensor  # [K, N, Hq, D]
    k: torch.Tensor  # [K, N, Hkv, D]
    v: torch.Tensor  # [K, N, Hkv, D]
    o: torch.Tensor  # [K, N, Hq, D] attention output (acc dtype)
    f: torch.Tensor  # [K, N, E] FFN output table
    flagged: torch.Tensor  # [G] long: flat index of rows the guard sent to direct attention
    h1: torch.Tensor  # [K, N, E] post-attention residual (the FFN's input)
    ffn_recompute: torch.Tensor  # [K, N] bool: rows whose FFN ran


@dataclass
class LayerCounts:
    folded: torch.Tensor  # [K] folded positions per branch (tensor: no device sync in the layer loop)
    guard: torch.Tensor  # [] guard fallbacks
    recomputed: int
    corrected: int
    ffn_folded: torch.Tensor  # [] rows that reused an ancestor's FFN output


@dataclass
class FoldTrace:
    layers: list[LayerTrace] = field(default_factory=list)


def gate_and_compact(
    h: torch.Tensor,  # [K, N, E] layer input of every branch
    parents: torch.Tensor,  # [K] long, on h's device
    delta: float,
    fold: torch.Tensor | None = None,  # [K, N] bool: use these decisions instead of Eq. 5 (benchmarks)
) -> FoldPlan:
    """Gate (Eq. 4/5), source resolution and compaction of one layer. ``fold`` still pays for computing ρ, so a
    benchmark that imposes a fold ratio times the same work."""
    k, n, _ = h.shape
    rho = relative_residual(h, parents)
    folded = fold_mask(rho, delta) if fold is None else fold.clone()
    folded[0] = False
    recompute = ~folded
    src, rows, table = pool_index(recompute, parents)
    flat = recompute.reshape(-1)
    fold_rows = (~flat).nonzero().squeeze(1)
    table_flat = table.reshape(-1)
    branch_rows = table[fold_rows // n]
    source_rows = table[src.reshape(-1)[fold_rows]]
    dmask = branch_rows != source_rows
    changed = dmask.any(dim=1)
    corrected = fold_rows[changed]
    out_index = table_flat.clone()
    out_index[corrected] = rows.numel() + torch.arange(corrected.numel(), device=h.device)
    return FoldPlan(
        rho=rho, recompute=recompute, src=src, rows=rows, table=table, corrected=corrected,
        branch_rows=branch_rows[changed], source_rows=source_rows[changed], delta=dmask[changed],
        out_index=out_index,
    )


def pool_index(
    recompute: torch.Tensor,  # [K, N] bool, row 0 all True
    parents: torch.Tensor,  # [K] long
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Source resolution + compaction: ``src [K, N]`` (nearest recomputing ancestor), the packed recomputed rows
    ``rows [R]`` (flat ``branch·N + position``) and ``table [K, N]``: the pool row each (branch, position) holds."""
    k, n = recompute.shape
    src = resolve_sources(recompute, parents)
    flat = recompute.reshape(-1)
    rows = flat.nonzero().squeeze(1)
    slot = (torch.cumsum(flat, 0) - 1).view(k, n)  # pool slot of every recomputed (i, n)
    return src, rows, slot.gather(0, src)


def qkv_rows(
    layer: Layer,
    h: torch.Tensor,  # [K*N, E] layer input
    rows: torch.Tensor,  # [R] flat row indices
    ctx: LayerContext,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """RMSNorm + fused QKV GEMM + RoPE on the packed rows only. Returns q ``[R, Hq, D]``, k, v ``[R, Hkv, D]``."""
    pos = rows % ctx.cos.shape[0]
    qscale = None if ctx.qscale is None else ctx.qscale[pos]
    return layer.qkv(h[rows], ctx.cos[pos], ctx.sin[pos], qscale)


def ffn_rows(
    layer: Layer,
    h: torch.Tensor,  # [K*N, E] post-attention residual
    rows: torch.Tensor,  # [R] flat row indices
) -> torch.Tensor:
    """RMSNorm + gate/up GEMM + SiLU·mul + down on the packed rows only. Returns ``[R, E]``."""
    return layer.ffn(h[rows])


def folded_layer(
    layer: Layer,
    h: torch.Tensor,  # [K*N, E] layer input (model dtype)
    plan: FoldPlan,
    ctx: LayerContext,
    prefix_k: torch.Tensor | None,  # [Hkv, P, D]
    prefix_v: torch.Tensor | None,  # [Hkv, P, D]
    guard: float = DEFAULT_GUARD,
    ffn: str = "residual",
    trace: bool = False,
    parents: torch.Tensor | None = None,  # [K] long, needed by ffn="residual"
    delta: float = 0.0,
    attention: str = "correct",
) -> tuple[torch.Tensor, LayerCounts, LayerTrace | None]:
    """One SpecFold layer (SPEC §4 steps 2–6) given the layer's plan. Returns ``H_next [K*N, E]``.

    ``attention="direct"`` computes every row's attention directly over its branch's own (partly inherited) K/V
    in one batched call instead of correcting folded rows with Eq. 8 — the same result, exact; cheaper when the
    attention is a small share of the layer (short prefix, small model), where Eq. 8's bookkeeping costs more
    than the arithmetic it saves."""
    k, n = plan.recompute.shape
    rows, corrected, table = plan.rows, plan.corrected, plan.table
    r = rows.numel()
    q, kk, vv = qkv_rows(layer, h, rows, ctx)  # the layer's Q/K/V pools
    k_tab, v_tab = kk[table], vv[table]  # [K, N, Hkv, D] each branch's block K/V
    if attention == "direct":
        return _direct_attention_layer(layer, h, plan, ctx, prefix_k, prefix_v, q, k_tab, v_tab, ffn, trace,
                                       parents, delta)
    state = attend_rows(q, rows, prefix_k, prefix_v, k_tab, v_tab, ctx.scale)

    src_slot = table.reshape(-1)[corrected]  # [C] pool row of each corrected row's source
    q_c = q[src_slot]
    fix = correct_rows(
        q_c, state.m[src_slot], state.z[src_slot], state.o[src_slot], kk, vv,
        plan.branch_rows, plan.source_rows, plan.delta, ctx.scale, guard,
    )
    o_c = fix.o
    hit = fix.flagged.nonzero().squeeze(1)  # [G] guard fallbacks, recomputed by direct attention
    flagged = corrected[hit]
    if hit.numel():
        direct = attend_rows(q_c[hit], flagged, prefix_k, prefix_v, k_tab, v_tab, ctx.scale)
        o_c = o_c.index_copy(0, hit, direct.o)

    o_all = torch.cat([state.o, o_c]).to(h.dtype)  # [R + C, Hq, D]
    attn = layer.attn_out(o_all)  # NOTE: o_proj skips folded rows with Δ = ∅ (their W_o·O is the source's)
    h1 = h + attn[plan.out_index]
    h2, f_tab, ffn_recompute = _ffn_step(layer, h1, plan, ffn, parents, delta)

    counts = LayerCounts(
        folded=(~plan.recompute).sum(dim=1), guard=fix.flagged.sum(), recomputed=r, corrected=corrected.numel(),
        ffn_folded=(~ffn_recompute).sum(),
    )
    info = None
    if trace:
        o_tab = torch.cat([state.o, o_c])[plan.out_index].view(k, n, *state.o.shape[1:])
        info = LayerTrace(
            h=h.view(k, n, -1).clone(), rho=plan.rho, recompute=plan.recompute, src=plan.src,
            q=q[table], k=k_tab, v=v_tab, o=o_tab, f=f_tab.view(k, n, -1), flagged=flagged,
            h1=h1.view(k, n, -1).clone(), ffn_recompute=ffn_recompute,
        )
    return h2, counts, info


def _ffn_step(
    layer: Layer,
    h1: torch.Tensor,  # [K*N, E] post-attention residual
    plan: FoldPlan,
    ffn: str,
    parents: torch.Tensor | None,  # [K]
    delta: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SPEC §4 step 6 with the chosen FFN gate. Returns ``H_next [K*N, E]``, the FFN table ``[K*N, E]`` and the
    FFN's recompute mask ``[K, N]``."""
    k, n = plan.recompute.shape
    if ffn == "residual":
        ffn_recompute = ~fold_mask(relative_residual(h1.view(k, n, -1), parents), delta)
        _, ff_rows, ff_table = pool_index(ffn_recompute, parents)
    else:
        ffn_recompute, ff_rows, ff_table = plan.recompute, plan.rows, plan.table
    f_tab = ffn_rows(layer, h1, ff_rows)[ff_table.reshape(-1)]
    return h1 + f_tab, f_tab, ffn_recompute


def _direct_attention_layer(layer, h, plan, ctx, prefix_k, prefix_v, q, k_tab, v_tab, ffn, trace, parents, delta):
    """:func:`folded_layer` with ``attention="direct"`` (same arguments and results)."""
    k, n = plan.recompute.shape
    q_tab = q[plan.table]  # [K, N, Hq, D] each row's (possibly inherited) query
    state = attend(q_tab, prefix_k, prefix_v, k_tab, v_tab, None, ctx.scale)
    h1 = h + layer.attn_out(state.o.to(h.dtype).reshape(k * n, *q.shape[1:]))
    h2, f_tab, ffn_recompute = _ffn_step(layer, h1, plan, ffn, parents, delta)
    zero = torch.zeros((), dtype=torch.long, device=h.device)
    counts = LayerCounts(
        folded=(~plan.recompute).sum(dim=1), guard=zero, recomputed=plan.rows.numel(), corrected=0,
        ffn_folded=(~ffn_recompute).sum(),
    )
    info = None
    if trace:
        info = LayerTrace(
            h=h.view(k, n, -1).clone(), rho=plan.rho, recompute=plan.recompute, src=plan.src, q=q_tab, k=k_tab,
            v=v_tab, o=state.o, f=f_tab.view(k, n, -1), flagged=zero[None][:0], h1=h1.view(k, n, -1).clone(),
            ffn_recompute=ffn_recompute,
        )
    return h2, counts, info


class FoldedVerifier:
    """SpecFold verification behind the :class:`~specfold.engine.base.Verifier` interface.

    ``delta`` is the recompute threshold δ of Eq. 5; ``guard`` the cancellation-guard fraction of
    :mod:`specfold.engine.correction`; ``ffn`` ``"residual"`` (default, exact at δ = 0) or ``"paper"`` (SPEC §4
    step 6 literally; see the module docstring). ``backend="triton"`` runs each layer on the Triton kernels
    (:mod:`specfold.engine.triton_backend`, imported only then; fp32/bf16/fp16 models)."""

    def __init__(
        self,
        net: DLLM,
        delta: float,
        backend: str = "torch",
        guard: float = DEFAULT_GUARD,
        ffn: str = "residual",
        attention: str = "correct",
    ) -> None:
        if attention not in ATTENTION_MODES:
            raise ValueError(f"unknown attention mode {attention!r}; available: {', '.join(ATTENTION_MODES)}")
        if attention != "correct" and backend == "triton":
            raise ValueError("the triton backend implements attention='correct' (the Eq. 8 kernel)")
        self.attention = attention
        if backend not in BACKENDS:
            raise ValueError(f"unknown folded backend {backend!r}; available: {', '.join(BACKENDS)}")
        if ffn not in FFN_MODES:
            raise ValueError(f"unknown ffn mode {ffn!r}; available: {', '.join(FFN_MODES)}")
        if not 0.0 < guard <= 1.0:
            raise ValueError(f"guard must be in (0, 1], got {guard}")
        if backend == "triton":
            if net.dtype not in (torch.float32, torch.bfloat16, torch.float16):
                raise ValueError(f"the triton backend runs fp32/bf16/fp16 models, got {net.dtype}")
            try:
                import specfold.engine.triton_backend  # noqa: F401  (lazy: torch paths never import triton)
            except ImportError as err:
                raise ImportError("backend='triton' needs Triton: pip install 'specfold[triton]'") from err
        self.net, self.delta, self.backend, self.guard, self.ffn = net, float(delta), backend, guard, ffn

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
        parent_list = [int(p) for p in parents.tolist()]
        if parent_list[0] != -1 or any(not 0 <= p < i for i, p in enumerate(parent_list) if i > 0):
            raise ValueError(f"parents must be -1 for row 0 and in [0, k) for row k; got {parent_list}")
        par = torch.as_tensor(parent_list, dtype=torch.long, device=net.device)
        cos, sin, qscale = net.rope_tables(cache.length, n)
        ctx = LayerContext(cos=cos, sin=sin, qscale=qscale, scale=net.scale)
        h = torch.nn.functional.embedding(states.reshape(-1).to(net.device), net.embed)  # [K*N, E]
        counts: list[LayerCounts] = []
        out = FoldTrace() if trace else None
        plan_fn, layer_fn = gate_and_compact, folded_layer
        if self.backend == "triton":
            from specfold.engine.triton_backend import folded_layer_triton as layer_fn
            from specfold.engine.triton_backend import plan_layer as plan_fn
        for i, layer in enumerate(net.layers):
            plan = plan_fn(h.view(k, n, -1), par, self.delta)
            pk, pv = cache.layer(i)
            extra = {} if self.backend == "triton" else {"attention": self.attention}
            h, c, info = layer_fn(layer, h, plan, ctx, pk, pv, self.guard, self.ffn, trace, par, self.delta, **extra)
            counts.append(c)
            if out is not None:
                out.layers.append(info)
        logits = net.position_logits(net.logits(h).view(k, n, -1))
        return VerifyResult(logits, fold_stats(counts, parent_list, n)), out


def fold_stats(counts: list[LayerCounts], parents: list[int], n: int) -> dict[str, float]:
    """Counts of (branch ≥ 1, position, layer) triples, summed by layer and by graph depth (one device sync)."""
    k = len(parents)
    depth = branch_depths(parents)
    folded = torch.stack([c.folded for c in counts]).tolist()  # [L][K]
    guards = torch.stack([c.guard for c in counts]).tolist()
    ffn_folded = torch.stack([c.ffn_folded for c in counts]).tolist()
    stats: dict[str, float] = {"rows": float(k * n), "draft_triples": 0.0, "folded_triples": 0.0}
    for layer, per_branch in enumerate(folded):
        stats[f"folded_l{layer}"] = float(sum(per_branch))
        stats[f"draft_l{layer}"] = float((k - 1) * n)
        stats[f"recomputed_rows_l{layer}"] = float(counts[layer].recomputed)
        for b in range(1, k):
            stats[f"folded_d{depth[b]}"] = stats.get(f"folded_d{depth[b]}", 0.0) + per_branch[b]
            stats[f"draft_d{depth[b]}"] = stats.get(f"draft_d{depth[b]}", 0.0) + n
    stats["folded_triples"] = float(sum(sum(p) for p in folded))
    stats["draft_triples"] = float((k - 1) * n * len(counts))
    stats["guard_fallbacks"] = float(sum(guards))
    stats["ffn_folded_triples"] = float(sum(ffn_folded))
    stats["corrected_rows"] = float(sum(c.corrected for c in counts))
    return stats
