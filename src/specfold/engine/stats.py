"""Statistics of verification passes: :class:`FoldStats`, and how a folded pass's per-layer counts become one.

A layer step reports :class:`~specfold.engine.layer_types.LayerCounts` per branch as device tensors (no host sync
inside the layer loop); :func:`fold_stats_batch` reads them once per pass and sums them over each request's real
branches, by layer and by graph depth.

A *draft triple* is a (draft branch, block position, layer) of one pass: branches ≥ 1 only, the main branch is
never a draft. Passes add up (``total = total + result.stats``, from the empty ``FoldStats()``, which is also what
a dense pass reports besides its rows).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, fields
from itertools import zip_longest

import torch

from specfold.engine.gate import branch_depths, check_parents
from specfold.engine.layer_types import LayerCounts

GATES = ("attention", "ffn")


def _add(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """Elementwise sum, the shorter tuple padded with zeros (passes of different graph depths)."""
    if len(a) == len(b):
        return tuple(map(operator.add, a, b))
    return tuple(x + y for x, y in zip_longest(a, b, fillvalue=0))


@dataclass(frozen=True)
class FoldStats:
    """Counts of one or more verification passes (summed with ``+``). Every verifier counts ``rows``; the rest is
    counted by folded passes only (``layers > 0`` once one was).

    Per-layer tuples have one entry per layer of the model; per-depth tuples one entry per graph depth ``d``,
    entry 0 (the main branch, never a draft) always 0."""

    rows: int = 0  # (branch, position) rows verified
    layers: int = 0  # (pass, layer) pairs of the folded passes
    dense_layers: int = 0  # of those, layers that computed every row of the request (cost rule, or nothing folded)
    dense_passes: int = 0  # passes with drafts run dense by the per-pass rule (their layers count as dense_layers)
    compiled_graphs: int = 0  # graphs torch.compile built during these passes (compiled forwards; recompilations)
    compile_seconds: float = 0.0  # wall seconds of the passes that compiled a graph
    draft_triples: int = 0  # (draft branch, position, layer) triples
    folded_triples: int = 0  # of those, folded at the attention gate (inherited Q/K/V)
    ffn_folded_triples: int = 0  # of those, folded at the FFN gate (inherited FFN output)
    guard_fallbacks: int = 0  # folded rows the cancellation guard sent to direct attention
    corrected_rows: int = 0  # folded rows whose attention Eq. 8 corrected
    # Window passes (a bidirectional family's block inside rows around it, specfold.decoding.sequence): the draft
    # triples at the block's rows and those folded at the attention gate; the rest of draft_triples /
    # folded_triples are the context rows (the masked suffix; without a cache also the prompt and finished blocks).
    block_draft_triples: int = 0
    block_folded_triples: int = 0
    folded_by_layer: tuple[int, ...] = ()  # [L] draft rows folded at the attention gate
    draft_by_layer: tuple[int, ...] = ()  # [L] draft rows
    recomputed_by_layer: tuple[int, ...] = ()  # [L] rows (main included) whose Q/K/V were computed
    folded_by_depth: tuple[int, ...] = ()  # [depth] draft triples folded at the attention gate
    draft_by_depth: tuple[int, ...] = ()  # [depth] draft triples

    def __add__(self, other: FoldStats) -> FoldStats:
        if not isinstance(other, FoldStats):
            return NotImplemented
        a, b = self.__dict__, other.__dict__  # NOTE: added once per pass and request; no per-field getattr
        return FoldStats(**{k: a[k] + b[k] for k in _COUNTS}, **{k: _add(a[k], b[k]) for k in _SERIES})

    def fold_ratio(self, gate: str = "attention") -> float | None:
        """Folded ÷ draft triples at the layer-input (``"attention"``) or the FFN gate; None when nothing was
        drafted."""
        if gate not in GATES:
            raise ValueError(f"unknown gate {gate!r}; available: {', '.join(GATES)}")
        folded = self.folded_triples if gate == "attention" else self.ffn_folded_triples
        return folded / self.draft_triples if self.draft_triples else None

    def window_fold_ratios(self) -> tuple[float | None, float | None]:
        """Attention-gate fold ratios of window passes: (block rows, context rows); None where nothing was
        drafted."""
        block, ctx = self.block_draft_triples, self.draft_triples - self.block_draft_triples
        folded_ctx = self.folded_triples - self.block_folded_triples
        return (self.block_folded_triples / block if block else None, folded_ctx / ctx if ctx else None)

    def to_dict(self) -> dict[str, float]:
        """The flat JSON of records and ``--json`` outputs: ``rows``; after a folded pass also the totals,
        ``folded_l{i}`` / ``draft_l{i}`` / ``recomputed_rows_l{i}`` per layer and ``folded_d{d}`` / ``draft_d{d}``
        per depth that held a draft; ``compiled_graphs`` and ``compile_seconds`` once a pass compiled."""
        out = {"rows": float(self.rows)}
        if self.compiled_graphs:
            out["compiled_graphs"] = float(self.compiled_graphs)
            out["compile_seconds"] = float(self.compile_seconds)
        if not self.layers:
            return out
        out["draft_triples"] = float(self.draft_triples)
        for i, (folded, draft, recomputed) in enumerate(
            zip(self.folded_by_layer, self.draft_by_layer, self.recomputed_by_layer, strict=True)
        ):
            out[f"folded_l{i}"] = float(folded)
            out[f"draft_l{i}"] = float(draft)
            out[f"recomputed_rows_l{i}"] = float(recomputed)
        for d, (folded, draft) in enumerate(zip(self.folded_by_depth, self.draft_by_depth, strict=True)):
            if draft:
                out[f"folded_d{d}"] = float(folded)
                out[f"draft_d{d}"] = float(draft)
        for key in ("folded_triples", "ffn_folded_triples", "guard_fallbacks", "corrected_rows", "dense_layers",
                    "dense_passes", "layers"):
            out[key] = float(getattr(self, key))
        if self.block_draft_triples:
            block, ctx = self.window_fold_ratios()
            out["block_draft_triples"] = float(self.block_draft_triples)
            out["block_folded_triples"] = float(self.block_folded_triples)
            out["fold_ratio_block"] = float(block)
            if ctx is not None:
                out["fold_ratio_context"] = float(ctx)
        return out


_SERIES = tuple(f.name for f in fields(FoldStats) if f.name.endswith(("_layer", "_depth")))
_COUNTS = tuple(f.name for f in fields(FoldStats) if f.name not in _SERIES)


def fold_stats(counts: list[LayerCounts], parents: list[int] | torch.Tensor, n: int) -> FoldStats:
    """:func:`fold_stats_batch` of a one-request pass (``parents [K]``)."""
    rows = [parents] if isinstance(parents, list) else parents[None]
    return fold_stats_batch(counts, rows, n, [counts[0].folded.shape[0]])[0]


def fold_stats_batch(
    counts: list[LayerCounts],
    parents: list[list[int]] | torch.Tensor,  # [R][K] local parents, or the pass's [R, K] device tensor
    n: int,
    branches: list[int],  # [R] real branches per request (the rest of its K rows are padding)
    starts: list[int] | None = None,  # [R] each request's first row in the pass (default: K rows per request)
) -> list[FoldStats]:
    """Per request: counts of (branch ≥ 1, position, layer) triples over its real branches, summed by layer and
    by graph depth (one device sync for the whole batch).

    ``folded_triples`` are folded at the attention gate (inherited Q/K/V), ``ffn_folded_triples`` at the FFN gate
    (inherited FFN output); ``dense_layers`` computed every row of the request (the cost rule's dense fallback, or
    nothing folded). ``parents`` given as the pass's device tensor (the triton backend, see
    :func:`~specfold.engine.gate.safe_parents`) are read in the same host read as the counts — the pass's only
    one — and validated then."""
    layers = len(counts)
    table = torch.stack([torch.stack([c.folded, c.ffn_folded, c.guard, c.recomputed, c.corrected]).long()
                         for c in counts])  # [L, 5, R*K]
    if isinstance(parents, torch.Tensor):
        flat = torch.cat([table.reshape(-1), parents.reshape(-1).to(table.device, torch.long)]).tolist()  # one read
        total = table.numel()
        kb = parents.shape[-1]
        parents = [[int(p) for p in flat[total + q * kb: total + (q + 1) * kb]] for q in range(len(branches))]
        width = table.shape[2]
        values = [[flat[(layer * 5 + f) * width:(layer * 5 + f + 1) * width] for f in range(5)]
                  for layer in range(layers)]
    else:
        values = table.tolist()  # [L][5][R*K]
    if starts is None:
        starts = [q * (table.shape[2] // len(branches)) for q in range(len(branches))]
    out = []
    for q, kr in enumerate(branches):
        local = parents[q][:kr]
        check_parents(local)
        depth = branch_depths(local)
        lo, hi = starts[q], starts[q] + kr
        per_layer = [[sum(x[lo:hi]) for x in v] for v in values]  # [L][5]: folded, ffn, guard, recomputed, corr.
        by_depth = [0] * (max(depth) + 1)
        for layer_values in values:
            for b in range(1, kr):
                by_depth[depth[b]] += layer_values[0][lo + b]
        drafts = [0] * (max(depth) + 1)
        for b in range(1, kr):
            drafts[depth[b]] += n * layers
        out.append(FoldStats(
            rows=kr * n, layers=layers,
            dense_layers=sum(c[3] == kr * n for c in per_layer),  # every row of the request computed
            draft_triples=(kr - 1) * n * layers,
            folded_triples=sum(c[0] for c in per_layer), ffn_folded_triples=sum(c[1] for c in per_layer),
            guard_fallbacks=sum(c[2] for c in per_layer), corrected_rows=sum(c[4] for c in per_layer),
            folded_by_layer=tuple(c[0] for c in per_layer), draft_by_layer=((kr - 1) * n,) * layers,
            recomputed_by_layer=tuple(c[3] for c in per_layer),
            folded_by_depth=tuple(by_depth), draft_by_depth=tuple(drafts),
        ))
    return out
