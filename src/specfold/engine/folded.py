"""Folded verification (SpecFold, SPEC §4): the dense verifier's forward with draft rows folded into ancestors.

Dims: ``K`` branches (row 0 = main, ``parents[k] < k``), ``N`` block positions, ``E`` hidden size, ``Hq``/``Hkv``
heads, ``D`` head dim, ``V`` vocabulary, ``R`` recomputed rows of a layer (packed over all branches), ``C``
folded rows whose attention context changed (``Δ ≠ ∅``) and is corrected by Eq. 8.

The pass is split by concept: the per-layer plan (:mod:`specfold.engine.plan`), the folded layer
(:mod:`specfold.engine.folded_layer`), its statistics (:mod:`specfold.engine.stats`) and here the verifier that
runs the layers. Per layer, for every branch at once (a parent's layer-ℓ input is ready once layer ℓ−1 is done for
all):

1. :func:`~specfold.engine.plan.gate_and_compact` — Eq. 4/5 on the layer input ``H`` against the immediate
   parent, the packed list of recomputed rows, and for every (branch, position) the *pool row* it holds: the
   recomputed row of its nearest recomputing ancestor (:func:`~specfold.engine.gate.resolve_sources`). The
   per-layer Q/K/V, attention-output and FFN tables of SPEC §4 are gathers of pools indexed this way; a folded
   row never owns a copy.
2. :func:`~specfold.engine.folded_layer.qkv_rows` — RMSNorm + QKV GEMM + RoPE for recomputed rows only.
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

from dataclasses import replace

import torch

from specfold.engine.base import BatchBranches, BatchVerifyResult, VerifyResult, window_head, window_logits
from specfold.engine.cost import LayerCost, measure_machine
from specfold.engine.dense import DenseVerifier
from specfold.engine.folded_layer import folded_layer
from specfold.engine.gate import BranchGraph, check_parents, safe_parents
from specfold.engine.layer_types import FoldConfig, FoldTrace, LayerContext, LayerCounts
from specfold.engine.pass_measure import measure_pass
from specfold.engine.plan import gate_and_compact
from specfold.engine.profiling import part
from specfold.engine.stats import FoldStats, fold_stats_batch
from specfold.model.cache import PrefixCache
from specfold.model.transformer import DLLM

FOLD_PRIOR = 0.5  # f̂ before the first folded pass (the paper: 0.52-0.67 at δ = 0.1)
FOLD_MEMORY = 8  # passes the running fold ratio f̂ averages over (an exponential mean)
DENSE_STATS_KEPT = 1024  # statistics of dense passes kept per verifier (by shape and branch graph)


def _with_compile(stats: list[FoldStats], seconds: float, graphs: int) -> list[FoldStats]:
    """``stats`` (per request) with a pass's compile seconds and graphs on its first request, where the compiled
    forwards and the compiled fold put them. ``stats`` itself is never changed: it may be a memoised list
    (:meth:`FoldedVerifier._dense_stats`)."""
    return [replace(stats[0], compile_seconds=seconds, compiled_graphs=graphs), *stats[1:]] if graphs else stats


def _dense_compile(dense: FoldStats, stats: list[FoldStats]) -> list[FoldStats]:
    """``stats`` with what a pass the dense verifier ran compiled (``dense``: its first request's statistics)."""
    return _with_compile(stats, dense.compile_seconds, dense.compiled_graphs)


class FoldedVerifier:
    """SpecFold verification behind the :class:`~specfold.engine.base.Verifier` interface.

    Settings are a :class:`~specfold.engine.layer_types.FoldConfig` (``cfg``) or its fields as keywords.
    ``backend="triton"`` runs each layer on the Triton kernels (:mod:`specfold.engine.triton_backend`, imported
    only then; fp32/bf16/fp16 models). ``cost`` is the per-layer cost rule (default: measured on this machine for
    the model's device and dtype, see :mod:`specfold.engine.cost`); ``cost=None`` with ``dense_fallback=False``
    and an explicit attention mode folds unconditionally. ``compile``: the dense passes (no drafts, or the per-pass
    rule's) run the compiled forwards (:mod:`specfold.engine.compiled`), and with the torch backend (attention
    ``auto`` or ``direct``) so do the folded layers (:class:`~specfold.engine.compiled.CompiledFold`: split
    attention, gated FFN, bucketed pools; not for ``trace``)."""

    def __init__(
        self, net: DLLM, delta: float = 0.1, *, cfg: FoldConfig | None = None, cost: LayerCost | str | None = "auto",
        compile: bool = False, **settings,
    ) -> None:
        cfg = cfg if cfg is not None else FoldConfig(delta=delta, **settings)
        if cfg.backend == "triton":
            if net.dtype not in (torch.float32, torch.bfloat16, torch.float16):
                raise ValueError(f"the triton backend runs fp32/bf16/fp16 models, got {net.dtype}")
            try:
                import specfold.engine.triton_backend  # noqa: F401  (lazy: torch paths never import triton)
            except ImportError as err:
                raise ImportError("backend='triton' needs Triton: pip install 'specfold[triton]'") from err
        pass_cost = None
        if cost == "auto":
            c = net.cfg
            machine = measure_machine(net.device, net.dtype)
            cost = LayerCost.of(c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size,
                                machine.op_macs)
            if cfg.pass_choice == "auto" and cfg.dense_fallback and cfg.imposed_fold is None:
                pass_cost = measure_pass(net, cost)
        self.net, self.cfg, self.cost, self.pass_cost = net, cfg, cost, pass_cost
        # f̂ of the per-pass rule: the attention-gate fold ratio of this verifier's folded passes, a running mean
        # (FOLD_MEMORY passes) from the prior FOLD_PRIOR. NOTE: it moves only when a pass folds, so a verifier that
        # chose dense keeps choosing dense for passes of the same shape until the prefix grows enough to pay.
        self.fold_estimate = FOLD_PRIOR
        self._imposed_masks: dict[tuple[int, int], torch.Tensor] = {}  # cfg.imposed_fold's, per (K, N)
        self._dense = DenseVerifier(net, compile=compile)  # passes without drafts, and the per-pass rule's
        self._fold = None
        if compile and cfg.backend == "torch" and cfg.attention != "correct":
            from specfold.engine.compiled import compiled_fold

            self._fold = compiled_fold(net)
        self._root_stats_of: dict[int, FoldStats] = {}  # per N
        self._dense_stats_of: dict[tuple, list[FoldStats]] = {}  # per (N, branches, parents): the rule's dense passes

    @property
    def delta(self) -> float:
        return self.cfg.delta

    @torch.no_grad()
    def verify(
        self,
        cache: PrefixCache,
        states: torch.Tensor,  # [K, N] (or [K, W]: a window, with rows)
        parents: torch.Tensor,  # [K] long, parents[0] = -1
        rows: slice | None = None,  # a window's rows whose logits are returned
    ) -> VerifyResult:
        return self.run(cache, states, parents, rows=rows)[0]

    @torch.no_grad()
    def run(
        self,
        cache: PrefixCache,
        states: torch.Tensor,  # [K, N]
        parents: torch.Tensor,  # [K] long, parents[0] = -1
        trace: bool = False,
        rows: slice | None = None,  # a window's rows whose logits are returned (base.window_logits)
    ) -> tuple[VerifyResult, FoldTrace | None]:
        """The pass; with ``trace`` also every layer's tables (:class:`LayerTrace`). A window pass (``rows``: a
        bidirectional family's block among the rows around it, at positions ``cache.start ..``) also counts the
        draft triples of the block's rows and those folded (``FoldStats.block_*``)."""
        net = self.net
        k, n = states.shape
        head = None if rows is None else (k - 1) * (rows.stop - rows.start) * len(net.layers)  # block draft triples
        if k == 1 and not trace:  # no drafts: nothing can fold
            dense = self._dense.verify(cache, states, parents, rows)
            return VerifyResult(dense.logits, _dense_compile(dense.stats, [self._root_stats(n)])[0]), None
        par, checked = self._parents(parents[None])
        if not trace and self._dense_pass(k * n, n, cache.length):
            dense = self._dense.verify(cache, states, parents, rows)
            stats = _dense_compile(dense.stats, self._dense_stats(checked, n, [k]))[0]
            return VerifyResult(dense.logits, stats if head is None else replace(stats, block_draft_triples=head)), None
        cos, sin, qscale = net.rope_tables(cache.start, n)
        graph = BranchGraph.of(checked[0], net.device) if self.cfg.backend == "torch" else None
        ctx = LayerContext(cos=cos, sin=sin, qscale=qscale, scale=net.scale, parents=par.reshape(-1), graph=graph)
        prefixes = [cache.layer(i) for i in range(len(net.layers))]
        logits, counts, out = self.forward(states, ctx, prefixes, trace, rows=rows)
        stats = self._compile_cost(fold_stats_batch(counts, checked, n, [k]))[0]
        self._observe(stats)
        if rows is not None:
            stats = replace(stats, block_draft_triples=head, block_folded_triples=int(self._block_folded))
        return VerifyResult(logits, stats), out

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
            dense = self._dense.verify_batch(batch)
            return BatchVerifyResult(dense.logits, _dense_compile(dense.stats[0], [self._root_stats(n)] * r))
        dev = net.device
        local, checked = self._parents(batch.parents)
        rows = sum(batch.branches) * n
        if self._dense_pass(rows, n, batch.lengths, roots=r):
            dense = self._dense.verify_batch(batch)
            return BatchVerifyResult(dense.logits, _dense_compile(dense.stats[0], self._dense_stats(checked, n,
                                                                                                 batch.branches)))
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
        first = lengths if batch.starts is None else batch.starts.to(dev)  # [R] the blocks' first positions
        positions = first.index_select(0, request)[:, None] + torch.arange(n, device=dev)  # [K', N]
        cos, sin, qscale = net.rotary.tables(positions.reshape(-1), net.dtype)
        ctx = LayerContext(cos=cos, sin=sin, qscale=qscale, scale=net.scale, parents=par,
                           prefix_len=lengths.to(torch.int32), branch_request=request if ragged else None,
                           graph=graph)
        p_max = int(batch.lengths.max())  # NOTE: host-side lengths (the batch decoder's), read before the layers
        slots = batch.slots.to(dev)
        # the decoding core keeps its requests in slots 0..R-1, so the prefix is a view; otherwise it is gathered.
        rows = slice(0, r) if slots.tolist() == list(range(r)) else slots
        prefixes = [(batch.cache.k[i, rows, :, :p_max], batch.cache.v[i, rows, :, :p_max])
                    for i in range(len(net.layers))]
        logits, counts, _ = self.forward(states, ctx, prefixes, head_rows=None if ragged else keep)
        per_request = list(torch.split(logits, batch.branches))
        stats = self._compile_cost(fold_stats_batch(counts, checked, n, batch.branches, starts))
        self._observe(sum(stats, FoldStats()))
        return BatchVerifyResult(per_request, stats)

    def _dense_pass(self, m: int, n: int, prefix: int | torch.Tensor, roots: int = 1) -> bool:
        """The per-pass rule (``cfg.pass_choice``): whether a pass of ``m`` rows (block ``n``, ``prefix`` keys, or
        the requests' host-side lengths ``[R]``, averaged; ``roots`` requests, each with a main branch that never
        folds) runs dense, decided before any gate from :attr:`pass_cost` and the running fold ratio. Without a rule
        nothing is read."""
        choice = self.cfg.pass_choice
        if choice != "auto":
            return choice == "dense"
        if self.pass_cost is None:
            return False
        keys = prefix if isinstance(prefix, int) else int(prefix.float().mean())  # NOTE: host lengths, no sync
        return not self.pass_cost.folding_pays(m, n, keys, self.fold_estimate, roots)

    def _compile_cost(self, stats: list[FoldStats]) -> list[FoldStats]:
        """The compiled folded layer's compile seconds and graphs of this pass, on its first request."""
        return stats if self._fold is None else _with_compile(stats, *self._fold.take())

    def _observe(self, stats: FoldStats) -> None:
        """Move f̂ towards a folded pass's fold ratio."""
        ratio = stats.fold_ratio()
        if ratio is not None:
            self.fold_estimate += (ratio - self.fold_estimate) / FOLD_MEMORY

    def _dense_stats(self, parents: list[list[int]] | torch.Tensor, n: int, branches: list[int]) -> list[FoldStats]:
        """Per request, the statistics of a pass the per-pass rule ran dense: every row recomputed at every layer
        (drafts counted, none folded), ``dense_passes`` 1."""
        if isinstance(parents, torch.Tensor):
            parents = [[int(p) for p in row] for row in parents.tolist()]
        key = (n, tuple(branches), tuple(tuple(row[:b]) for row, b in zip(parents, branches, strict=True)))
        if key in self._dense_stats_of:  # NOTE: rebuilt, they cost ~0.24 ms a pass (profiled): a few % of a small pass
            return self._dense_stats_of[key]
        if len(self._dense_stats_of) >= DENSE_STATS_KEPT:
            self._dense_stats_of.clear()
        self._dense_stats_of[key] = out = self._dense_stats_made(parents, n, branches)
        return out

    def _dense_stats_made(self, parents: list[list[int]], n: int, branches: list[int]) -> list[FoldStats]:
        """:meth:`_dense_stats` computed (host parents)."""
        width = sum(branches)
        every, none = torch.full((width,), n, dtype=torch.long), torch.zeros(width, dtype=torch.long)
        counts = [LayerCounts(folded=none, ffn_folded=none, guard=none, recomputed=every, corrected=none, dense=True)
                  for _ in self.net.layers]
        starts = [sum(branches[:q]) for q in range(len(branches))]
        return [replace(s, dense_passes=1) for s in fold_stats_batch(counts, parents, n, branches, starts)]

    def _root_stats(self, n: int) -> FoldStats:
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
            return safe_parents(raw), raw
        rows = [[int(p) for p in row] for row in parents.tolist()]
        for row in rows:
            check_parents(row)
        return torch.as_tensor(rows, dtype=torch.long, device=net.device), rows

    def forward(
        self,
        states: torch.Tensor,  # [K, N]
        ctx: LayerContext,
        prefixes: list[tuple[torch.Tensor, torch.Tensor]],  # per layer (k [Hkv, P, D] or [R, Hkv, P, D], v alike)
        trace: bool = False,
        head_rows: torch.Tensor | None = None,  # [K'] long: branches whose logits are computed (default: all)
        rows: slice | None = None,  # a window's rows whose logits are computed (base.window_logits)
    ) -> tuple[torch.Tensor, list[LayerCounts], FoldTrace | None]:
        """Embedding, the folded layers and the LM head: logits ``[K, N, V]`` (``[K', N, V]``) and the per-layer
        counts (device tensors). With the triton backend this issues no host sync (what
        :mod:`specfold.engine.cuda_graphs` captures). For a window's ``rows``: logits ``[K, b - a, V]``, and the drafts'
        folded (branch, block row, layer) triples left in ``self._block_folded`` (a device scalar)."""
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
            if self._fold is not None and not trace:
                plan_fn, layer_fn = self._fold.steps(ctx)
        graph = ctx.parents if ctx.graph is None else ctx.graph
        imposed = self._imposed(k, n)
        block_folded = []
        for i, (layer, (pk, pv)) in enumerate(zip(net.layers, prefixes, strict=True)):
            plan = plan_fn(h.view(k, n, -1), graph, self.cfg.delta, None if imposed is None else imposed[i])
            h, c, info = layer_fn(layer, h, plan, ctx, pk, pv, self.cfg, trace, self.cost)
            if rows is not None:  # a layer the cost rule ran dense folded nothing
                block_folded.append(torch.zeros((), dtype=torch.long, device=h.device) if c.dense is True
                                    else (~plan.recompute[1:, rows]).sum())
            counts.append(c)
            if out is not None:
                out.layers.append(info)
        with part("head"):
            h = h.view(k, n, -1)
            if rows is not None:
                self._block_folded = torch.stack(block_folded).sum()
                return window_logits(net, net.logits(h[:, window_head(rows)]), rows), counts, out
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
