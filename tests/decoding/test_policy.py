"""Cost-aware drafting policies: per window-mask count, the graph nodes worth drafting. The selection is exact where
it says so (brute force on small hand-made paths), the policy survives the graph file, and a graph with a policy
stays lossless with offline replay equal to the real decode (fp64)."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from specfold.api import decode_config_for, record_traces
from specfold.decoding.acceptance import BlockPaths, calibration_paths, replay
from specfold.decoding.calibration import best_subset, graph_from_paths, policy_score, select_policy
from specfold.decoding.decoder import decode
from specfold.decoding.draft_graph import DraftGraph, formula_parent, formula_to_str, parse_formula
from specfold.decoding.speculative import GraphDrafter
from specfold.engine.dense import DenseVerifier
from specfold.model.loading import load_model

pytestmark = pytest.mark.usefixtures("one_thread")

NODES = [parse_formula(s) for s in ["(1,1)", "(2,1)", "(1,1)+(2,1)", "(1,1)|(2,1)", "(1,2)"]]


def _closed_subsets(nodes):
    for k in range(len(nodes) + 1):
        for s in itertools.combinations(nodes, k):
            if all(len(q) == 1 or formula_parent(q) in s for q in s):
                yield frozenset(s)


@pytest.mark.parametrize("seed", range(20))
def test_best_subset_matches_brute_force(seed):
    rng = random.Random(seed)
    weights = {q: rng.randint(0, 6) for q in NODES}
    penalty = rng.choice([0.5, 1.0, 2.5, 4.0])
    got = best_subset(weights, NODES, penalty)
    best = max(sum(weights[q] - penalty for q in s) for s in _closed_subsets(NODES))
    assert sum(weights[q] - penalty for q in got) == best
    assert all(len(q) == 1 or formula_parent(q) in got for q in got)


@pytest.mark.parametrize("seed", range(20))
def test_policy_selection_is_the_brute_force_optimum_when_the_schedule_cannot_change_it(seed):
    # Blocks of 3 steps: the pass at t = 1 drafts at a window count in {1, 2} and may accept one step; a pass at
    # t = 2 (window count 9, nothing left to accept) only costs. Whatever the policy, the best at count 9 drafts
    # nothing, and counts 1 and 2 are independent: select_policy must reach the optimum over every policy.
    rng = random.Random(seed)
    depth1 = [q for q in NODES if len(q) == 1]
    blocks = []
    for _ in range(12):
        path = (rng.choice(depth1)[0],) if rng.random() < 0.7 else ()
        blocks.append(BlockPaths(3, ((), path, ()), (8, rng.choice([1, 2]), 9)))
    cost = rng.choice([0.1, 0.3, 0.6])
    got = select_policy(blocks, NODES, cost)
    options = list(_closed_subsets(NODES))
    best = max(
        policy_score(blocks, NODES, {1: a, 2: b, 9: c}, cost) for a in options for b in options for c in options
    )
    assert policy_score(blocks, NODES, got, cost) == pytest.approx(best)
    assert got.get(9, frozenset()) == frozenset()  # where a pass has nothing to accept it drafts nothing
    assert policy_score(blocks, NODES, got, cost) >= policy_score(blocks, NODES, {}, cost)


def test_policy_file_roundtrip_restriction_and_errors(tmp_path):
    graph = DraftGraph.from_formulas(NODES)
    one, deep = parse_formula("(1,1)"), parse_formula("(1,1)|(2,1)")
    policy = {3: [one, deep], 0: []}
    g = graph.with_policy(policy)
    assert g.active_formulas(3) == {one, deep} and g.active_formulas(0) == frozenset()
    assert g.active_formulas(5) == frozenset(NODES)  # a count not listed drafts every node
    g.to_json(tmp_path / "g.json")
    back = DraftGraph.load(tmp_path / "g.json")
    assert back == g and back.policy == g.policy
    assert DraftGraph.load(tmp_path / "g.json").to_dict()["policy"] == {"0": [], "3": ["(1,1)", "(1,1)|(2,1)"]}
    restricted = g.restricted(1)
    assert restricted.active_formulas(3) == {one}
    with pytest.raises(ValueError, match="without its parent"):
        graph.with_policy({2: [deep]})
    with pytest.raises(ValueError, match="not a node of the graph"):
        graph.with_policy({2: [parse_formula("(3,1)")]})
    plain = DraftGraph.from_formulas(NODES)
    assert "policy" not in plain.to_dict()  # graphs without a policy keep their file format


def test_policy_graph_is_lossless_and_replays_exactly_fp64(fd_ckpt):
    model = load_model(fd_ckpt, dtype="fp64")
    cfg = decode_config_for(model, max_new_tokens=48)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 290, (n,), generator=g).tolist() for n in (5, 32, 37, 12)]
    traces = record_traces(model, prompts, cfg)
    paths = calibration_paths(traces, 4, 8)
    plain = graph_from_paths(paths, 5, folds=0)
    graph = graph_from_paths(paths, 5, folds=2, traces=traces, draft_cost=0.4)
    assert graph.nodes == plain.nodes and graph.policy  # same nodes, and the policy prunes somewhere
    assert graph.provenance["acceptance_without_policy"]["in_sample"]["accepted"] >= 0
    drafter = GraphDrafter(graph, model.mask_id, cfg.small_block_size, model.stop_id)
    accepted = drafted = drafted_plain = 0
    for ids, blocks in zip(prompts, traces, strict=True):
        want = decode(model, ids, cfg)
        got = decode(model, ids, cfg, DenseVerifier(model.net), drafter)
        assert got.token_ids == want.token_ids
        offline = replay(blocks, graph)
        assert (offline.passes, offline.accepted) == (got.nfe_denoise, got.accepted_drafts)
        rows = got.engine_stats.rows / cfg.block_size  # branch blocks verified over all passes
        assert rows - got.nfe_denoise == offline.drafted  # the draft rows, offline = online
        accepted += got.accepted_drafts
        drafted += offline.drafted
        drafted_plain += replay(blocks, plain).drafted
    assert accepted > 0 and drafted < drafted_plain
    assert graph.provenance["acceptance"]["in_sample"]["drafted_per_pass"] <= (
        graph.provenance["acceptance_without_policy"]["in_sample"]["drafted_per_pass"]
    )
    assert formula_to_str(NODES[0]) == "(1,1)"
