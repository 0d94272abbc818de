"""Calibrating a draft graph from vanilla trajectories (SPEC §3, "Calibration").

1. The vanilla decoder records each block as a :class:`~specfold.decoding.acceptance.BlockTrace`;
   :func:`~specfold.decoding.acceptance.paths_of_block` turns it into paths: for each step ``t >= 1`` the formulas
   of ``X^(t) -> X^(t+d)`` relative to the drafting context at ``t`` (``d <= max_depth``, end state non-terminal,
   vocab ranks ``<= max_vocab_rank``). ``c(q)`` = how often formula ``q`` occurs (:func:`count_formulas`).
2. :func:`select_nodes` chooses ``B`` parent-closed nodes (optional depth cap) by one of :data:`OBJECTIVES`.
3. :func:`graph_from_paths` (and :func:`calibrate`, from traces) returns the
   :class:`~specfold.decoding.draft_graph.DraftGraph` with the expected acceptance of the choice in its provenance:
   in-sample and held out (``K``-fold cross-validation over calibration prompts: select on ``K - 1`` folds, replay
   on the held-out one, sum over folds), plus the held-out figure of every objective for comparison.

Objectives. A draft ``q`` is accepted after a pass at step ``t`` iff the pass happens there and ``q`` is the path's
formula of depth ``|q|`` at ``t`` — its whole chain of ancestors is then accepted before it. So the number of drafts
a graph ``S`` accepts decomposes over its nodes once the passes are fixed::

    accepted(S) = Σ_{q ∈ S} w(q),   w(q) = #{passes at a step t whose path has q as its depth-|q| prefix}.

* ``acceptance`` (default): ``w`` counts only the steps where a pass happens *under the chosen graph itself*
  (:func:`pass_weighted_counts`; after a pass that accepts ``k`` drafts the next ``k`` steps have no pass). Starting
  from the ``counts`` graph, and again from the ``spiffy`` one, the knapsack is re-solved with the weights of the
  current graph until a graph repeats; the visited graph with the most accepted drafts
  (:func:`~specfold.decoding.acceptance.replay_paths`, first visited on ties) is returned. At a fixed point the
  chosen set is exactly optimal for its own pass schedule and ``Σ w`` equals its replayed acceptance; over all
  graphs it is a local optimum, never worse in-sample than the ``counts`` or ``spiffy`` graph.
* ``counts``: ``w(q) = c(q)``, i.e. a pass at every step: the expected drafts accepted per step.
* ``spiffy``: ``w(q) = c(q) + c(par(q))`` ("degree-1 accumulation", from third-party notes of Spiffy; SPEC §3 now
  marks it as a correction). It pays every child for its parent's count and so fills the graph with rare children
  of one frequent node. Kept for comparison only.

Cost-aware drafting (``draft_cost > 0``, :func:`select_policy`). Where a draft branch is not free — on a CPU a pass
costs in proportion to the rows it computes — a graph that drafts every node at every pass can cost more than the
passes it saves. The chosen graph then also gets a *policy*: per context (the number of eligible masks of the main
state, :func:`~specfold.decoding.drafts.window_masks`), the subset of its nodes to draft, maximising
``accepted − draft_cost · drafted`` (``draft_cost`` = the time one branch adds to a pass, relative to a one-branch
pass). Drafting fewer branches never changes the tokens; the decoder and the exact replay apply the same policy.

Every objective is maximised **exactly** for its weights by a tree knapsack (:func:`knapsack`; a greedy frontier
pick is suboptimal: a node's child can weigh more than the node). Candidates: every formula with ``c > 0`` and
depth ``<= depth_cap``, plus ancestors. Deterministic tie-break: candidates get a preference order — ``w`` desc, ``c``
desc, depth asc, canonical string asc; among optimal sets the lexicographically best under that order is chosen
(implemented exactly by adding ``2^(n - 1 - rank)`` to a second score component). Fewer candidates than ``B`` is an
error (:class:`BudgetError`) that says how many there are.
"""

from __future__ import annotations

import datetime
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from specfold.decoding.acceptance import (
    Acceptance,
    BlockPaths,
    BlockTrace,
    CalibrationPaths,
    Policy,
    accepted_chain,
    calibration_paths,
    drafted,
    paths_of_block,
    replay,
    replay_paths,
)
from specfold.decoding.draft_graph import (
    ROOT,
    DraftGraph,
    Formula,
    formula_parent,
    formula_to_str,
    parse_formula,
    validate_formula,
)

OBJECTIVES: tuple[str, ...] = ("acceptance", "counts", "spiffy")
DEFAULT_OBJECTIVE = "acceptance"
DEFAULT_FOLDS = 5
_MAX_ROUNDS = 50  # re-selections of the acceptance objective before giving up on a fixed point (never reached)


class BudgetError(ValueError):
    """The calibration data hold fewer candidate formulas than the requested budget."""


def formulas_of_block(trace: BlockTrace, max_depth: int, max_vocab_rank: int) -> Counter[Formula]:
    """Count the formulas of every transition ``states[t] -> states[t + d]``, ``t >= 1``, ``1 <= d <= max_depth``."""
    return paths_of_block(trace, max_depth, max_vocab_rank).formulas()


def count_formulas(traces: Iterable[BlockTrace], max_depth: int, max_vocab_rank: int) -> Counter[Formula]:
    """Sum of :func:`formulas_of_block` over ``traces``."""
    total: Counter[Formula] = Counter()
    for trace in traces:
        total.update(formulas_of_block(trace, max_depth, max_vocab_rank))
    return total


def spiffy_weight(q: Formula, counts: Mapping[Formula, int]) -> int:
    """``w(q) = c(q) + c(par(q))`` (root parents contribute 0)."""
    return counts.get(q, 0) + (counts.get(formula_parent(q), 0) if len(q) > 1 else 0)


def spiffy_objective(selected: Iterable[Formula], counts: Mapping[Formula, int]) -> int:
    """``F(S) = Σ_{q ∈ S} c(q) + c(par(q))``."""
    return sum(spiffy_weight(q, counts) for q in selected)


def candidates(counts: Mapping[Formula, int], depth_cap: int | None = None) -> list[Formula]:
    """Every formula with a positive count and depth ``<= depth_cap``, plus its ancestors (the root excluded)."""
    cands: set[Formula] = set()
    for q, c in counts.items():
        if q == ROOT or c <= 0 or (depth_cap is not None and len(q) > depth_cap):
            continue
        validate_formula(q)
        while q and q not in cands:
            cands.add(q)
            q = formula_parent(q)
    return list(cands)


def knapsack(
    weights: Mapping[Formula, int],
    counts: Mapping[Formula, int],
    budget: int,
    depth_cap: int | None = None,
) -> list[Formula]:
    """The parent-closed set of ``budget`` formulas maximising ``Σ weights[q]`` (exact tree knapsack).

    Candidates: the formulas with ``counts > 0`` and depth ``<= depth_cap``, and their ancestors (``weights`` may be
    0 or absent for some). Ties: the lexicographically best set under the preference order (weight desc, count
    desc, depth asc, canonical string asc); see the module docstring. Fewer candidates than ``budget``: all of
    them. Returned in (depth, preference) order, a topological order."""
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    cands = candidates(counts, depth_cap)

    def weight(q: Formula) -> int:
        return weights.get(q, 0)

    pref = sorted(cands, key=lambda q: (-weight(q), -counts.get(q, 0), len(q), formula_to_str(q)))
    rank = {q: i for i, q in enumerate(pref)}
    n = len(pref)
    if n <= budget:
        return sorted(pref, key=lambda q: (len(q), rank[q]))

    children: dict[Formula, list[Formula]] = {ROOT: []}
    for q in pref:
        children.setdefault(q, [])
    for q in pref:  # children lists in preference order: a fixed merge order
        children[formula_parent(q)].append(q)

    Score = tuple[int, int]  # (objective, tie-break bits); bits identify the set uniquely

    def merge(cur: list[Score | None], child: list[Score | None]) -> list[Score | None]:
        out: list[Score | None] = [None] * min(budget + 1, len(cur) + len(child) - 1)
        for a, sa in enumerate(cur):
            if sa is None:
                continue
            for b, sb in enumerate(child):
                if sb is None or a + b >= len(out):
                    continue
                cand = (sa[0] + sb[0], sa[1] + sb[1])
                if out[a + b] is None or cand > out[a + b]:
                    out[a + b] = cand
        return out

    # best[q][k]: best score picking k nodes in q's subtree with q itself chosen when k >= 1 (k = 0: nothing).
    best: dict[Formula, list[Score | None]] = {}
    for q in sorted(pref, key=len, reverse=True):  # children before parents
        cur: list[Score | None] = [None, (weight(q), 1 << (n - 1 - rank[q]))]  # q chosen
        for ch in children[q]:
            cur = merge(cur, best.pop(ch))
        cur[0] = (0, 0)  # or nothing from this subtree
        best[q] = cur
    top: list[Score | None] = [(0, 0)]
    for ch in children[ROOT]:
        top = merge(top, best.pop(ch))
    chosen = top[budget]
    assert chosen is not None  # n > budget and every prefix of the preference forest is closable
    bits = chosen[1]
    selected = [q for q in pref if bits >> (n - 1 - rank[q]) & 1]
    return sorted(selected, key=lambda q: (len(q), rank[q]))


def select_graph(
    counts: Mapping[Formula, int], budget: int, depth_cap: int | None = None, objective: str = "spiffy"
) -> list[Formula]:
    """Exact selection from counts alone, by ``objective`` ``spiffy`` or ``counts`` (``acceptance`` needs paths: see
    :func:`select_nodes`). Fewer candidates than ``budget``: all of them."""
    if objective == "spiffy":
        weights = {q: spiffy_weight(q, counts) for q in candidates(counts, depth_cap)}
    elif objective == "counts":
        weights = dict(counts)
    else:
        raise ValueError(f"objective {objective!r} cannot be computed from counts alone; choose spiffy or counts")
    return knapsack(weights, counts, budget, depth_cap)


def pass_weighted_counts(
    blocks: Iterable[BlockPaths], nodes: Iterable[Formula], depth_cap: int | None = None
) -> Counter[Formula]:
    """The formulas of the steps where a pass happens when ``nodes`` are drafted (formula semantics)."""
    chosen = set(nodes)
    total: Counter[Formula] = Counter()
    for block in blocks:
        t = 1
        while t < block.steps:
            path = block.paths[t][:depth_cap] if depth_cap is not None else block.paths[t]
            k = 0
            for d in range(1, len(path) + 1):
                total[path[:d]] += 1
                if k == d - 1 and path[:d] in chosen:
                    k = d
            t += 1 + k
    return total


def _check_budget(n: int, budget: int, depth_cap: int | None, where: str) -> None:
    if n < budget:
        cap = f" of depth <= {depth_cap}" if depth_cap is not None else ""
        raise BudgetError(
            f"cannot select {budget} draft nodes: {where} hold only {n} distinct formulas{cap} "
            "(record more calibration prompts, or lower the budget)"
        )


def select_nodes(
    blocks: Sequence[BlockPaths],
    budget: int,
    depth_cap: int | None = None,
    objective: str = DEFAULT_OBJECTIVE,
    strict: bool = True,
) -> list[Formula]:
    """Choose ``budget`` parent-closed formulas from calibration paths by ``objective`` (module docstring).

    strict: raise :class:`BudgetError` when there are fewer candidates than ``budget`` (else return them all)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; choose one of {', '.join(OBJECTIVES)}")
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    counts: Counter[Formula] = Counter()
    for block in blocks:
        counts.update(block.formulas(depth_cap))
    if strict:
        _check_budget(len(candidates(counts, depth_cap)), budget, depth_cap, f"{len(blocks)} calibration blocks")
    if objective != "acceptance":
        return select_graph(counts, budget, depth_cap, objective)
    best: list[Formula] = []
    best_accepted = -1
    seen: set[frozenset[Formula]] = set()
    for start in ("counts", "spiffy"):  # re-solve with the current graph's pass weights until a graph repeats
        nodes = select_graph(counts, budget, depth_cap, start)
        for _ in range(_MAX_ROUNDS):
            if frozenset(nodes) in seen:
                break
            seen.add(frozenset(nodes))
            accepted = replay_paths(blocks, nodes).accepted
            if accepted > best_accepted:
                best, best_accepted = nodes, accepted
            nodes = knapsack(pass_weighted_counts(blocks, nodes, depth_cap), counts, budget, depth_cap)
    return best


def best_subset(weights: Mapping[Formula, float], nodes: Iterable[Formula], penalty: float) -> frozenset[Formula]:
    """The parent-closed subset ``S`` of the parent-closed ``nodes`` maximising ``Σ_{q∈S} (weights[q] − penalty)``
    (exact: a node's subtree is kept where its own gain plus its kept children's is positive; ties keep less)."""
    nodes = set(nodes)
    children: dict[Formula, list[Formula]] = {q: [] for q in nodes}
    for q in nodes:
        if formula_parent(q) in children:
            children[formula_parent(q)].append(q)
    gain: dict[Formula, float] = {}
    for q in sorted(nodes, key=len, reverse=True):  # children before parents
        gain[q] = weights.get(q, 0) - penalty + sum(max(0.0, gain[c]) for c in children[q])
    keep: set[Formula] = set()
    stack = [q for q in nodes if formula_parent(q) not in children and gain[q] > 0]
    while stack:
        q = stack.pop()
        keep.add(q)
        stack.extend(c for c in children[q] if gain[c] > 0)
    return frozenset(keep)


def policy_score(blocks: Sequence[BlockPaths], nodes: Iterable[Formula], policy: Policy, draft_cost: float) -> float:
    """``accepted − draft_cost · drafted`` of a graph and policy replayed on paths: passes saved net of what the
    draft rows cost, in units of one pass (``draft_cost`` = the time a draft row adds to a pass, relative to a
    one-row pass)."""
    a = replay_paths(blocks, nodes, policy)
    return a.accepted - draft_cost * a.drafted


def select_policy(blocks: Sequence[BlockPaths], nodes: Sequence[Formula], draft_cost: float) -> Policy:
    """Cost-aware drafting: per window-mask count ``c``, the parent-closed subset of the graph's ``nodes`` to draft
    at the passes whose state has ``c`` eligible masks, maximising :func:`policy_score` (a count left out drafts
    every node). For a fixed pass schedule the score decomposes over counts and nodes (a drafted ``q`` scores 1 at a
    pass whose path has ``q`` as its depth-``|q|`` prefix, and ``-draft_cost`` at every pass), so each count's
    subset is exact (:func:`best_subset`); as with the ``acceptance`` objective the schedule is re-derived from the
    chosen policy until it repeats, and the best policy visited is returned. ``draft_cost <= 0``: no policy."""
    full = frozenset(nodes)
    if draft_cost <= 0 or not full:
        return {}
    if any(b.windows is None for b in blocks):
        raise ValueError("a drafting policy needs paths recorded with window-mask counts (recalibrate)")
    policy: dict[int, frozenset[Formula]] = {}
    best, best_score = policy, policy_score(blocks, full, policy, draft_cost)
    seen: set[frozenset[tuple[int, frozenset[Formula]]]] = set()
    for _ in range(_MAX_ROUNDS):
        key = frozenset(policy.items())
        if key in seen:
            break
        seen.add(key)
        weights: dict[int, Counter[Formula]] = {}
        passes: Counter[int] = Counter()
        for block in blocks:
            t = 1
            while t < block.steps:
                c, path = block.windows[t], block.paths[t]
                passes[c] += 1
                w = weights.setdefault(c, Counter())
                for d in range(1, len(path) + 1):
                    if path[:d] in full:
                        w[path[:d]] += 1
                t += 1 + accepted_chain(path, drafted(block, t, full, policy))
        policy = {}
        for c in sorted(passes):
            subset = best_subset(weights[c], full, draft_cost * passes[c])
            if subset != full:
                policy[c] = subset
        score = policy_score(blocks, full, policy, draft_cost)
        if score > best_score:
            best, best_score = policy, score
    return best


def cross_validate(
    n_prompts: int,
    folds: int,
    select: Callable[[list[int]], list[Formula]],
    evaluate: Callable[[list[int], list[Formula]], Acceptance],
) -> Acceptance | None:
    """Held-out acceptance: prompt ``i`` is in fold ``i % K`` (``K = min(folds, n_prompts)``); each fold is replayed
    with the nodes selected on the other folds, and the folds are summed. ``None`` below 2 prompts or folds."""
    k = min(folds, n_prompts)
    if k < 2:
        return None
    total = Acceptance()
    for fold in range(k):
        train = [i for i in range(n_prompts) if i % k != fold]
        held = [i for i in range(n_prompts) if i % k == fold]
        total = total + evaluate(held, select(train))
    return total


def graph_from_paths(
    paths: CalibrationPaths,
    budget: int,
    depth_cap: int | None = None,
    objective: str = DEFAULT_OBJECTIVE,
    folds: int = DEFAULT_FOLDS,
    traces: Sequence[Sequence[BlockTrace]] | None = None,
    model: str = "",
    provenance: Mapping[str, Any] | None = None,
    draft_cost: float = 0.0,
) -> DraftGraph:
    """Select a graph from calibration paths and record its expected acceptance in the provenance.

    traces: the recorded traces the paths came from (same prompts, same order); when given, acceptance figures are
    exact replays of the decoder (state semantics), else formula replays of the paths (``"replay"`` says which).
    Held-out figures come from :func:`cross_validate` over prompts, for the chosen objective and every other.
    draft_cost > 0: the graph also gets a drafting policy (:func:`select_policy`); its acceptance figures are then
    the graph's with the policy, beside the same figures drafting every node (``acceptance_without_policy``)."""
    if draft_cost < 0:
        raise ValueError(f"draft cost must be >= 0, got {draft_cost}")
    if depth_cap is not None and depth_cap > paths.max_depth:
        raise ValueError(f"depth cap {depth_cap} exceeds the depth {paths.max_depth} the paths were recorded to")
    if traces is not None and [len(t) for t in traces] != [len(p) for p in paths.prompts]:
        raise ValueError("traces and paths hold different prompts or blocks")
    blocks = paths.blocks
    selected = select_nodes(blocks, budget, depth_cap, objective)
    policy = select_policy(blocks, selected, draft_cost)

    def blocks_of(ids: Sequence[int]) -> list[BlockPaths]:
        return [b for i in ids for b in paths.prompts[i]]

    def evaluate(ids: Sequence[int], choice: tuple[Sequence[Formula], Policy]) -> Acceptance:
        nodes, pol = choice
        if traces is None:
            return replay_paths(blocks_of(ids), nodes, pol)
        graph = DraftGraph.from_formulas(nodes, depth_cap=depth_cap).with_policy(pol)
        return replay([t for i in ids for t in traces[i]], graph)

    def choose(ids: Sequence[int], name: str, cost: float) -> tuple[list[Formula], Policy]:
        nodes = select_nodes(blocks_of(ids), budget, depth_cap, name, strict=False)
        return nodes, select_policy(blocks_of(ids), nodes, cost)

    n = len(paths.prompts)
    held_out: dict[str, Any] = {}
    for name in (objective, *[o for o in OBJECTIVES if o != objective]):
        est = cross_validate(n, folds, lambda ids, o=name: choose(ids, o, 0.0), evaluate)
        held_out[name] = None if est is None else est.to_dict()
    plain = {
        "replay": "decoder (exact)" if traces is not None else "paths (formula semantics)",
        "in_sample": evaluate(range(n), (selected, {})).to_dict(),
        "held_out": held_out[objective],
        "folds": min(folds, n) if held_out[objective] is not None else None,
        "held_out_by_objective": {k: (v["accepted_per_pass"] if v is not None else None) for k, v in held_out.items()},
    }
    acceptance = plain
    if draft_cost > 0:
        est = cross_validate(n, folds, lambda ids: choose(ids, objective, draft_cost), evaluate)
        acceptance = {
            "replay": plain["replay"],
            "in_sample": evaluate(range(n), (selected, policy)).to_dict(),
            "held_out": None if est is None else est.to_dict(),
            "folds": plain["folds"],
        }
    counts = paths.counts(depth_cap)
    info: dict[str, Any] = {
        "objective": objective,
        "acceptance": acceptance,
        "counts": {formula_to_str(q): counts.get(q, 0) for q in selected},
        "calibration": {
            "prompts": n,
            "blocks": len(blocks),
            "steps": sum(b.steps for b in blocks),
            "distinct_formulas": len(counts),
            "observations": sum(counts.values()),
            "max_depth_counted": paths.max_depth,
            "max_vocab_rank": paths.max_vocab_rank,
        },
    }
    if draft_cost > 0:
        info["draft_cost"] = draft_cost
        info["acceptance_without_policy"] = plain
    info.update(provenance or {})
    info.setdefault("date", datetime.date.today().isoformat())
    graph = DraftGraph.from_formulas(selected, model=model, depth_cap=depth_cap, provenance=info)
    return graph.with_policy(policy)


def calibrate(
    traces: Sequence[Sequence[BlockTrace]],
    budget: int,
    depth_cap: int | None = None,
    objective: str = DEFAULT_OBJECTIVE,
    max_depth: int | None = None,
    max_vocab_rank: int = 8,
    folds: int = DEFAULT_FOLDS,
    model: str = "",
    provenance: Mapping[str, Any] | None = None,
    draft_cost: float = 0.0,
) -> tuple[DraftGraph, CalibrationPaths]:
    """Traces (one list of blocks per calibration prompt) -> (graph, the paths it was selected from). Paths are
    recorded to ``max_depth`` (default: ``depth_cap``, else 8); acceptance figures are exact replays.
    ``draft_cost > 0`` adds a cost-aware drafting policy (:func:`select_policy`)."""
    depth = max_depth if max_depth is not None else (depth_cap if depth_cap is not None else 8)
    paths = calibration_paths(traces, depth, max_vocab_rank)
    graph = graph_from_paths(paths, budget, depth_cap, objective, folds, traces, model, provenance, draft_cost)
    return graph, paths


def counts_to_json(counts: Mapping[Formula, int]) -> dict[str, int]:
    """Formula counts keyed by canonical string (what ``specfold calibrate`` saves beside a graph)."""
    return {
        formula_to_str(q): int(c) for q, c in sorted(counts.items(), key=lambda kv: (-kv[1], formula_to_str(kv[0])))
    }


def counts_from_json(data: Mapping[str, int]) -> Counter[Formula]:
    return Counter({parse_formula(text): int(c) for text, c in data.items()})


def graph_from_counts(
    counts: Mapping[Formula, int],
    budget: int,
    depth_cap: int | None = None,
    objective: str = "counts",
    model: str = "",
    provenance: dict[str, Any] | None = None,
) -> DraftGraph:
    """Select a graph from saved counts alone (``counts`` or ``spiffy``; a calibration without paths)."""
    if depth_cap is not None:
        counts = Counter({q: c for q, c in counts.items() if len(q) <= depth_cap})
    _check_budget(len(candidates(counts, depth_cap)), budget, depth_cap, "the counts")
    selected = select_graph(counts, budget, depth_cap, objective)
    info: dict[str, Any] = {
        "objective": objective,
        "counts": {formula_to_str(q): counts.get(q, 0) for q in selected},
    }
    info.update(provenance or {})
    return DraftGraph.from_formulas(selected, model=model, depth_cap=depth_cap, provenance=info)
