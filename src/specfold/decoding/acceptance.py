"""The acceptance model: what a draft graph accepts on recorded vanilla trajectories, without forward passes.

Dims: ``N`` block length, ``J`` vocab ranks kept per position, ``M`` graph nodes.

A speculative decode follows the vanilla trajectory ``X^(0) .. X^(T)`` of every block exactly (SPEC §3), so which
drafts it accepts is a function of that trajectory and the graph alone:

* the pass at a block's first state ``X^(0)`` has no drafting logits yet: no drafts;
* a pass at ``X^(t)`` (``t >= 1``) drafts from the logits that produced ``X^(t)`` — the recorded
  ``contexts[t]`` — and yields ``X^(t+1)``; while the next state ``X^(t+k)`` is non-terminal and equals one of
  that pass's draft states, it is an accepted draft (no forward); the next pass happens at the first state that
  is not (``t + 1 + accepted``).

:func:`replay` walks exactly that with :func:`~specfold.decoding.drafts.build_drafts` on the recorded contexts
(state semantics, what the decoder does): it equals what a real decode with the graph accepts on the same prompts
(tested in fp64). :class:`BlockPaths` keeps only each step's path as formulas relative to its drafting context
(``paths[t][:k]`` is the formula of ``X^(t) -> X^(t+k)``, SPEC §3 "Calibration"); :func:`replay_paths` replays a
set of formulas on them (formula semantics: the draft accepted at depth ``k`` is the path's own formula). The two
agree except where a node with a differently grouped formula reaches the same state (``(1,1)+(2,1)`` for the path
``(1,1)|(2,1)``): state semantics accept at least those too. Paths are what calibration selects from and what
ships beside a model (``draft_graph.paths.json``); full traces are not kept.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from specfold.decoding.draft_graph import DraftGraph, Formula, Step, formula_to_str, parse_formula
from specfold.decoding.drafts import DraftContext, build_drafts, compile_graph, stops_reached, window_masks
from specfold.decoding.unmasking import StopIds

PATHS_FORMAT = "specfold.calibration_paths"
PATHS_VERSION = 1


@dataclass
class BlockTrace:
    """The vanilla trajectory of one block.

    states: ``T + 1`` LongTensors ``[N]``: ``states[0]`` the block as first denoised, ``states[t + 1]`` the rule
        applied to ``states[t]``'s logits. Decoding may end early (stop reached).
    contexts: ``contexts[t]`` = ``draft_context(logits that produced states[t], states[t], ...)``; ``None`` for
        ``t = 0`` (and for any step not recorded; no drafts are made there).
    gen_start: block positions before it are a fixed prompt tail (never masked, ignored by the stop test).
    """

    states: list[torch.Tensor]  # T+1 x [N]
    contexts: list[DraftContext | None]  # T+1
    gen_start: int
    mask_id: int
    small_block_size: int | None
    stop_id: StopIds

    def __post_init__(self) -> None:
        if len(self.states) != len(self.contexts):
            raise ValueError(f"{len(self.states)} states but {len(self.contexts)} contexts")

    def terminal(self) -> list[bool]:
        """Per state: no mask left or a stop reached (the decoder stops denoising the block there)."""
        stacked = torch.stack(self.states)  # [T+1, N]
        full = ~(stacked == self.mask_id).any(-1)
        return (full | stops_reached(stacked, self.gen_start, self.mask_id, self.stop_id)).tolist()

    @property
    def steps(self) -> int:
        """Rule applications until the first terminal state (= the vanilla decoder's passes over this block); a
        recording that ends before one (a truncated trace) counts as if one followed its last state."""
        terminal = self.terminal()
        return next((t for t, done in enumerate(terminal) if done), len(self.states))


@dataclass(frozen=True)
class Acceptance:
    """Passes and accepted drafts of a speculative decode over some blocks (denoising passes only).

    steps = passes + accepted: every rule application is the first of a pass or an accepted draft.
    """

    blocks: int = 0
    steps: int = 0  # vanilla denoising passes
    passes: int = 0  # speculative denoising passes
    accepted: int = 0
    drafted: int = field(default=0, compare=False)  # draft rows over all passes (what the drafts cost)

    def __add__(self, other: Acceptance) -> Acceptance:
        return Acceptance(
            self.blocks + other.blocks,
            self.steps + other.steps,
            self.passes + other.passes,
            self.accepted + other.accepted,
            self.drafted + other.drafted,
        )

    @property
    def accepted_per_pass(self) -> float:
        return self.accepted / self.passes if self.passes else 0.0

    @property
    def drafted_per_pass(self) -> float:
        return self.drafted / self.passes if self.passes else 0.0

    @property
    def passes_saved(self) -> float:
        """Fraction of the vanilla denoising passes saved."""
        return self.accepted / self.steps if self.steps else 0.0

    def to_dict(self) -> dict[str, float]:
        return {
            "blocks": self.blocks,
            "steps": self.steps,
            "passes": self.passes,
            "accepted": self.accepted,
            "accepted_per_pass": round(self.accepted_per_pass, 4),
            "passes_saved": round(self.passes_saved, 4),
            "drafted_per_pass": round(self.drafted_per_pass, 4),
        }


def _walk(steps: int, accepted_at: Any) -> Acceptance:
    """The pass schedule of one block: passes at 0 and 1, then at ``t + 1 + accepted_at(t)``."""
    if steps == 0:
        return Acceptance(blocks=1)
    passes, accepted, t = 1, 0, 1  # the pass at X^(0) drafts nothing
    while t < steps:
        k = accepted_at(t)
        passes, accepted, t = passes + 1, accepted + k, t + 1 + k
    return Acceptance(1, steps, passes, accepted)


def replay_trace(trace: BlockTrace, graph: DraftGraph) -> Acceptance:
    """Exact replay of the decoder's acceptance rule on one recorded block (state semantics)."""
    compiled = compile_graph(graph, device=trace.states[0].device)
    return _replay_compiled(trace, compiled)


def _replay_compiled(trace: BlockTrace, compiled: Any) -> Acceptance:
    steps = trace.steps
    rows = 0

    def accepted_at(t: int) -> int:
        ctx = trace.contexts[t]
        if ctx is None:
            return 0
        if ctx.max_vocab_rank < compiled.max_vocab_rank:
            raise ValueError(
                f"the trace keeps {ctx.max_vocab_rank} vocab ranks but the graph uses rank {compiled.max_vocab_rank}"
            )
        nonlocal rows
        drafts = build_drafts(
            compiled, ctx, trace.states[t], trace.mask_id, trace.small_block_size, trace.stop_id, trace.gen_start
        ).states  # [K+1, N]
        rows += drafts.shape[0] - 1
        k = 0
        while t + 1 + k < steps and bool((drafts == trace.states[t + 1 + k]).all(-1).any()):
            k += 1
        return k

    return replace(_walk(steps, accepted_at), drafted=rows)


def replay(traces: Iterable[BlockTrace], graph: DraftGraph) -> Acceptance:
    """:func:`replay_trace` summed over blocks."""
    traces = list(traces)
    if not traces:
        return Acceptance()
    compiled = compile_graph(graph, device=traces[0].states[0].device)
    total = Acceptance()
    for trace in traces:
        total = total + _replay_compiled(trace, compiled)
    return total


# ---------------------------------------------------------------------------------------------------------------
# Paths: the trajectory as formulas (what calibration keeps)
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BlockPaths:
    """One block's trajectory as formulas.

    steps: ``T``, rule applications until the first terminal state.
    paths: ``T`` entries; ``paths[t]`` holds the steps of ``X^(t) -> X^(t+1) -> ...`` as pair sets relative to the
        drafting context at ``t``, up to the last non-terminal state (and the depth / vocab-rank limits it was
        made with); ``paths[0] = ()`` (a block's first pass has no drafting logits).
    windows: ``T`` entries, the window-mask count of ``X^(t)`` (:func:`~specfold.decoding.drafts.window_masks`,
        the context a graph policy is keyed by); None where not recorded.
    """

    steps: int
    paths: tuple[tuple[Step, ...], ...]
    windows: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if len(self.paths) != self.steps:
            raise ValueError(f"block of {self.steps} steps has {len(self.paths)} paths")
        if self.windows is not None and len(self.windows) != self.steps:
            raise ValueError(f"block of {self.steps} steps has {len(self.windows)} window-mask counts")
        for t, path in enumerate(self.paths):
            if t + len(path) > self.steps - 1 and path:
                raise ValueError(f"path at step {t} runs past the block's last non-terminal state")

    def formulas(self, max_depth: int | None = None) -> Counter[Formula]:
        """Every ``paths[t][:k]`` (``k <= max_depth``), counted."""
        out: Counter[Formula] = Counter()
        for path in self.paths:
            for k in range(1, min(len(path), max_depth or len(path)) + 1):
                out[path[:k]] += 1
        return out


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


def paths_of_block(trace: BlockTrace, max_depth: int, max_vocab_rank: int) -> BlockPaths:
    """The formulas of every transition ``states[t] -> states[t + d]`` (``t >= 1``, ``d <= max_depth``, the end
    state non-terminal); a path stops at the first token beyond vocab rank ``max_vocab_rank`` (or the context's J)."""
    states = trace.states
    new_masks = _transition_steps(trace)
    steps = trace.steps
    paths: list[tuple[Step, ...]] = [()]
    for t in range(1, steps):  # offline: plain loops are fine here
        ctx = trace.contexts[t]
        if ctx is None:
            paths.append(())
            continue
        if ctx.n_masked != int((states[t] == trace.mask_id).sum()):
            raise ValueError(f"contexts[{t}] was not built from states[{t}] (different number of masks)")
        rank_of = ctx.rank_of_position().tolist()
        top = ctx.top_tokens[:, : min(max_vocab_rank, ctx.max_vocab_rank)].tolist()
        path: list[Step] = []
        for d in range(1, min(max_depth, steps - 1 - t, len(states) - 1 - t) + 1):
            positions = new_masks[t + d - 1].nonzero().squeeze(1).tolist()
            tokens = states[t + d][positions].tolist()
            if any(tok not in top[p] for p, tok in zip(positions, tokens, strict=True)):
                break  # vocab rank beyond the limit: this and all deeper formulas are unrepresentable
            pairs = zip(positions, tokens, strict=True)
            path.append(frozenset((rank_of[p], top[p].index(tok) + 1) for p, tok in pairs))
        paths.append(tuple(path))
    windows = tuple(int(window_masks(x, trace.mask_id, trace.small_block_size)) for x in states[:steps])
    return BlockPaths(steps, tuple(paths[:steps]) if steps else (), windows)


def accepted_chain(path: Sequence[Step], chosen: Set[Formula]) -> int:
    """How many leading prefixes of ``path`` are in ``chosen`` (the drafts accepted after a pass there)."""
    k = 0
    while k < len(path) and tuple(path[: k + 1]) in chosen:
        k += 1
    return k


Policy = Mapping[int, frozenset[Formula]]  # window-mask count -> the formulas drafted there (absent: all)


def drafted(block: BlockPaths, t: int, nodes: frozenset[Formula], policy: Policy | None) -> frozenset[Formula]:
    """The formulas a graph of ``nodes`` with ``policy`` drafts at step ``t`` of ``block``."""
    if not policy:
        return nodes
    if block.windows is None:
        raise ValueError("these paths were recorded without window-mask counts; a policy cannot be replayed on them")
    return policy.get(block.windows[t], nodes)


def replay_paths(blocks: Iterable[BlockPaths], nodes: Iterable[Formula], policy: Policy | None = None) -> Acceptance:
    """Replay a parent-closed set of formulas (and a policy over it) on paths (formula semantics; see the module
    docstring); ``drafted`` counts the formulas drafted at every pass."""
    chosen = frozenset(nodes)
    total = Acceptance()
    for block in blocks:
        rows = 0

        def accepted_at(t: int, block: BlockPaths = block) -> int:
            nonlocal rows
            here = drafted(block, t, chosen, policy)
            rows += len(here)
            return accepted_chain(block.paths[t], here)

        total = total + replace(_walk(block.steps, accepted_at), drafted=rows)
    return total


# ---------------------------------------------------------------------------------------------------------------
# The paths file (beside a graph): every calibration prompt's blocks, so any B / depth cap / objective can be
# re-selected, and folds are whole prompts.
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CalibrationPaths:
    """The paths of every block of every calibration prompt (``prompts[i]`` = prompt ``i``'s blocks in order)."""

    prompts: tuple[tuple[BlockPaths, ...], ...]
    max_depth: int
    max_vocab_rank: int
    provenance: Mapping[str, Any] | None = None

    @property
    def blocks(self) -> list[BlockPaths]:
        return [b for p in self.prompts for b in p]

    def counts(self, max_depth: int | None = None) -> Counter[Formula]:
        total: Counter[Formula] = Counter()
        for block in self.blocks:
            total.update(block.formulas(max_depth))
        return total

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": PATHS_FORMAT,
            "version": PATHS_VERSION,
            "max_depth": self.max_depth,
            "max_vocab_rank": self.max_vocab_rank,
            "provenance": dict(self.provenance or {}),
            # per prompt, per block: one list per step t of that step's path ("|"-joined formula text)
            "prompts": [[[formula_to_str(path) for path in b.paths] for b in p] for p in self.prompts],
            # per prompt, per block: the window-mask count of each step's state (what a graph policy is keyed by)
            "windows": [[list(b.windows) if b.windows is not None else None for b in p] for p in self.prompts],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CalibrationPaths:
        if not isinstance(data, Mapping) or data.get("format") != PATHS_FORMAT:
            got = data.get("format") if isinstance(data, Mapping) else type(data).__name__
            raise ValueError(f"not a calibration-paths file: format is {got!r}, expected {PATHS_FORMAT!r}")
        if data.get("version") != PATHS_VERSION:
            raise ValueError(f"unknown calibration-paths version {data.get('version')!r} (supported: {PATHS_VERSION})")
        prompts = []
        windows = data.get("windows") or [[None] * len(p) for p in data["prompts"]]  # files from before policies
        prompt_blocks = [len(p) for p in data["prompts"]]
        if [len(w) for w in windows] != prompt_blocks:
            raise ValueError("the window-mask counts do not match the prompts and blocks of the paths")
        for i, p in enumerate(data["prompts"]):
            blocks = []
            for b, paths in enumerate(p):
                try:
                    parsed = tuple(parse_formula(text) for text in paths)
                    w = windows[i][b]
                    blocks.append(BlockPaths(len(parsed), parsed, None if w is None else tuple(int(x) for x in w)))
                except ValueError as err:
                    raise ValueError(f"prompt {i}, block {b}: {err}") from None
            prompts.append(tuple(blocks))
        provenance = dict(data.get("provenance") or {})
        return cls(tuple(prompts), int(data["max_depth"]), int(data["max_vocab_rank"]), provenance)

    def to_json(self, path: str | Path) -> None:
        from specfold.io import atomic_write_text

        atomic_write_text(path, json.dumps(self.to_dict(), separators=(",", ":")) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> CalibrationPaths:
        try:
            data = json.loads(Path(path).read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not valid JSON ({err})") from None
        return cls.from_dict(data)


def calibration_paths(
    prompts: Sequence[Sequence[BlockTrace]],
    max_depth: int,
    max_vocab_rank: int,
    provenance: Mapping[str, Any] | None = None,
) -> CalibrationPaths:
    """Paths of recorded traces, grouped by prompt."""
    return CalibrationPaths(
        tuple(tuple(paths_of_block(t, max_depth, max_vocab_rank) for t in traces) for traces in prompts),
        max_depth,
        max_vocab_rank,
        provenance,
    )
