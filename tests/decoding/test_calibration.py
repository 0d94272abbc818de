"""Calibration: formula extraction from trajectories, exact selection (vs brute force), and consistency with
build_drafts on a synthetic model."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest
import torch

from specfold.decoding.acceptance import Acceptance, BlockPaths, BlockTrace, CalibrationPaths, replay_paths
from specfold.decoding.calibration import (
    OBJECTIVES,
    BudgetError,
    calibrate,
    candidates,
    count_formulas,
    cross_validate,
    formulas_of_block,
    graph_from_paths,
    knapsack,
    pass_weighted_counts,
    select_graph,
    select_nodes,
    spiffy_objective,
)
from specfold.decoding.draft_graph import DraftGraph, formula_parent, formula_to_str, parse_formula
from specfold.decoding.drafts import DraftContext, build_drafts, compile_graph, draft_context
from specfold.decoding.unmasking import unmask_step

M = 9


def strs(counts: Counter) -> dict[str, int]:
    return {formula_to_str(q): c for q, c in counts.items()}


def hand_trace(stop_id: int | None = None) -> BlockTrace:
    states = [
        torch.tensor([1, M, M, M, M, M]),
        torch.tensor([1, 4, M, M, M, M]),
        torch.tensor([1, 4, 5, 6, M, M]),
        torch.tensor([1, 4, 5, 6, 7, M]),
        torch.tensor([1, 4, 5, 6, 7, 8]),
    ]
    # Contexts given directly: ranks and vocab ranks are chosen by hand.
    ctx1 = DraftContext(
        order=torch.tensor([3, 2, 5, 4, 0, 1]),
        n_masked=4,
        top_tokens=torch.tensor([[0, 1, 2], [0, 1, 2], [0, 5, 1], [6, 0, 1], [1, 2, 7], [8, 0, 1]]),
    )
    ctx2 = DraftContext(
        order=torch.tensor([4, 5, 0, 1, 2, 3]),
        n_masked=2,
        top_tokens=torch.tensor([[0, 1, 2]] * 4 + [[7, 0, 1], [0, 8, 1]]),
    )
    ctx3 = DraftContext(order=torch.tensor([5, 0, 1, 2, 3, 4]), n_masked=1, top_tokens=torch.tensor([[8, 0, 1]] * 6))
    return BlockTrace(
        states=states,
        contexts=[None, ctx1, ctx2, ctx3, None],
        gen_start=1,
        mask_id=M,
        small_block_size=None,
        stop_id=stop_id,
    )


def test_formulas_of_hand_trace():
    trace = hand_trace()
    # t=1: d=1 -> (1,1)+(2,2); d=2 -> ...|(4,3); d=3 ends in the full block (skipped).
    # t=2: d=1 -> (1,1); d=2 ends full. t=3: d=1 ends full.
    assert strs(formulas_of_block(trace, 3, 3)) == {"(1,1)+(2,2)": 1, "(1,1)+(2,2)|(4,3)": 1, "(1,1)": 1}
    assert strs(formulas_of_block(trace, 1, 3)) == {"(1,1)+(2,2)": 1, "(1,1)": 1}
    assert strs(formulas_of_block(trace, 3, 2)) == {"(1,1)+(2,2)": 1, "(1,1)": 1}  # (4,3) not representable
    assert strs(count_formulas([trace, trace], 3, 3)) == {"(1,1)+(2,2)": 2, "(1,1)+(2,2)|(4,3)": 2, "(1,1)": 2}


def test_formulas_skip_stop_states():
    # Token 7 at position 4 with no mask before it: states[3] stops generation.
    assert strs(formulas_of_block(hand_trace(stop_id=7), 3, 3)) == {"(1,1)+(2,2)": 1}


def test_trace_validation():
    trace = hand_trace()
    trace.states[2] = torch.tensor([1, 3, 5, 6, M, M])  # position 1 changes after being unmasked
    with pytest.raises(ValueError, match="changes a position that was not masked"):
        formulas_of_block(trace, 2, 3)
    trace = hand_trace()
    trace.states[2] = trace.states[1].clone()
    with pytest.raises(ValueError, match="unmasks nothing"):
        formulas_of_block(trace, 2, 3)
    trace = hand_trace()
    trace.contexts[1], trace.contexts[2] = trace.contexts[2], trace.contexts[1]
    with pytest.raises(ValueError, match="contexts\\[1\\] was not built from states\\[1\\]"):
        formulas_of_block(trace, 2, 3)
    with pytest.raises(ValueError, match="5 states but 4 contexts"):
        BlockTrace(hand_trace().states, [None] * 4, 1, M, None, None)


def test_selection_beats_greedy():
    a, ab, b = parse_formula("(1,1)"), parse_formula("(1,1)|(2,1)"), parse_formula("(2,1)")
    counts = Counter({a: 5, ab: 5, b: 7})
    # Greedy on the frontier would take (2,1) (w=7) first, then (1,1): 12. The optimum is (1,1) + its child: 5 + 10.
    chosen = select_graph(counts, 2)
    assert chosen == [a, ab]
    assert spiffy_objective(chosen, counts) == 15


def test_selection_adds_zero_count_ancestors_and_small_budgets():
    deep = parse_formula("(1,1)|(2,1)|(3,1)")
    counts = Counter({deep: 4, parse_formula("(2,1)"): 1})
    assert [formula_to_str(q) for q in select_graph(counts, 3)] == ["(1,1)", "(1,1)|(2,1)", "(1,1)|(2,1)|(3,1)"]
    # Budget 2 cannot reach the deep node (needs 3 nodes): only weight-1 (2,1) has value; the other pick is a
    # zero-weight filler chosen by preference ((1,1): depth 1 before (1,1)|(2,1)).
    assert [formula_to_str(q) for q in select_graph(counts, 2)] == ["(2,1)", "(1,1)"]
    assert len(select_graph(counts, 10)) == 4  # fewer candidates than the budget: all of them
    assert select_graph(counts, 0) == []
    assert [formula_to_str(q) for q in select_graph(counts, 3, depth_cap=2)] == ["(2,1)"]


def _parent_closed_sets(cands, budget):
    """Every parent-closed subset of ``cands`` of size ``budget``, in lexicographic order of ``cands``."""
    for combo in itertools.combinations(cands, budget):
        s = set(combo)
        if all(len(q) == 1 or formula_parent(q) in s for q in s):
            yield combo


def _brute_force(counts: Counter, budget: int, depth_cap: int | None, objective: str = "spiffy") -> list:
    cands = set()
    for q, n in counts.items():
        if n > 0 and (depth_cap is None or len(q) <= depth_cap):
            while q:
                cands.add(q)
                q = formula_parent(q)

    def w(q):
        if objective == "counts":
            return counts.get(q, 0)
        return counts.get(q, 0) + (counts.get(formula_parent(q), 0) if len(q) > 1 else 0)

    pref = sorted(cands, key=lambda q: (-w(q), -counts.get(q, 0), len(q), formula_to_str(q)))
    if len(pref) <= budget:
        return sorted(pref, key=lambda q: (len(q), pref.index(q)))
    best = None
    for combo in _parent_closed_sets(pref, budget):  # lexicographic order of the preference list
        val = sum(w(q) for q in combo)
        if best is None or val > best[0]:  # first optimum in lexicographic order = preferred tie-break
            best = (val, combo)
    return sorted(best[1], key=lambda q: (len(q), pref.index(q)))


def _random_counts(rng: random.Random) -> Counter:
    universe = [()]
    for _ in range(12):
        parent = rng.choice(universe)
        used = {r for step in parent for r, _ in step}
        free = [r for r in range(1, 5) if r not in used]
        if not free or len(parent) >= 3:
            continue
        rs = rng.sample(free, rng.randint(1, min(2, len(free))))
        f = (*parent, frozenset((r, rng.randint(1, 2)) for r in rs))
        if f not in universe:
            universe.append(f)
    return Counter({q: rng.randint(0, 4) for q in universe[1:] if rng.random() < 0.8})


@pytest.mark.parametrize("seed", range(40))
def test_selection_matches_brute_force(seed):
    rng = random.Random(seed)
    counts = _random_counts(rng)
    for budget in (1, 2, 3, 5):
        for depth_cap in (None, 2):
            for objective in ("spiffy", "counts"):
                assert select_graph(counts, budget, depth_cap, objective) == _brute_force(
                    counts, budget, depth_cap, objective
                ), (seed, budget, depth_cap, objective)
            chosen = select_graph(counts, budget, depth_cap)
            expected = _brute_force(counts, budget, depth_cap)
            assert chosen == expected, (seed, budget, depth_cap)
            assert set(chosen) == set(expected)
            ids = set(chosen)
            assert all(len(q) == 1 or formula_parent(q) in ids for q in chosen)  # parent closure
            assert all(depth_cap is None or len(q) <= depth_cap for q in chosen)
            DraftGraph.from_formulas(chosen, depth_cap=depth_cap)  # valid graph


# ---------------------------------------------------------------------------------------------------------------
# Selection from paths: the acceptance objective
# ---------------------------------------------------------------------------------------------------------------


def _f(text: str):
    return parse_formula(text)


def _block(steps: int, paths: dict[int, str]) -> BlockPaths:
    return BlockPaths(steps, tuple(_f(paths.get(t, "")) for t in range(steps)))


def test_acceptance_objective_sees_the_steps_a_pass_skips():
    # X is right at four consecutive steps of one block, but after a pass accepts it the next step has no pass:
    # drafting X accepts 2. Y is right once in each of three other blocks: 3. Counts prefer X (4 > 3).
    x, y = "(1,1)", "(2,1)"
    blocks = [_block(6, {1: x, 2: x, 3: x, 4: x})] + [_block(3, {1: y})] * 3
    assert select_nodes(blocks, 1, objective="counts") == [_f(x)]
    assert replay_paths(blocks, [_f(x)]).accepted == 2 and replay_paths(blocks, [_f(y)]).accepted == 3
    assert select_nodes(blocks, 1, objective="acceptance") == [_f(y)]
    assert pass_weighted_counts(blocks, [_f(x)])[_f(x)] == 2  # X at steps 1 and 3 only


def _random_paths(rng: random.Random) -> list[BlockPaths]:
    steps_pool = ["(1,1)", "(2,1)", "(1,1)+(2,1)", "(1,2)", "(3,1)"]
    blocks = []
    for _ in range(rng.randint(2, 6)):
        steps = rng.randint(1, 6)
        paths = [()]
        for t in range(1, steps):
            depth = rng.randint(0, min(3, steps - 1 - t))
            used: set[int] = set()
            path = []
            for _ in range(depth):
                step = _f(rng.choice(steps_pool))[0]
                if used & {r for r, _ in step}:
                    break
                used |= {r for r, _ in step}
                path.append(step)
            paths.append(tuple(path))
        blocks.append(BlockPaths(steps, tuple(paths[:steps])))
    return blocks


@pytest.mark.parametrize("seed", range(30))
def test_acceptance_selection_against_brute_force(seed):
    rng = random.Random(seed)
    blocks = _random_paths(rng)
    counts = Counter()
    for b in blocks:
        counts.update(b.formulas())
    cands = sorted(candidates(counts), key=formula_to_str)
    for budget in (1, 2, 3):
        if len(cands) < budget:
            with pytest.raises(BudgetError, match=f"only {len(cands)} distinct formulas"):
                select_nodes(blocks, budget)
            continue
        chosen = select_nodes(blocks, budget)
        assert len(chosen) == budget and all(len(q) == 1 or formula_parent(q) in chosen for q in chosen)
        got = replay_paths(blocks, chosen).accepted
        # never worse in-sample than the counts and spiffy graphs it starts from / competes with
        for other in ("counts", "spiffy"):
            assert got >= replay_paths(blocks, select_nodes(blocks, budget, objective=other)).accepted
        # the knapsack is exact for the pass weights: at a fixed point no parent-closed set beats the choice
        w = pass_weighted_counts(blocks, chosen)
        if knapsack(w, counts, budget) == chosen:
            best = max(sum(w[q] for q in s) for s in _parent_closed_sets(cands, budget))
            assert sum(w[q] for q in chosen) == best == got
        # and the true optimum (brute force over every parent-closed set) bounds it
        assert got <= max(replay_paths(blocks, s).accepted for s in _parent_closed_sets(cands, budget))


def test_budget_error_says_why():
    blocks = [_block(3, {1: "(1,1)"})]
    with pytest.raises(BudgetError, match="cannot select 7 draft nodes: 1 calibration blocks hold only 1 distinct"):
        select_nodes(blocks, 7)
    assert select_nodes(blocks, 7, strict=False) == [_f("(1,1)")]
    with pytest.raises(ValueError, match="unknown objective"):
        select_nodes(blocks, 1, objective="medusa")


def test_held_out_estimate_uses_only_the_other_folds():
    # Each prompt has its own formula: in-sample every block accepts one draft, held out none can.
    prompts = tuple((_block(3, {1: f"({r},1)"}),) for r in (1, 2, 3, 4))
    paths = CalibrationPaths(prompts, max_depth=4, max_vocab_rank=8)
    graph = graph_from_paths(paths, 3, objective="counts", folds=4)
    acc = graph.provenance["acceptance"]
    assert acc["in_sample"]["accepted"] == 3 and acc["held_out"]["accepted"] == 0 and acc["folds"] == 4
    assert acc["replay"] == "paths (formula semantics)"
    assert set(acc["held_out_by_objective"]) == set(OBJECTIVES)
    heldout = cross_validate(4, 2, lambda ids: [f for i in ids for f in paths.prompts[i][0].formulas()],
                             lambda ids, nodes: replay_paths([paths.prompts[i][0] for i in ids], nodes))
    assert heldout == Acceptance(blocks=4, steps=12, passes=12, accepted=0)


# ---------------------------------------------------------------------------------------------------------------
# Synthetic model: calibrate, then check build_drafts reproduces every recorded transition in the graph
# ---------------------------------------------------------------------------------------------------------------

N, V, MASK, S = 8, 12, 11, 4


class FakeModel:
    """A deterministic state -> logits map (mean token embedding through a random readout, plus a position bias)."""

    def __init__(self, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.emb = torch.randn(V, 16, generator=g)
        self.out = torch.randn(16, V, generator=g)
        self.pos = 3 * torch.randn(N, V, generator=g)
        self.pos[:, MASK] = -1e4  # never predict the mask token

    def __call__(self, state: torch.Tensor) -> torch.Tensor:  # [N] -> [N, V]
        return self.emb[state].mean(0) @ self.out + self.pos


def vanilla_trace(model: FakeModel, first: int, j: int) -> BlockTrace:
    x = torch.full((N,), MASK)
    x[0] = first
    states, contexts = [x], [None]
    while bool((x == MASK).any()):
        logits = model(x)
        x = unmask_step(logits, x, MASK, S, 0.9)
        states.append(x)
        contexts.append(draft_context(logits, x, MASK, S, j))
    return BlockTrace(states, contexts, gen_start=1, mask_id=MASK, small_block_size=S, stop_id=None)


def test_calibrate_end_to_end_consistent_with_build_drafts(tmp_path):
    model = FakeModel(0)
    traces = [vanilla_trace(model, first, 4) for first in range(MASK)]
    graph, _ = calibrate(
        [[t] for t in traces], budget=6, depth_cap=3, objective="spiffy", max_vocab_rank=4, model="fake",
        provenance={"source": "test"},
    )
    assert graph.budget == 6 and graph.depth_cap == 3 and graph.model == "fake"
    assert graph.provenance["source"] == "test" and graph.provenance["calibration"]["blocks"] == len(traces)
    counts = count_formulas(traces, 3, 4)
    assert graph.provenance["objective"] == "spiffy"
    assert list(graph.nodes[1:]) == select_graph(counts, 6, 3)
    assert graph.provenance["counts"] == {formula_to_str(q): counts[q] for q in graph.nodes[1:]}
    graph.to_json(tmp_path / "g.json")
    assert DraftGraph.load(tmp_path / "g.json", expect_budget=6) == graph

    compiled = compile_graph(graph, max_vocab_rank=4)
    in_graph = set(graph.nodes)
    hits = 0
    for trace in traces:
        for t in range(1, len(trace.states)):
            batch = build_drafts(compiled, trace.contexts[t], trace.states[t], MASK, S, None, 1)
            rows = {tuple(r) for r in batch.states.tolist()}
            for d in range(1, 4):
                if t + d >= len(trace.states):
                    break
                sub = BlockTrace(
                    trace.states[t - 1 : t + d + 1],
                    [None, trace.contexts[t]] + [None] * d,
                    1,
                    MASK,
                    S,
                    None,
                )
                deepest = [q for q in formulas_of_block(sub, d, 4) if len(q) == d]
                if deepest and deepest[0] in in_graph:
                    assert tuple(trace.states[t + d].tolist()) in rows
                    hits += 1
    assert hits == sum(counts[q] for q in graph.nodes[1:])
    assert hits > 0
