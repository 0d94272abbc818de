"""Compiled dense forwards (``MethodConfig.compile``): the same tokens as eager on held-out prompts of the embedded
model (fp32) for every method, batch-1 and batched, δ = 0 specfold token-identical to vanilla, and a bound on the
graphs compiled while the prefix length and branch counts change. The compile itself is the cost (tens of seconds
per process on a CPU: 25 minutes did not finish every method batch-1 and batched on a loaded 2-core AVX2 EPYC),
so the default tier compiles a two-layer random checkpoint (its logits within fp32 reassociation of eager at many
prefix lengths and branch counts, batch-1 and ragged, with at most :data:`SMALL_GRAPH_BOUND` graphs) and decides
the CLI's compile default; the embedded model's every method, batched, and 51 prompts are marked slow."""

from __future__ import annotations

import argparse

import pytest
import torch

from specfold.api import decode_config_for, encode_prompt, prepare_method
from specfold.config import MethodConfig
from specfold.decoding.core import BatchMethod
from specfold.decoding.decoder import decode, decode_batch
from specfold.engine.base import BatchBranches
from specfold.engine.compiled import compiled_forwards, graphs_compiled
from specfold.engine.dense import DenseVerifier
from specfold.eval.tasks.synthetic import TASKS, load_split
from specfold.model.cache import BatchCache
from specfold.model.loading import load_checkpoint, load_model

pytestmark = pytest.mark.usefixtures("one_thread")

# graphs for the whole module: batch-1 and ragged forwards, each a few dynamic graphs plus the pieces between its
# graph breaks (host reads); what matters is that it does not grow with the prompts, prefix lengths or branches
GRAPH_BOUND = 24
# the two-layer checkpoint's ragged forward over 5..70-token prefixes and 1..5 branches: a dynamic graph plus the
# pieces around its graph breaks (host reads), each specialised at most once more for a size of 1
SMALL_GRAPH_BOUND = 8
FP32_LOGITS = 1e-4  # |compiled - eager| on logits of magnitude ~1-10: fp32 reassociation, not a different sum


@pytest.fixture(params=["eager", pytest.param("inductor", marks=pytest.mark.slow)])
def backend(request, monkeypatch):
    """torch.compile's backend: dynamo's ``eager`` (the same graphs and graph counts, no C++ build: the default tier)
    or ``inductor`` (what users run; 30 min on the loaded 2-core AVX2 EPYC for the two-layer checkpoint, slow)."""
    from specfold.engine import compiled

    monkeypatch.setattr(compiled, "BACKEND", request.param)
    return request.param


def test_compiled_dense_passes_match_eager_with_bounded_graphs(fd_ckpt, backend):
    """Prefix lengths 2..70 and 1..8 branches (batch-1 passes): the compiled forward gives eager's logits (fp32
    reassociation) and their argmax, and it compiles two graphs (K >= 2, then K = 1's specialisation) however many
    shapes follow (~9 s of CPU with dynamo's eager backend)."""
    _, cfg, net = load_checkpoint(fd_ckpt, dtype=torch.float32)
    eager, compiled = DenseVerifier(net), DenseVerifier(net, compile=True)
    gen = torch.Generator().manual_seed(0)
    n, start = 32, graphs_compiled()
    for prefix, k in [(13, 3), (40, 1), (2, 8), (70, 5), (29, 1)]:
        cache = net.new_cache(128)
        net(torch.randint(0, 299, (prefix,), generator=gen)[None], cache, mask="causal", write_cache=True)
        states = torch.randint(0, 299, (k, n), generator=gen)
        want = eager.verify(cache, states, None).logits
        got = compiled.verify(cache, states, None).logits
        assert (got - want).abs().max().item() < FP32_LOGITS, (prefix, k)
        assert torch.equal(got.argmax(-1), want.argmax(-1)), (prefix, k)
        if (prefix, k) == (40, 1):
            after_two = graphs_compiled()
    assert graphs_compiled() == after_two  # the last three shapes compiled nothing
    forwards = compiled_forwards(net)
    assert 0 < forwards.graphs == graphs_compiled() - start <= 2 and forwards.compile_seconds > 0


def test_specfold_dense_passes_report_what_they_compiled(fd_ckpt, backend):
    """A specfold pass the dense verifier runs (no drafts, or the per-pass rule's dense pass, batch-1 and batched)
    reports the compile seconds and graphs of its compiled forward, as vanilla's and spiffy's do: the first pass of
    each shape compiled (graphs > 0, seconds > 0), a repeat compiled nothing."""
    from dataclasses import replace

    from specfold.engine.folded import FoldedVerifier

    torch._dynamo.reset()  # the graphs of earlier tests' (same-shaped) checkpoints would serve this one
    _, cfg, net = load_checkpoint(fd_ckpt, dtype=torch.float32)
    verifier = FoldedVerifier(net, 0.1, compile=True)
    verifier.cfg = replace(verifier.cfg, pass_choice="dense")
    gen = torch.Generator().manual_seed(0)
    cache = net.new_cache(128)
    net(torch.randint(0, 299, (20,), generator=gen)[None], cache, mask="causal", write_cache=True)
    for k in (1, 3):
        states = torch.randint(0, 299, (k, 32), generator=gen)
        parents = torch.tensor([-1] + [0] * (k - 1))
        first, again = (verifier.verify(cache, states, parents).stats for _ in range(2))
        assert first.compiled_graphs > 0 and first.compile_seconds > 0, k
        assert (again.compiled_graphs, again.compile_seconds) == (0, 0.0), k
    batch_cache = BatchCache(cfg.num_layers, 2, cfg.num_kv_heads, cfg.head_dim, 128, net.dtype)
    for slot, t in enumerate((9, 30)):
        net.prefill(torch.randint(0, 299, (t,), generator=gen), batch_cache.slot(slot), mask="block_causal")
    states = torch.randint(0, 299, (2, 2, 32), generator=gen)
    parents = torch.tensor([[-1, 0], [-1, 0]])
    batch = BatchBranches(batch_cache, torch.arange(2), torch.tensor([9, 30]), states, parents, [2, 2])
    stats = verifier.verify_batch(batch).stats
    assert stats[0].compiled_graphs > 0 and stats[0].compile_seconds > 0 and stats[1].compiled_graphs == 0


@pytest.mark.slow  # the ragged forward's graphs (and the pieces around its host reads): ~25 s of CPU more
def test_compiled_ragged_passes_match_eager_with_bounded_graphs(fd_ckpt, backend):
    """Batched passes of 2-3 requests over ragged prefixes and branch counts: eager's logits and argmax, the graphs
    stay within :data:`SMALL_GRAPH_BOUND`, and none breaks (the host reads stay outside the compiled layer stack)."""
    from torch._dynamo.utils import counters

    _, cfg, net = load_checkpoint(fd_ckpt, dtype=torch.float32)
    breaks = sum(counters["graph_break"].values())
    eager, compiled = DenseVerifier(net), DenseVerifier(net, compile=True)
    gen = torch.Generator().manual_seed(0)
    n, start = 32, graphs_compiled()
    for lengths, branches in [([5, 40], [3, 1]), ([33, 12, 64], [2, 4, 1]), ([70, 9], [5, 5])]:
        r, kb = len(lengths), max(branches)
        cache = BatchCache(cfg.num_layers, r, cfg.num_kv_heads, cfg.head_dim, 128, net.dtype)
        for slot, t in enumerate(lengths):
            net.prefill(torch.randint(0, 299, (t,), generator=gen), cache.slot(slot), mask="block_causal")
        states = torch.randint(0, 299, (r, kb, n), generator=gen)
        parents = torch.zeros(r, kb, dtype=torch.long)
        parents[:, 0] = -1
        batch = BatchBranches(cache, torch.arange(r), torch.tensor(lengths), states, parents, branches)
        want, got = eager.verify_batch(batch).logits, compiled.verify_batch(batch)
        for w, g in zip(want, got.logits, strict=True):
            assert (g - w).abs().max().item() < FP32_LOGITS and torch.equal(g.argmax(-1), w.argmax(-1))
    built = graphs_compiled() - start
    forwards = compiled_forwards(net)
    assert 0 < built <= SMALL_GRAPH_BOUND and forwards.graphs == built and forwards.compile_seconds > 0
    assert sum(counters["graph_break"].values()) == breaks


def test_cli_compiles_long_runs_only(capsys):
    """``--compile`` unset: on for a run whose planned tokens repay the compile, with a note; eager otherwise;
    an explicit flag always wins."""
    from specfold.cli.common import choose_compile
    from specfold.config import COMPILE_MIN_TOKENS

    args = argparse.Namespace(compile=None)
    assert choose_compile(args, COMPILE_MIN_TOKENS - 1) is False and args.compile is False
    assert capsys.readouterr().err == ""
    args = argparse.Namespace(compile=None)
    assert choose_compile(args, COMPILE_MIN_TOKENS) is True and args.compile is True
    assert "compiling the dense forwards" in capsys.readouterr().err
    for given in (True, False):
        assert choose_compile(argparse.Namespace(compile=given), 0 if given else 10 * COMPILE_MIN_TOKENS) is given


@pytest.fixture(scope="module")
def model():
    return load_model(dtype="fp32")


def _prompts(model, per_task: int) -> list[list[int]]:
    return [encode_prompt(model, s.prompt) for t in TASKS for s in load_split(t, "test", limit=per_task)]


def _check(model, prompts, max_new: int) -> None:
    cfg = decode_config_for(model, max_new)
    vanilla = [decode(model, ids, cfg).token_ids for ids in prompts]
    for name, delta in (("vanilla", None), ("spiffy", None), ("specfold", 0.0)):
        m = prepare_method(model, MethodConfig(name, delta=delta, compile=True), cfg)
        if name == "specfold":  # its dense passes must really run compiled: the per-pass rule picks dense here
            from dataclasses import replace

            m.verifier.cfg = replace(m.verifier.cfg, pass_choice="dense")
        got = [decode(model, ids, cfg, verifier=m.verifier, drafter=m.drafter) for ids in prompts]
        assert [r.token_ids for r in got] == vanilla, name
        batched = decode_batch(model, prompts, cfg, BatchMethod(m.verifier, m.drafter), max_batch=4)
        assert [r.token_ids for r in batched] == vanilla, name
    forwards = compiled_forwards(model.net)
    assert 0 < forwards.graphs <= GRAPH_BOUND and forwards.compile_seconds > 0


@pytest.mark.slow  # the embedded model's forward: ~40 s of compiling on a quiet AVX2 EPYC, 80+ s loaded
def test_compiled_vanilla_gives_eager_tokens_without_recompiling(model):
    """The default tier: vanilla (the batch-1 forward) on one held-out prompt per domain, then three more prompts
    (other prefix lengths) that compile no new graph."""
    cfg = decode_config_for(model, 16)
    m = prepare_method(model, MethodConfig("vanilla", compile=True), cfg)
    prompts = _prompts(model, 2)
    first = [decode(model, ids, cfg, verifier=m.verifier) for ids in prompts[::2]]
    assert [r.token_ids for r in first] == [decode(model, ids, cfg).token_ids for ids in prompts[::2]]
    built = sum(r.engine_stats.compiled_graphs for r in first)
    assert 0 < built <= GRAPH_BOUND and sum(r.engine_stats.compile_seconds for r in first) > 0
    before = graphs_compiled()
    rest = [decode(model, ids, cfg, verifier=m.verifier) for ids in prompts[1::2]]
    assert [r.token_ids for r in rest] == [decode(model, ids, cfg).token_ids for ids in prompts[1::2]]
    assert graphs_compiled() == before and sum(r.engine_stats.compiled_graphs for r in rest) == 0


@pytest.mark.slow  # every method, batch-1 and batched: minutes of compiling on a loaded CPU
def test_compiled_forwards_give_eager_tokens_and_bounded_graphs(model):
    _check(model, _prompts(model, 1), 32)


@pytest.mark.slow
def test_compiled_forwards_on_fifty_one_held_out_prompts(model):
    _check(model, _prompts(model, 17), 48)
