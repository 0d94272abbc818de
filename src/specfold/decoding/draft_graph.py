"""Draft graphs: the calibrated set of formulas a speculative step drafts (SPEC §3).

Vocabulary (fixed for the whole package):

- At a verification step the main state is ``X_0`` and the *drafting logits* ``L`` are the logits that produced
  ``X_0`` (the previous forward).
- **Position rank** ``r`` (1-based): the masked positions of ``X_0`` ordered by (small-block index ascending,
  confidence under ``L`` descending, position ascending). Ranks of the current small block come first.
- **Vocab rank** ``j`` (1-based): the tokens at a position ordered by probability under ``L`` descending;
  ``j = 1`` is the argmax, ties go to the lower token id.
- A **formula** is a tuple of *steps*; a step is a non-empty ``frozenset`` of ``(r, j)`` pairs ("at this step
  ahead, the position of rank ``r`` is unmasked with its vocab-rank-``j`` token"). A position rank appears at most
  once in a formula. Depth = number of steps; the parent drops the last step; the root ``()`` is ``X_0`` itself.

Canonical text form: pairs ``(r,j)`` sorted by ``(r, j)`` and joined by ``+``; steps joined by ``|``; the root
is the empty string. Example: ``"(1,1)+(2,1)|(3,1)"`` (depth 2). Ranks always refer to ``X_0``'s ordering, so
``"(1,1)|(1,1)"`` is *invalid* (rank 1 twice); "the next most confident position after that" is ``"(1,1)|(2,1)"``.

A :class:`DraftGraph` is a tree of formulas closed under "parent" (every node's formula-parent is in the graph),
stored in topological order with the root at index 0. Its JSON file (format ``specfold.draft_graph``, version 1)::

    {"format": "specfold.draft_graph", "version": 1, "model": "...", "budget": B, "depth_cap": D | null,
     "nodes": ["", "(1,1)", "(1,1)|(2,1)", ...], "parents": [-1, 0, 1, ...], "provenance": {...}}

Every construction path (direct, :meth:`DraftGraph.from_formulas`, :meth:`DraftGraph.load`) validates and raises
``ValueError`` naming the problem.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from specfold.io import atomic_write_text
from specfold.validation import ValidationError

Pair = tuple[int, int]
Step = frozenset[Pair]
Formula = tuple[Step, ...]

ROOT: Formula = ()
FORMAT_NAME = "specfold.draft_graph"
FORMAT_VERSION = 1

_PAIR_RE = re.compile(r"^\(\s*(-?\d+)\s*,\s*(-?\d+)\s*\)$")


# ---------------------------------------------------------------------------------------------------------------
# Formula helpers
# ---------------------------------------------------------------------------------------------------------------


def make_formula(steps: Iterable[Iterable[Pair]]) -> Formula:
    """Build (and validate) a formula from nested iterables of ``(r, j)`` pairs."""
    formula = tuple(frozenset((int(r), int(j)) for r, j in step) for step in steps)
    validate_formula(formula)
    return formula


def formula_depth(formula: Formula) -> int:
    """Number of steps (the root has depth 0)."""
    return len(formula)


def formula_parent(formula: Formula) -> Formula:
    """The formula with its last step removed. The root has no parent."""
    if not formula:
        raise ValueError("the root formula has no parent")
    return formula[:-1]


def formula_pairs(formula: Formula) -> list[tuple[int, int, int]]:
    """All ``(r, j, step)`` triples (``step`` 1-based), steps in order, pairs sorted within a step."""
    return [(r, j, s) for s, step in enumerate(formula, start=1) for r, j in sorted(step)]


def formula_to_str(formula: Formula) -> str:
    """Canonical text form, e.g. ``"(1,1)+(2,1)|(3,1)"``; the root is ``""``."""
    return "|".join("+".join(f"({r},{j})" for r, j in sorted(step)) for step in formula)


def parse_formula(text: str) -> Formula:
    """Inverse of :func:`formula_to_str` (whitespace tolerated; ``""`` and ``"()"`` are the root)."""
    text = text.strip()
    if text in ("", "()"):
        return ROOT
    steps = []
    for step_text in text.split("|"):
        pairs = []
        for pair_text in step_text.split("+"):
            m = _PAIR_RE.match(pair_text.strip())
            if m is None:
                raise ValueError(f"malformed pair {pair_text.strip()!r} in formula {text!r} (expected '(r,j)')")
            pairs.append((int(m.group(1)), int(m.group(2))))
        steps.append(frozenset(pairs))
    formula = tuple(steps)
    validate_formula(formula, label=repr(text))
    return formula


def validate_formula(formula: Formula, label: str | None = None) -> None:
    """Raise ``ValueError`` unless ``formula`` is a tuple of non-empty frozensets of ``(r, j)`` with ``r, j >= 1``
    and no position rank repeated."""
    where = label if label is not None else "formula"
    if not isinstance(formula, tuple):
        raise ValueError(f"{where}: a formula is a tuple of steps, got {type(formula).__name__}")
    seen: set[int] = set()
    for s, step in enumerate(formula, start=1):
        if not isinstance(step, frozenset) or not step:
            raise ValueError(f"{where}: step {s} must be a non-empty frozenset of (r, j) pairs")
        for pair in step:
            if (
                not isinstance(pair, tuple)
                or len(pair) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair)
            ):
                raise ValueError(f"{where}: malformed pair {pair!r} in step {s} (expected a tuple of two ints)")
            r, j = pair
            if r < 1 or j < 1:
                raise ValueError(f"{where}: malformed pair ({r},{j}) in step {s}: ranks are 1-based (r, j >= 1)")
            if r in seen:
                raise ValueError(f"{where}: position rank {r} appears more than once (a position unmasks once)")
            seen.add(r)


def _label(index: int, formula: Formula) -> str:
    return f"node {index} ({formula_to_str(formula) or 'root'!r})"


# ---------------------------------------------------------------------------------------------------------------
# DraftGraph
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=True)
class DraftGraph:
    """A calibrated draft graph.

    nodes: formulas in topological order; ``nodes[0]`` is the root ``()``.
    parents: ``parents[0] == -1``; for ``i >= 1``, ``parents[i] < i`` is the index of ``nodes[i]``'s formula-parent.
    model: what the graph was calibrated for (free text, e.g. a checkpoint name).
    budget: ``B`` = number of non-root nodes (must equal ``len(nodes) - 1``).
    depth_cap: maximal depth allowed (``None`` = uncapped).
    provenance: free-form JSON-able metadata (samples, source, date, counts, ...).
    policy: per-context drafting, ``((c, nodes), ...)``: when the main state's eligible window holds ``c`` masked
        positions (:func:`specfold.decoding.drafts.window_masks`), only the node indices ``nodes`` (the root and a
        parent-closed subset) are drafted; a count not listed drafts every node. Empty: every node, always.
        Chosen by cost-aware calibration (:func:`specfold.decoding.calibration.select_policy`).
    """

    nodes: tuple[Formula, ...]
    parents: tuple[int, ...]
    model: str = ""
    budget: int | None = None
    depth_cap: int | None = None
    provenance: dict[str, Any] = field(default_factory=dict, compare=False)
    policy: tuple[tuple[int, tuple[int, ...]], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "parents", tuple(int(p) for p in self.parents))
        object.__setattr__(
            self, "policy", tuple(sorted((int(c), tuple(sorted(int(i) for i in idx))) for c, idx in self.policy))
        )
        if self.budget is None:
            object.__setattr__(self, "budget", len(self.nodes) - 1)
        self._validate()

    # -- validation ---------------------------------------------------------------------------------------------

    def _validate(self) -> None:
        nodes, parents = self.nodes, self.parents
        if not nodes or nodes[0] != ROOT:
            raise ValueError("node 0 must be the root formula () (empty string in files)")
        if len(parents) != len(nodes):
            raise ValueError(f"{len(nodes)} nodes but {len(parents)} parent indices")
        if parents[0] != -1:
            raise ValueError(f"the root's parent index must be -1, got {parents[0]}")
        if self.depth_cap is not None and (not isinstance(self.depth_cap, int) or self.depth_cap < 1):
            raise ValueError(f"depth_cap must be >= 1 or None, got {self.depth_cap}")
        index: dict[Formula, int] = {}
        for i, formula in enumerate(nodes):
            validate_formula(formula, label=f"node {i}")
            if formula in index:
                raise ValueError(
                    f"duplicate node {formula_to_str(formula) or 'root'!r} at indices {index[formula]} and {i}"
                )
            index[formula] = i
        for i in range(1, len(nodes)):
            formula, p = nodes[i], parents[i]
            if self.depth_cap is not None and len(formula) > self.depth_cap:
                raise ValueError(f"{_label(i, formula)} has depth {len(formula)} above depth_cap {self.depth_cap}")
            want = formula_parent(formula)
            if want not in index:
                raise ValueError(
                    f"{_label(i, formula)}: missing parent — its formula-parent "
                    f"{formula_to_str(want) or 'root'!r} is not in the graph"
                )
            if not 0 <= p < i:
                raise ValueError(
                    f"{_label(i, formula)}: parent index {p} is not < its own index {i} "
                    "(cycle or nodes not in topological order)"
                )
            if p != index[want]:
                raise ValueError(
                    f"{_label(i, formula)}: parent index {p} points to {formula_to_str(nodes[p]) or 'root'!r}, "
                    f"not its formula-parent {formula_to_str(want) or 'root'!r} (index {index[want]})"
                )
        if not isinstance(self.budget, int) or self.budget != len(nodes) - 1:
            raise ValueError(f"budget mismatch: budget says {self.budget} but the graph holds {len(nodes) - 1} nodes")
        counts = [c for c, _ in self.policy]
        if len(set(counts)) != len(counts):
            raise ValueError("the policy lists a window-mask count twice")
        for c, idx in self.policy:
            if c < 0:
                raise ValueError(f"policy: window-mask count {c} is negative")
            if not idx or idx[0] != 0 or idx[-1] >= len(nodes):
                raise ValueError(
                    f"policy for count {c}: node indices {list(idx)} must hold the root 0 and nodes of the graph"
                )
            missing = [i for i in idx if i > 0 and parents[i] not in idx]
            if missing:
                raise ValueError(f"policy for count {c}: {_label(missing[0], nodes[missing[0]])} without its parent")

    # -- construction -------------------------------------------------------------------------------------------

    @classmethod
    def from_formulas(
        cls,
        formulas: Iterable[Formula],
        model: str = "",
        depth_cap: int | None = None,
        provenance: dict[str, Any] | None = None,
    ) -> DraftGraph:
        """Graph from non-root formulas (the root, if given, is ignored).

        Order: the input order, stably sorted by depth (so parents precede children). Parents are computed from the
        formulas; a formula whose parent is absent raises ``ValueError`` (missing parent), as do duplicates.
        """
        items = [f for f in formulas if f != ROOT]
        for i, f in enumerate(items):
            validate_formula(f, label=f"formula {i}")
        seen: dict[Formula, int] = {}
        for i, f in enumerate(items):
            if f in seen:
                raise ValueError(f"duplicate node {formula_to_str(f)!r} (inputs {seen[f]} and {i})")
            seen[f] = i
        ordered = [ROOT, *sorted(items, key=len)]  # sorted() is stable
        index = {f: i for i, f in enumerate(ordered)}
        parents = [-1]
        for i, f in enumerate(ordered[1:], start=1):
            want = formula_parent(f)
            if want not in index:
                raise ValueError(
                    f"{_label(i, f)}: missing parent — its formula-parent {formula_to_str(want) or 'root'!r} "
                    "is not in the graph"
                )
            parents.append(index[want])
        return cls(
            nodes=tuple(ordered),
            parents=tuple(parents),
            model=model,
            budget=len(ordered) - 1,
            depth_cap=depth_cap,
            provenance=dict(provenance or {}),
        )

    @classmethod
    def from_strings(cls, strings: Sequence[str], **kwargs: Any) -> DraftGraph:
        """Hand-builder for tests: ``DraftGraph.from_strings(["(1,1)", "(1,1)|(2,1)", "(2,1)"])``."""
        return cls.from_formulas([parse_formula(s) for s in strings], **kwargs)

    def restricted(self, depth_cap: int) -> DraftGraph:
        """The sub-graph of nodes with depth ``<= depth_cap`` (order kept; budget becomes the kept count)."""
        if depth_cap < 1:
            raise ValueError(f"depth_cap must be >= 1, got {depth_cap}")
        keep = [i for i, f in enumerate(self.nodes) if len(f) <= depth_cap]
        new_index = {old: new for new, old in enumerate(keep)}
        parents = tuple(-1 if i == 0 else new_index[self.parents[i]] for i in keep)
        provenance = dict(self.provenance)
        provenance["restricted_from"] = {"budget": self.budget, "depth_cap": self.depth_cap}
        cap = depth_cap if self.depth_cap is None else min(depth_cap, self.depth_cap)
        policy = tuple((c, tuple(new_index[i] for i in idx if i in new_index)) for c, idx in self.policy)
        return DraftGraph(
            nodes=tuple(self.nodes[i] for i in keep),
            parents=parents,
            model=self.model,
            budget=len(keep) - 1,
            depth_cap=cap,
            provenance=provenance,
            policy=policy,
        )

    def with_policy(
        self, policy: Mapping[int, Iterable[Formula]], provenance: dict[str, Any] | None = None
    ) -> DraftGraph:
        """This graph drafting only ``policy[c]`` (formulas of the graph, parent-closed) at window-mask count ``c``."""
        index = {f: i for i, f in enumerate(self.nodes)}
        unknown = [f for fs in policy.values() for f in fs if f not in index]
        if unknown:
            raise ValueError(f"policy formula {formula_to_str(unknown[0])!r} is not a node of the graph")
        table = tuple((int(c), tuple(sorted({0, *(index[f] for f in fs)}))) for c, fs in policy.items())
        return replace(self, policy=table, provenance=dict(self.provenance if provenance is None else provenance))

    def active_formulas(self, count: int) -> frozenset[Formula]:
        """The non-root formulas drafted when the eligible window holds ``count`` masked positions."""
        for c, idx in self.policy:
            if c == count:
                return frozenset(self.nodes[i] for i in idx if i > 0)
        return frozenset(self.nodes[1:])

    # -- queries ------------------------------------------------------------------------------------------------

    @property
    def max_depth(self) -> int:
        return max(len(f) for f in self.nodes)

    @property
    def max_vocab_rank(self) -> int:
        """Largest vocab rank ``j`` used by any node (0 for a root-only graph)."""
        return max((j for f in self.nodes for step in f for _, j in step), default=0)

    def strings(self) -> list[str]:
        """Canonical strings of all nodes (root first, as ``""``)."""
        return [formula_to_str(f) for f in self.nodes]

    # -- fit to a run (ValidationError: a graph valid in itself, but not for this run) ----------------------------

    def check_budget(self, budget: int | None) -> None:
        """A budget asked of a given graph must be the graph's own (a graph file is not re-selected)."""
        if budget is not None and budget != self.budget:
            raise ValidationError(
                f"budget {budget} does not match the draft graph, which has {self.budget} nodes "
                "(drop the budget, or pass a graph of that budget)"
            )

    def check(self, block_size: int | None = None, vocab_size: int | None = None) -> None:
        """The graph's position ranks fit in a block, its vocab ranks in the vocabulary, and the block size it was
        calibrated with (its provenance, when it records one) is the run's."""
        if block_size is not None:
            top = max((r for f in self.nodes for step in f for r, _ in step), default=0)
            if top > block_size:
                raise ValidationError(
                    f"the draft graph uses position rank {top}, past the block of {block_size} positions"
                )
            calibrated = self.provenance.get("block_size")
            if isinstance(calibrated, int) and calibrated != block_size:
                raise ValidationError(
                    f"the draft graph was calibrated with block size {calibrated}, this run decodes blocks of "
                    f"{block_size} (calibrate a graph for this block size)"
                )
        if vocab_size is not None and self.max_vocab_rank > vocab_size:
            raise ValidationError(
                f"the draft graph uses vocab rank {self.max_vocab_rank}, past the vocabulary ({vocab_size} tokens)"
            )

    # -- JSON ---------------------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        out = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "model": self.model,
            "budget": self.budget,
            "depth_cap": self.depth_cap,
            "nodes": self.strings(),
            "parents": list(self.parents),
            "provenance": self.provenance,
        }
        if self.policy:  # node strings per window-mask count (files without a policy are unchanged)
            out["policy"] = {str(c): [self.strings()[i] for i in idx if i > 0] for c, idx in self.policy}
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], expect_budget: int | None = None) -> DraftGraph:
        if not isinstance(data, dict):
            raise ValueError("a draft-graph file holds a JSON object")
        if data.get("format") != FORMAT_NAME:
            raise ValueError(f"not a draft-graph file: format is {data.get('format')!r}, expected {FORMAT_NAME!r}")
        if data.get("version") != FORMAT_VERSION:
            raise ValueError(
                f"unknown draft-graph format version {data.get('version')!r} (supported: {FORMAT_VERSION})"
            )
        for key in ("nodes", "parents", "budget"):
            if key not in data:
                raise ValueError(f"draft-graph file lacks the {key!r} field")
        nodes = []
        for i, text in enumerate(data["nodes"]):
            try:
                nodes.append(parse_formula(str(text)))
            except ValueError as err:
                raise ValueError(f"node {i}: {err}") from None
        budget = data["budget"]
        if not isinstance(budget, int) or budget != len(nodes) - 1:
            raise ValueError(f"budget mismatch: file says budget {budget!r} but holds {len(nodes) - 1} non-root nodes")
        if expect_budget is not None and budget != expect_budget:
            raise ValueError(f"budget mismatch: expected budget {expect_budget}, the file's graph has {budget}")
        graph = cls(
            nodes=tuple(nodes),
            parents=tuple(data["parents"]),
            model=str(data.get("model", "")),
            budget=budget,
            depth_cap=data.get("depth_cap"),
            provenance=dict(data.get("provenance") or {}),
        )
        policy = data.get("policy")
        if policy is None:
            return graph
        if not isinstance(policy, dict):
            raise ValueError("the draft-graph policy must map window-mask counts to lists of node formulas")
        try:
            parsed = {int(c): [parse_formula(str(t)) for t in texts] for c, texts in policy.items()}
        except ValueError as err:
            raise ValueError(f"policy: {err}") from None
        return graph.with_policy(parsed)

    def to_json(self, path: str | Path) -> None:
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n")

    @classmethod
    def load(cls, path: str | Path, expect_budget: int | None = None) -> DraftGraph:
        """Read and validate a graph file; ``expect_budget`` additionally checks ``B``."""
        try:
            data = json.loads(Path(path).read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not valid JSON ({err})") from None
        return cls.from_dict(data, expect_budget=expect_budget)
