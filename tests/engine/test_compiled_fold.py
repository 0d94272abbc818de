"""The compiled folded layer (engine/compiled.py CompiledFold, ``MethodConfig.compile`` on specfold's folded passes):
its static-shape pieces with bucketed pools equal the eager folded layer (fp64, 1e-9), compiled they give the same
logits and a bounded number of graphs over many prefix lengths and branch counts, and δ = 0 specfold compiled is
token-identical to vanilla (fp32).

Compiling with inductor costs tens of seconds per graph on this project's CPU, so the default tier compiles with
``aot_eager`` (the same dynamo graphs, breaks and graph counts, without the C++ build); the inductor checks on the
embedded model are marked slow."""

from __future__ import annotations

import pytest
import torch
from tests.engine.branch_pass import PARENTS, branch_pass

from specfold.engine import compiled
from specfold.engine.base import BatchBranches
from specfold.engine.compiled import CompiledFold, graphs_compiled
from specfold.engine.folded import FoldedVerifier
from specfold.engine.folded_layer import folded_layer
from specfold.engine.gate import BranchGraph
from specfold.engine.layer_types import FoldConfig, LayerContext
from specfold.engine.plan import gate_and_compact
from specfold.model.cache import BatchCache

pytestmark = pytest.mark.usefixtures("one_thread")

FOLD = {"pass_choice": "fold", "attention": "direct"}  # fold every pass (the per-pass rule may choose dense)
GRAPH_BOUND = 6  # plan, attention (+ FFN gate), FFN: three per variant, a few variants (shared prefix, per request)


@pytest.fixture(params=["eager", pytest.param("inductor", marks=pytest.mark.slow)])
def backend(request, monkeypatch):
    """torch.compile's backend for this test: dynamo's ``eager`` (its graphs, breaks and counts, no AOT or inductor
    build) or ``inductor``. Each test builds a new model object, so nothing compiled before is reused."""
    monkeypatch.setattr(compiled, "BACKEND", request.param)
    return request.param


@pytest.mark.parametrize("family", ["fd", "nld"])
@pytest.mark.parametrize("ffn", ["residual", "paper"])
def test_static_pieces_equal_the_eager_layer(family, ffn, fd_ckpt, nld_ckpt) -> None:
    """Layer by layer from the same input: the bucketed static-shape pieces (uncompiled) against folded_layer with
    direct attention; both gates decide alike, so the tables and outputs agree to fp64 reassociation."""
    net, cache, states = branch_pass(fd_ckpt if family == "fd" else nld_ckpt, torch.float64)
    k, n = states.shape
    cos, sin, qscale = net.rope_tables(cache.length, n)
    graph = BranchGraph.of(PARENTS)
    ctx = LayerContext(cos=cos, sin=sin, qscale=qscale, scale=net.scale, parents=PARENTS, graph=graph)
    cfg = FoldConfig(delta=0.05, ffn=ffn, attention="direct", dense_fallback=False)
    plan_fn, layer_fn = CompiledFold(backend=None).steps(ctx)
    h = torch.nn.functional.embedding(states.reshape(-1), net.embed)
    folded = 0
    for i, layer in enumerate(net.layers):
        pk, pv = cache.layer(i)
        ref_plan = gate_and_compact(h.view(k, n, -1), graph, cfg.delta)
        ref, ref_counts, _ = folded_layer(layer, h, ref_plan, ctx, pk, pv, cfg)
        plan = plan_fn(h.view(k, n, -1), graph, cfg.delta)
        assert torch.equal(plan.recompute, ref_plan.recompute) and torch.equal(plan.src, ref_plan.src)
        assert torch.equal(plan.order[: int(plan.count)], ref_plan.rows)
        assert torch.equal(plan.table, ref_plan.table)
        out, counts, _ = layer_fn(layer, h, plan, ctx, pk, pv, cfg)
        assert (out - ref).abs().max().item() <= 1e-9, i
        for name in ("folded", "ffn_folded", "recomputed"):
            assert torch.equal(getattr(counts, name), getattr(ref_counts, name)), (i, name)
        folded += int(counts.folded.sum())
        h = ref
    assert folded > 0


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_softmax_lse_matches_its_reference(dtype) -> None:
    """The split attention's kernel (CPU flash with its log-sum-exp) against the explicit reference, odd shapes, a
    padded request and a request with no live key (lse = -inf)."""
    from specfold.engine.attention_rows import softmax_lse, softmax_lse_ref

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 2, s, 24, generator=gen, dtype=dtype) for s in (13, 37, 37))
    bias = torch.zeros(3, 1, 1, 37, dtype=dtype)
    bias[1, ..., 29:] = float("-inf")
    bias[2] = float("-inf")
    tol = 1e-12 if dtype == torch.float64 else 2e-6
    for b in (None, bias):
        o, lse = softmax_lse(q, k, v, b, 0.3)
        o_ref, lse_ref = softmax_lse_ref(q, k, v, b, 0.3)
        live = torch.isfinite(lse_ref)
        assert torch.equal(live, torch.isfinite(lse)) and (b is None or not live[2].any())
        assert (lse - lse_ref)[live].abs().max().item() <= tol
        assert (o - o_ref)[live].abs().max().item() <= tol


def test_static_plan_is_one_graph_without_host_reads() -> None:
    """The compiled gate + compaction traces whole (``fullgraph``: no ``nonzero``, no host read) into one dynamic
    graph that serves every branch count, and equals the eager plan."""
    from specfold.engine.compiled import _plan_tuple

    fn = torch.compile(_plan_tuple, dynamic=True, fullgraph=True, backend="eager")
    gen = torch.Generator().manual_seed(0)
    before, first = graphs_compiled(), None
    for k in (8, 5, 3, 8):
        graph = BranchGraph.of(PARENTS[:k])
        h = torch.randn(k, 32, 24, generator=gen, dtype=torch.float64)
        h[1:] = h[graph.par[1:]] + 0.1 * torch.randn(k - 1, 32, 24, generator=gen, dtype=torch.float64) * (
            torch.rand(k - 1, 32, 1, generator=gen) < 0.5)
        got, want = fn(h, graph, 0.05, None, None, 1), _plan_tuple(h, graph, 0.05, None, None, 1)
        for g, w in zip(got, want, strict=True):
            assert torch.equal(g, w)
        ref = gate_and_compact(h, graph, 0.05)
        assert torch.equal(got[4][: int(got[5])], ref.rows) and torch.equal(got[3], ref.table)
        first = graphs_compiled() if first is None else first
    assert first - before <= 1 and graphs_compiled() == first  # (0 if this process compiled it already)


def _batch(net, cache, states, prefixes: list[int], branches: list[int]) -> BatchBranches:
    """Requests over the same drafts, each with its own prefix length (a slice of one cache) and branch count."""
    r, kb = len(prefixes), max(branches)
    bc = BatchCache(net.cfg.num_layers, r, net.cfg.num_kv_heads, net.cfg.head_dim, max(prefixes), net.dtype, "cpu")
    for q, p in enumerate(prefixes):
        bc.k[:, q, :, :p] = cache.k[:, :, :p]
        bc.v[:, q, :, :p] = cache.v[:, :, :p]
    st = states[None, :kb].repeat(r, 1, 1)
    par = PARENTS[None, :kb].repeat(r, 1)
    return BatchBranches(states=st, parents=par, branches=branches, cache=bc, slots=torch.arange(r),
                         lengths=torch.tensor(prefixes))


@pytest.mark.slow  # loaded 2-core AVX2 EPYC: 52 s with dynamo's eager backend, 11 min with inductor
def test_compiled_fold_equals_eager_with_bounded_graphs(fd_ckpt, backend) -> None:
    """fp64: compiled and eager passes agree (1e-9; inductor 1e-8) at several prefix lengths and branch counts, one
    request and several; the graphs stay within GRAPH_BOUND and the shapes after the first compile nothing new."""
    net, cache, states = branch_pass(fd_ckpt, torch.float64)
    tol = 1e-9 if backend == "eager" else 1e-8  # inductor fuses and reorders reductions
    eager = FoldedVerifier(net, 0.05, cost=None, dense_fallback=False, **FOLD)
    comp = FoldedVerifier(net, 0.05, cost=None, dense_fallback=False, compile=True, **FOLD)
    before = graphs_compiled()
    shapes = [(13, 8), (7, 5), (11, 3), (13, 6), (5, 8)]  # (prefix length, branches)
    first = None
    for p, kb in shapes:
        cache.length = p
        want = eager.verify(cache, states[:kb], PARENTS[:kb])
        got = comp.verify(cache, states[:kb], PARENTS[:kb])
        assert (got.logits - want.logits).abs().max().item() <= tol, (p, kb)
        assert got.stats.folded_triples == want.stats.folded_triples > 0
        first = graphs_compiled() - before if first is None else first
    cache.length = 13
    single = graphs_compiled() - before
    assert single == first, "a new prefix length or branch count compiled a graph"
    for prefixes, branches in (([13, 9], [8, 5]), ([4, 13, 11], [3, 8, 8])):
        batch = _batch(net, cache, states, prefixes, branches)
        want, got = eager.verify_batch(batch), comp.verify_batch(batch)
        for w, g in zip(want.logits, got.logits, strict=True):
            assert (g - w).abs().max().item() <= tol, prefixes
    total = graphs_compiled() - before
    assert 0 < single <= GRAPH_BOUND // 2 and total <= GRAPH_BOUND, (single, total)
    assert comp._fold.graphs == total and comp._fold.compile_seconds > 0


@pytest.mark.slow  # loaded 2-core AVX2 EPYC: 2.7 min with dynamo's eager backend, 6.4 min with inductor
def test_compiled_specfold_at_delta_0_is_vanilla(backend) -> None:
    """The embedded model in fp32, every pass with drafts folded and compiled: δ = 0 specfold decodes vanilla's
    tokens on held-out prompts of each domain."""
    from specfold.api import decode_config_for, encode_prompt, prepare_method
    from specfold.config import MethodConfig
    from specfold.decoding.decoder import decode
    from specfold.eval.tasks.synthetic import TASKS, load_split
    from specfold.model.loading import load_model

    model = load_model(dtype="fp32")
    cfg = decode_config_for(model, 16)
    prompts = [encode_prompt(model, s.prompt) for t in TASKS for s in load_split(t, "test", limit=1)]
    drafter = prepare_method(model, MethodConfig("spiffy"), cfg).drafter
    verifier = FoldedVerifier(model.net, 0.0, cost=None, dense_fallback=False, compile=True, **FOLD)
    folded = graphs = 0
    for ids in prompts:
        got = decode(model, ids, cfg, verifier=verifier, drafter=drafter)
        assert got.token_ids == decode(model, ids, cfg).token_ids
        folded += got.engine_stats.folded_triples
        graphs += got.engine_stats.compiled_graphs
    assert folded > 0 and graphs >= verifier._fold.graphs > 0  # the dense passes (K = 1) compile too
