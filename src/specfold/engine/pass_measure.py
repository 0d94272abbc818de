"""Measuring the per-pass rule's constants (:class:`~specfold.engine.cost.PassCost`) on this machine: the model's
first layer timed dense and folded once per process, device, dtype and layer shape. Apart from
:mod:`specfold.engine.cost` because it runs the folded layer, which itself uses the cost rule."""

from __future__ import annotations

import time

import torch

from specfold.engine.cost import PASS_BLOCK, PASS_PREFIX, PASS_ROWS, LayerCost, PassCost
from specfold.engine.folded_layer import folded_layer
from specfold.engine.gate import BranchGraph
from specfold.engine.layer_types import FoldConfig, LayerContext
from specfold.engine.plan import gate_and_compact
from specfold.model.attention import attend_fused
from specfold.timing import interleaved

_PASS_MEASURED: dict[tuple, tuple[float, float, float]] = {}


def measure_pass(net, layer_cost: LayerCost, repeats: int = 5) -> PassCost:
    """:class:`PassCost` of ``net`` (a :class:`~specfold.model.transformer.DLLM`) on this machine: its first layer
    timed dense and folded at fold ratio 1/2 on random rows (medians of ``repeats``, interleaved), cached per
    (device, dtype, layer shape). Costs a few dense layers of ``PASS_ROWS`` rows once; the wall seconds it took are
    :attr:`PassCost.measure_seconds` (0.5 s for the embedded model on the AVX2 EPYC, fp32, one thread)."""
    c = net.cfg
    key = (str(net.device), net.dtype, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size)
    if key not in _PASS_MEASURED:
        start = time.perf_counter()
        gen = torch.Generator().manual_seed(0)
        k, n, p = PASS_ROWS // PASS_BLOCK, PASS_BLOCK, PASS_PREFIX
        layer = net.layers[0]
        dev, dt = net.device, net.dtype
        h = torch.randn(k * n, c.hidden_size, generator=gen).to(dev, dt)
        pk = torch.randn(c.num_kv_heads, p, c.head_dim, generator=gen).to(dev, dt)
        pv = torch.randn(c.num_kv_heads, p, c.head_dim, generator=gen).to(dev, dt)
        parents = torch.tensor([-1] + list(range(k - 1)), device=dev)  # a chain: every branch has drafts above it
        graph = BranchGraph.of(parents)
        cos, sin, qscale = net.rope_tables(p, n)
        ctx = LayerContext(cos=cos, sin=sin, qscale=qscale, scale=net.scale, parents=parents, graph=graph)
        fold = torch.rand(k, n, generator=gen).to(dev) < 0.5
        fold[0] = False
        # NOTE: ffn="paper" runs the FFN on the recomputed rows only, which is what w(f) assumes a pass saves (in a real
        # pass the FFN's own gate folds at least as many rows as attention's: 0.81 vs 0.60 in `bench pass`). Its own
        # gate on these random rows folded none, so the whole FFN was charged to G: G came out at 3-5 ms a layer,
        # as much as folding half the rows saves, and the rule never folded.
        cfg = FoldConfig(delta=0.1, attention="direct", dense_fallback=False, ffn="paper")

        def folded() -> None:
            plan = gate_and_compact(h.view(k, n, -1), graph, cfg.delta, fold)
            folded_layer(layer, h, plan, ctx, pk, pv, cfg)

        def dense() -> None:
            q, kk, vv = layer.qkv(h, cos.repeat(k, 1), sin.repeat(k, 1), None if qscale is None else qscale.repeat(k))
            o = attend_fused(q.view(k, n, layer.hq, layer.d), pk, pv, kk.view(k, n, layer.hkv, layer.d),
                             vv.view(k, n, layer.hkv, layer.d), None, net.scale)
            h1 = h + layer.attn_out(o.to(h.dtype).reshape(k * n, layer.hq, layer.d))
            h1 + layer.ffn(h1)

        with torch.no_grad():
            t = interleaved({"dense": dense, "folded": folded}, repeats, device=dev)
        real_fold = float(fold[1:].float().mean())
        dense_s = t["dense"].median
        probe = PassCost(layer_cost, dense_s, 0.0)
        gate = t["folded"].median - dense_s * probe.remaining(k * n, n, p, real_fold)
        _PASS_MEASURED[key] = (dense_s, max(gate, 0.0), time.perf_counter() - start)
    dense_s, gate, seconds = _PASS_MEASURED[key]
    return PassCost(layer_cost, dense_s, gate, seconds)
