"""Compiled dense forwards (``MethodConfig.compile``, ``--compile``): :meth:`DLLM.forward` and
:meth:`DLLM.forward_ragged` under ``torch.compile`` with dynamic shapes, shared by every verifier of one model in a
process (vanilla, spiffy and specfold's dense passes, batch-1 and batched).

The prefix length changes every block and the branch and row counts every pass, so the forwards are compiled with
``dynamic=True``: after the first call of each (one graph per static specialisation inductor makes, a few in all),
the same graphs serve every length and branch count. Each call checks dynamo's ``unique_graphs`` counter: a call
that compiled a graph adds its wall time to :attr:`CompiledForwards.compile_seconds` and the graphs to
:attr:`CompiledForwards.graphs` — what the statistics report (``FoldStats.compile_seconds``,
``FoldStats.compiled_graphs``), so that a run says what compiling cost it and how often it recompiled.

Inductor keeps compiled kernels in its on-disk cache (``TORCHINDUCTOR_CACHE_DIR``, default
``/tmp/torchinductor_$USER``): a second process skips the C++ builds but still traces (measured on this AVX2 EPYC
under load: tens of seconds per process either way — see docs/results.md, "Compiled forwards").
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any

import torch

from specfold.engine.folded_layer import attention_pooled, ffn_pooled
from specfold.engine.layer_types import LayerContext, LayerCounts
from specfold.engine.plan import StaticPlan, static_plan
from specfold.model.linear import bucket_rows
from specfold.model.transformer import DLLM

# NOTE: generous: one entry per static specialisation; dynamic=True keeps this to a handful per forward.
RECOMPILE_LIMIT = 16
# torch.compile's backend for every compiled part of this module. Tests may set "eager" (dynamo only): the same graphs
# (and graph counts) without inductor's C++ build, seconds instead of minutes on a CPU.
BACKEND = "inductor"


def graphs_compiled() -> int:
    """Graphs dynamo compiled in this process so far (all callers)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _dynamic_config() -> None:
    """Room for the few specialisations dynamic shapes still make. NOTE: duck shaping stays on: without it the
    ragged layer stack's symbols multiply and inductor's post-grad passes spent over 20 minutes in sympy on one
    graph (py-spy, AVX2 EPYC); with it, two sizes equal on a graph's first call (8 requests in a cache of 8 slots)
    are related until a call tells them apart, and that call compiles once more."""
    import torch._dynamo

    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, RECOMPILE_LIMIT)


class CompiledForwards:
    """The model's two dense forwards compiled, with the compile seconds and graphs of the calls so far."""

    def __init__(self, net: DLLM) -> None:
        _dynamic_config()
        self._forward = torch.compile(net.forward, dynamic=True, backend=BACKEND)
        self._net = net
        # NOTE: the layer stack only: forward_ragged's host reads (the longest prefix, the valid blocks, the slot
        # order) stay outside the graph, which would otherwise break there (dynamo warns and splits it). Only the
        # sizes that change between passes are symbols (_ragged_layers marks them); the rest (layers, heads, block,
        # the cache's slots and capacity) stay constants: with every size a symbol (dynamic=True) inductor spent
        # minutes simplifying one graph's shape expressions on this project's CPU, with these few 20-30 s.
        self._ragged_compiled = torch.compile(net.ragged_layers, dynamic=None, backend=BACKEND)
        self.compile_seconds = 0.0
        self.graphs = 0

    def _call(self, fn, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, float, int]:
        before = graphs_compiled()
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        new = graphs_compiled() - before
        seconds = time.perf_counter() - t0 if new else 0.0
        self.compile_seconds += seconds
        self.graphs += new
        return out, seconds, new

    def forward(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, float, int]:
        """:meth:`DLLM.forward`'s result, and the seconds and graphs this call spent compiling."""
        return self._call(self._forward, *args, **kwargs)

    def forward_ragged(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, float, int]:
        """:meth:`DLLM.forward_ragged`'s result (its layer stack compiled), and the seconds and graphs this call spent
        compiling."""
        return self._call(self._net.forward_ragged, *args, layers=self._ragged_layers, **kwargs)

    def _ragged_layers(self, h, cos, sin, qscale, prefix_k, prefix_v, lengths, request, bias, write):
        """:meth:`DLLM.ragged_layers` compiled, its changing sizes marked dynamic: the blocks ``B'`` (rows of ``h``,
        ``cos``, ``sin``, ``qscale``, ``request``), the requests ``R`` and the longest prefix ``P`` (``prefix_k``,
        ``prefix_v`` ``[L, R, Hkv, P, D]``, ``lengths``, the write's slots and positions). A size of 1 still gets
        its own graph (dynamo specialises 0 and 1): a bounded handful in all, counted in :attr:`graphs`."""
        marks = [(h, 0), (cos, 0), (sin, 0), (request, 0), (lengths, 0), (prefix_k, 1), (prefix_k, 3),
                 (prefix_v, 1), (prefix_v, 3)]
        if qscale is not None:
            marks.append((qscale, 0))
        if write is not None:
            marks += [(write[1], 0), (write[2], 0)]
        for tensor, dim in marks:
            torch._dynamo.maybe_mark_dynamic(tensor, dim)
        return self._ragged_compiled(h, cos, sin, qscale, prefix_k, prefix_v, lengths, request, bias, write)


_OF: weakref.WeakKeyDictionary[DLLM, CompiledForwards] = weakref.WeakKeyDictionary()


def compiled_forwards(net: DLLM) -> CompiledForwards:
    """The model's compiled forwards, made once per model object and process."""
    if net not in _OF:
        _OF[net] = CompiledForwards(net)
    return _OF[net]


# --- the folded layer compiled (torch backend) ----------------------------------------------------------------------


def _plan_tuple(h, graph, delta, fold, request, requests):
    p = static_plan(h, graph, delta, fold, request, requests)
    return p.rho, p.recompute, p.src, p.table, p.order, p.count, p.sizes


def _attention_tuple(layer, h, plan, size, ctx, prefix_k, prefix_v, group_rows, ffn_gate, delta, requests):
    h1 = attention_pooled(layer, h, plan, size, ctx, prefix_k, prefix_v, group_rows)
    if not ffn_gate:
        return (h1,)
    k, n = plan.recompute.shape
    return (h1, *_plan_tuple(h1.view(k, n, -1), ctx.graph, delta, None, ctx.branch_request, requests))


def _ffn_tuple(layer, h1, plan, size, recompute):
    h2 = ffn_pooled(layer, h1, plan, size)
    counts = ((~recompute).sum(dim=1), (~plan.recompute).sum(dim=1), recompute.sum(dim=1))
    return h2, *counts


class CompiledFold:
    """The torch backend's folded layer under ``torch.compile`` (``dynamic=True``) in three graphs per layer: the
    gate and compaction (:func:`~specfold.engine.plan.static_plan`), the attention part with the FFN's gate
    (:func:`~specfold.engine.folded_layer.attention_pooled`), and the FFN on its pool
    (:func:`~specfold.engine.folded_layer.ffn_pooled`). Between them the host reads each pool's row count once and
    rounds it up to a bucket (:func:`~specfold.model.linear.bucket_rows`), so the graphs see shapes (K, N, bucket,
    P), all dynamic: a bounded number of graphs, whatever the prefix length, branch count or fold ratio.

    Attention is always direct (split, exact without a guard) and the FFN always runs on its pool: the per-layer
    cost rule's choices are the eager engine's. Every layer of a model shares the graphs (layers are inputs).
    ``compile_seconds`` and ``graphs`` accumulate like :class:`CompiledForwards`'; :meth:`take` hands a pass its
    share. ``backend=None`` runs the same pieces uncompiled: the compiled layer's reference (same signature)."""

    def __init__(self, backend: str | None = "default") -> None:
        backend = BACKEND if backend == "default" else backend
        _dynamic_config()
        wrap = (lambda f: f) if backend is None else (lambda f: torch.compile(f, dynamic=True, backend=backend))
        self._plan, self._attention, self._ffn = wrap(_plan_tuple), wrap(_attention_tuple), wrap(_ffn_tuple)
        self.compile_seconds = 0.0
        self.graphs = 0
        self._pass = (0.0, 0)

    def _call(self, fn, *args: Any) -> tuple:
        before = graphs_compiled()
        t0 = time.perf_counter()
        out = fn(*args)
        new = graphs_compiled() - before
        if new:
            seconds = time.perf_counter() - t0
            self.compile_seconds += seconds
            self.graphs += new
            self._pass = (self._pass[0] + seconds, self._pass[1] + new)
        return out

    def take(self) -> tuple[float, int]:
        """The compile seconds and graphs since the last call (one pass's)."""
        out, self._pass = self._pass, (0.0, 0)
        return out

    def steps(self, ctx: LayerContext) -> tuple[Callable, Callable]:
        """The pass's ``plan_fn`` and ``layer_fn`` (the signatures of
        :func:`~specfold.engine.plan.gate_and_compact` and :func:`~specfold.engine.folded_layer.folded_layer`)."""
        request = ctx.branch_request
        requests = 1 if request is None else int(ctx.prefix_len.shape[0])

        def plan_fn(h, graph, delta, fold=None) -> StaticPlan:
            return StaticPlan(*self._call(self._plan, h, graph, delta, fold, request, requests))

        def layer_fn(layer, h, plan, ctx, prefix_k, prefix_v, cfg, trace=False, cost=None):
            k, n = plan.recompute.shape
            m = k * n
            counts = torch.cat([plan.count.reshape(1), plan.sizes]).tolist()  # NOTE: the layer's one host read
            r, size = counts[0], min(bucket_rows(counts[0]), m)
            group_rows = None
            if prefix_k is not None and prefix_k.dim() == 4:
                sizes = counts[1:]
                group_rows = max(sizes[:-1] + [sizes[-1] + size - r])
            residual = cfg.ffn == "residual"
            out = self._call(self._attention, layer, h, plan, size, ctx, prefix_k, prefix_v, group_rows, residual,
                             cfg.delta, requests)
            h1, fplan = out[0], (StaticPlan(*out[1:]) if residual else plan)
            r_f = int(fplan.count) if residual else r  # NOTE: the FFN pool's host read
            h2, folded, ffn_folded, recomputed = self._call(
                self._ffn, layer, h1, fplan, min(bucket_rows(r_f), m), plan.recompute)
            zero = torch.zeros_like(folded)
            return h2, LayerCounts(folded=folded, ffn_folded=ffn_folded, guard=zero, recomputed=recomputed,
                                   corrected=zero, dense=r == m), None

        return plan_fn, layer_fn


_FOLD_OF: weakref.WeakKeyDictionary[DLLM, CompiledFold] = weakref.WeakKeyDictionary()


def compiled_fold(net: DLLM) -> CompiledFold:
    """The model's compiled folded layer, made once per model object and process."""
    if net not in _FOLD_OF:
        _FOLD_OF[net] = CompiledFold()
    return _FOLD_OF[net]
