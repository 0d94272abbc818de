"""Boundary drafts (``lookahead``): the cache-writing forward also runs the next block's first state from a guessed
seed. Lossless: every request's tokens and steps are vanilla's (fp64), and each right guess saves exactly one pass."""

from __future__ import annotations

import pytest
import torch

from specfold.api import decode_config_for, prepare_method, record_counts
from specfold.config import DecodeConfig, MethodConfig
from specfold.decoding.calibration import candidates, graph_from_counts
from specfold.decoding.core import BatchMethod
from specfold.decoding.decoder import decode, decode_batch
from specfold.decoding.draft_graph import DraftGraph
from specfold.decoding.speculative import GraphDrafter
from specfold.engine.dense import DenseVerifier
from specfold.engine.folded import FoldedVerifier
from specfold.model.loading import load_model
from specfold.validation import ValidationError

GRAPH = DraftGraph.from_strings(["(1,1)", "(1,1)+(2,1)"])


def _prompts(model, lengths, seed=4):
    g = torch.Generator().manual_seed(seed)
    top = min(model.mask_id, model.stop_id) - 1
    return [torch.randint(0, top, (t,), generator=g).tolist() for t in lengths]


@pytest.fixture(scope="module")
def setup(fd_ckpt):
    """The model, prompts, config and calibrated graph, built once for the module (calibration decodes every prompt)."""
    model = load_model(fd_ckpt, dtype="fp64")
    n = model.config.block_size
    prompts = _prompts(model, [n, 3, 2 * n + 1, n - 1, 5])
    cfg = DecodeConfig(block_size=n, small_block_size=n // 2, threshold=0.9, max_new_tokens=4 * n)
    counts = record_counts(model, prompts, cfg, max_depth=4)
    graph = graph_from_counts(counts, min(7, len(candidates(counts))))
    return model, prompts, cfg, graph


def _verifier(model, name):
    return DenseVerifier(model.net) if name == "spiffy" else FoldedVerifier(model.net, 0.0)


def _drafter(model, cfg, graph, lookahead: bool) -> GraphDrafter:
    return GraphDrafter(graph, model.mask_id, cfg.small_block_size, model.stop_id, lookahead=lookahead)


@pytest.fixture(scope="module")
def decodes(setup):
    """``decodes(name, lookahead)``: the batch-1 decodes of every prompt by ``vanilla``, ``spiffy`` or ``specfold``
    (with or without boundary drafts), each list computed once for the module: the tests compare the same
    trajectories (vanilla's in both methods' tests, spiffy's with boundary drafts in the batch test too)."""
    model, prompts, cfg, graph = setup
    memo: dict[tuple[str, bool], list] = {}

    def get(name: str, lookahead: bool = False) -> list:
        if (name, lookahead) not in memo:
            if name == "vanilla":
                memo[name, lookahead] = [decode(model, p, cfg) for p in prompts]
            else:
                verifier, drafter = _verifier(model, name), _drafter(model, cfg, graph, lookahead)
                memo[name, lookahead] = [decode(model, p, cfg, verifier, drafter) for p in prompts]
        return memo[name, lookahead]

    return get


@pytest.mark.parametrize("name", ["spiffy", "specfold"])
def test_boundary_drafts_keep_the_vanilla_trajectory_and_save_one_pass_per_hit_fp64(decodes, name):
    hits = misses = 0
    for want, base, got in zip(decodes("vanilla"), decodes(name), decodes(name, lookahead=True), strict=True):
        assert got.token_ids == want.token_ids
        assert got.steps_per_block == want.steps_per_block
        assert got.accepted_drafts == base.accepted_drafts  # the graph's drafts are unaffected
        assert got.nfe_cache == want.nfe_cache
        assert got.nfe == want.nfe - got.accepted_drafts - got.boundary_drafts
        hits += got.boundary_drafts
        misses += got.nfe_cache - got.boundary_drafts
    assert hits > 0 and misses > 0  # both outcomes of a guess were exercised


def test_boundary_drafts_batch_equals_batch_one_fp64(setup, decodes):
    model, prompts, cfg, graph = setup
    method = BatchMethod(DenseVerifier(model.net), _drafter(model, cfg, graph, lookahead=True))
    want = decodes("spiffy", lookahead=True)  # batch-1, the same verifier and drafter kinds
    got = decode_batch(model, prompts, cfg, method, max_batch=3)
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    assert [r.nfe for r in got] == [r.nfe for r in want]
    assert [r.boundary_drafts for r in got] == [r.boundary_drafts for r in want]
    assert [r.steps_per_block for r in got] == [r.steps_per_block for r in want]
    assert sum(r.boundary_drafts for r in want) > 0


def test_boundary_drafts_are_on_where_they_can_run_and_refused_where_asked_but_impossible(fd_ckpt, nld_ckpt):
    nld = load_model(nld_ckpt, dtype="fp64")
    with pytest.raises(ValidationError, match="Fast-dLLM-v2-family"):
        prepare_method(nld, MethodConfig(method="spiffy", graph=GRAPH, lookahead=True))
    fd = load_model(fd_ckpt, dtype="fp64")
    n = fd.config.block_size
    half = decode_config_for(fd, 16, block_size=n // 2)
    with pytest.raises(ValidationError, match=f"block size {n}, got {n // 2}"):
        prepare_method(fd, MethodConfig(method="spiffy", graph=GRAPH, lookahead=True), half)
    with pytest.raises(ValidationError, match="lookahead applies to spiffy or specfold, not vanilla"):
        prepare_method(fd, MethodConfig(method="vanilla", lookahead=True))
    # the default: boundary drafts wherever they can run, and off on request
    assert prepare_method(fd, MethodConfig(method="spiffy", graph=GRAPH)).drafter.lookahead
    assert not prepare_method(fd, MethodConfig(method="spiffy", graph=GRAPH, lookahead=False)).drafter.lookahead
    assert not prepare_method(nld, MethodConfig(method="specfold", graph=GRAPH)).drafter.lookahead
    assert not prepare_method(fd, MethodConfig(method="spiffy", graph=GRAPH), half).drafter.lookahead
