"""Calibrating a draft graph from vanilla trajectories (SPEC §3, "Calibration").

Dims: ``N`` block length, ``J`` vocab ranks kept per position.

1. The vanilla decoder records each block as a :class:`BlockTrace`: its states ``X^(0) .. X^(T)`` and, for every
   ``t >= 1``, the :class:`~specfold.decoding.drafts.DraftContext` built from the logits that produced ``X^(t)``
   (the logits of the forward over ``X^(t-1)``) and ``X^(t)`` itself — exactly what a speculative step with main
   state ``X^(t)`` would draft from.
2. :func:`formulas_of_block` turns every transition ``X^(t) -> X^(t+d)`` (``t >= 1``, ``d = 1..max_depth``) into a
   formula relative to ``contexts[t]``: step ``s`` holds ``(r, j)`` for each position unmasked between
   ``X^(t+s-1)`` and ``X^(t+s)`` (``r`` = its position rank, ``j`` = the vocab rank of the token it got). Formulas
   whose end state is useless (no mask left, or a stop reached) or that need a vocab rank ``> max_vocab_rank``
   (or beyond the context's ``J``) are skipped.
3. :func:`select_graph` chooses ``B`` nodes by "degree-1 accumulation" and :func:`calibrate` wraps it all into a
   :class:`~specfold.decoding.draft_graph.DraftGraph`.

Selection objective, with ``c(q)`` the count of formula ``q`` (0 if unseen, the root has none) and ``par(q)`` its
formula parent::

    maximise  F(S) = Σ_{q ∈ S} w(q),   w(q) = c(q) + c(par(q)),   |S| = B,   par(q) ∈ S ∪ {root} for all q ∈ S.

The procedure is **exact**, not greedy (a greedy frontier pick is suboptimal here: a depth-1 node's child can weigh
more than the node itself): a tree knapsack dynamic programme over the candidate forest (every formula with
``c > 0`` and depth ``<= depth_cap``, plus its ancestors with ``c = 0``), merging children in a fixed order.

Deterministic tie-break: candidates get a preference order — ``w`` desc, then ``c`` desc, then depth asc, then
canonical string asc. Among parent-closed sets of size ``B`` with the maximal ``F``, the chosen one is the set that
contains the most-preferred candidate of the two sets' symmetric difference (i.e. the lexicographically best set
under the preference order). This is implemented exactly by adding ``2^(n - 1 - rank)`` to a second score
component. If fewer than ``B`` candidates exist, all are returned. The returned list is sorted by (depth,
preference), which is a topological order.
"""

from __future__ import annotations

import datetime
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from specfold.decoding.draft_graph import (
    ROOT,
    DraftGraph,
    Formula,
    formula_parent,
    formula_to_str,
    parse_formula,
    validate_formula,
)
from specfold.decoding.drafts import DraftContext, stops_reached


@dataclass
class BlockTrace:
    """The vanilla trajectory of one block.

    states: ``T + 1`` LongTensors ``[N]``: ``states[0]`` the block as first denoised, ``states[t + 1]`` the rule
        applied to ``states[t]``'s logits. Decoding may end early (stop reached).
    contexts: ``contexts[t]`` = ``draft_context(logits that produced states[t], states[t], ...)``; ``None`` for
        ``t = 0`` (and for any step not recorded; such steps are skipped).
    gen_start: block positions before it are a fixed prompt tail (never masked, ignored by the stop test).
    """

    states: list[torch.Tensor]  # T+1 x [N]
    contexts: list[DraftContext | None]  # T+1
    gen_start: int
    mask_id: int
    small_block_size: int | None
    stop_id: int | None

    def __post_init__(self) -> None:
        if len(self.states) != len(self.contexts):
            raise ValueError(f"{len(self.states)} states but {len(self.contexts)} contexts")


def _transition_steps(trace: BlockTrace) -> list[torch.Tensor]:
    """Per transition ``t -> t+1``, the bool ``[N]`` of newly unmasked positions (validated)."""
    out = []
    for t in range(len(trace.states) - 1):
        a, b = trace.states[t], trace.states[t + 1]
        was_masked = a == trace.mask_id
        new = was_masked & (b != trace.mask_id)
        if bool(((a != b) & ~new).any()):
            raise ValueError(f"trajectory step {t} -> {t + 1} changes a position that was not masked (or re-masks)")
        if not bool(new.any()):
            raise ValueError(f"trajectory step {t} -> {t + 1} unmasks nothing")
        out.append(new)
    return out


def formulas_of_block(trace: BlockTrace, max_depth: int, max_vocab_rank: int) -> Counter[Formula]:
    """Count the formulas of every transition ``states[t] -> states[t + d]``, ``t >= 1``, ``1 <= d <= max_depth``."""
    states = trace.states
    new_masks = _transition_steps(trace)
    useless = [
        not bool((s == trace.mask_id).any()) or bool(stops_reached(s, trace.gen_start, trace.mask_id, trace.stop_id))
        for s in states
    ]
    counts: Counter[Formula] = Counter()
    for t in range(1, len(states)):  # offline: plain loops are fine here
        ctx = trace.contexts[t]
        if ctx is None:
            continue
        if ctx.n_masked != int((states[t] == trace.mask_id).sum()):
            raise ValueError(f"contexts[{t}] was not built from states[{t}] (different number of masks)")
        rank_of = ctx.rank_of_position().tolist()
        j_limit = min(max_vocab_rank, ctx.max_vocab_rank)
        top = ctx.top_tokens[:, :j_limit].tolist()
        steps: list[frozenset[tuple[int, int]]] = []
        for d in range(1, max_depth + 1):
            if t + d >= len(states):
                break
            positions = new_masks[t + d - 1].nonzero().squeeze(1).tolist()
            tokens = states[t + d][positions].tolist()
            pairs = []
            for p, tok in zip(positions, tokens, strict=True):
                if tok not in top[p]:
                    break  # vocab rank beyond the limit: this and all deeper formulas are unrepresentable
                pairs.append((rank_of[p], top[p].index(tok) + 1))
            if len(pairs) != len(positions):
                break
            steps.append(frozenset(pairs))
            if not useless[t + d]:
                counts[tuple(steps)] += 1
    return counts


def count_formulas(traces: Iterable[BlockTrace], max_depth: int, max_vocab_rank: int) -> Counter[Formula]:
    """Sum of :func:`formulas_of_block` over ``traces``."""
    total: Counter[Formula] = Counter()
    for trace in traces:
        total.update(formulas_of_block(trace, max_depth, max_vocab_rank))
    return total


def selection_weights(counts: Mapping[Formula, int]) -> dict[Formula, int]:
    """``w(q) = c(q) + c(par(q))`` for every formula in ``counts`` (root parents contribute 0)."""
    return {q: counts.get(q, 0) + (counts.get(formula_parent(q), 0) if len(q) > 1 else 0) for q in counts}


def objective(selected: Iterable[Formula], counts: Mapping[Formula, int]) -> int:
    """``F(S) = Σ_{q ∈ S} c(q) + c(par(q))``."""
    return sum(counts.get(q, 0) + (counts.get(formula_parent(q), 0) if len(q) > 1 else 0) for q in selected)


def _candidates(counts: Mapping[Formula, int], depth_cap: int | None) -> list[Formula]:
    cands: set[Formula] = set()
    for q, c in counts.items():
        if q == ROOT or c <= 0 or (depth_cap is not None and len(q) > depth_cap):
            continue
        validate_formula(q)
        while q and q not in cands:
            cands.add(q)
            q = formula_parent(q)
    return list(cands)


def select_graph(counts: Mapping[Formula, int], budget: int, depth_cap: int | None = None) -> list[Formula]:
    """Choose ``budget`` formulas maximising the degree-1 accumulation objective under parent closure (exact; see
    the module docstring for the procedure and tie-breaks). Returned in (depth, preference) order."""
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    cands = _candidates(counts, depth_cap)

    def weight(q: Formula) -> int:
        return counts.get(q, 0) + (counts.get(formula_parent(q), 0) if len(q) > 1 else 0)

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


def calibrate(
    traces: Iterable[BlockTrace],
    budget: int,
    depth_cap: int | None = None,
    max_vocab_rank: int = 8,
    model: str = "",
    provenance: dict[str, Any] | None = None,
) -> DraftGraph:
    """Count the traces' formulas (depth up to ``depth_cap``, else ``budget``), select ``budget`` nodes and return
    the graph. ``provenance`` (samples, source, ...) is merged with computed fields (blocks, transitions, counts of
    the chosen nodes, objective, date if absent)."""
    traces = list(traces)
    max_depth = depth_cap if depth_cap is not None else max(budget, 1)
    counts = count_formulas(traces, max_depth, max_vocab_rank)
    selected = select_graph(counts, budget, depth_cap)
    info: dict[str, Any] = {
        "blocks": len(traces),
        "transitions": sum(max(len(t.states) - 1, 0) for t in traces),
        "distinct_formulas": len(counts),
        "observations": sum(counts.values()),
        "max_depth_counted": max_depth,
        "max_vocab_rank": max_vocab_rank,
        "objective": objective(selected, counts),
        "counts": {formula_to_str(q): counts.get(q, 0) for q in selected},
    }
    info.update(provenance or {})
    info.setdefault("date", datetime.date.today().isoformat())
    return DraftGraph.from_formulas(selected, model=model, depth_cap=depth_cap, provenance=info)


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
    model: str = "",
    provenance: dict[str, Any] | None = None,
) -> DraftGraph:
    """Select a graph of ``budget`` nodes from saved counts (one calibration run serves every B and depth cap)."""
    if depth_cap is not None:
        counts = Counter({q: c for q, c in counts.items() if len(q) <= depth_cap})
    selected = select_graph(counts, budget, depth_cap)
    info: dict[str, Any] = {
        "objective": objective(selected, counts),
        "counts": {formula_to_str(q): counts.get(q, 0) for q in selected},
    }
    info.update(provenance or {})
    return DraftGraph.from_formulas(selected, model=model, depth_cap=depth_cap, provenance=info)
