"""Compiled dense forwards (``MethodConfig.compile``): the same tokens as eager on held-out prompts of the embedded
model (fp32) for every method, batch-1 and batched, δ = 0 specfold token-identical to vanilla, and a bound on the
graphs compiled while the prefix length and branch counts change. The compile itself is the cost (tens of seconds
per process on a CPU: 25 minutes did not finish every method batch-1 and batched on a loaded 2-core AVX2 EPYC),
so the default tier compiles vanilla's batch-1 forward only; every method, batched, and 51 prompts are marked
slow."""

from __future__ import annotations

import pytest

from specfold.api import decode_config_for, encode_prompt, prepare_method
from specfold.config import MethodConfig
from specfold.decoding.core import BatchMethod
from specfold.decoding.decoder import decode, decode_batch
from specfold.engine.compiled import compiled_forwards, graphs_compiled
from specfold.eval.tasks.synthetic import TASKS, load_split
from specfold.model.loading import load_model

pytestmark = pytest.mark.usefixtures("one_thread")

# graphs for the whole module: batch-1 and ragged forwards, each a few dynamic graphs plus the pieces between its
# graph breaks (host reads); what matters is that it does not grow with the prompts, prefix lengths or branches
GRAPH_BOUND = 24


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
