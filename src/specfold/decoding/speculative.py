"""Wiring draft graphs into the block decoder: the drafter (per verification step) and the calibration recorder.

Dims: ``N`` block length, ``V`` vocabulary, ``K`` branches.

:class:`GraphDrafter` turns the logits that produced the main state ``X_0`` into the branch states of one
verification pass (row 0 = ``X_0``), following a calibrated :class:`~specfold.decoding.draft_graph.DraftGraph`.
:class:`TraceRecorder` observes a vanilla decode and keeps each block's trajectory as a
:class:`~specfold.decoding.calibration.BlockTrace`, which calibration turns into formula counts.
"""

from __future__ import annotations

import torch

from specfold.decoding.acceptance import BlockTrace
from specfold.decoding.draft_graph import DraftGraph
from specfold.decoding.drafts import build_drafts, compile_graph, draft_context
from specfold.decoding.unmasking import StopIds


class GraphDrafter:
    """Builds the draft branches of a verification step from a graph (vectorised over branches); with
    ``lookahead`` the decoder also drafts each next block's first state (boundary drafts,
    :mod:`specfold.decoding.decoder`)."""

    def __init__(
        self, graph: DraftGraph, mask_id: int, small_block_size: int | None, stop_id: StopIds,
        device: torch.device | str = "cpu", lookahead: bool = False,
    ) -> None:
        self.graph, self.lookahead = graph, lookahead
        self.compiled = compile_graph(graph, device=device)
        self.mask_id, self.small_block_size, self.stop_id = mask_id, small_block_size, stop_id

    def draft(
        self,
        logits: torch.Tensor,  # [N, V] the logits that produced x0
        x0: torch.Tensor,  # [N]
        gen_start: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ctx = draft_context(logits, x0, self.mask_id, self.small_block_size, self.compiled.max_vocab_rank)
        batch = build_drafts(self.compiled, ctx, x0, self.mask_id, self.small_block_size, self.stop_id, gen_start)
        return batch.states, batch.parents


class TraceRecorder:
    """A :class:`~specfold.decoding.decoder.StepObserver` that records every block of a vanilla decode."""

    def __init__(self, mask_id: int, small_block_size: int | None, stop_id: StopIds, max_vocab_rank: int) -> None:
        self.mask_id, self.small_block_size, self.stop_id = mask_id, small_block_size, stop_id
        self.max_vocab_rank = max_vocab_rank
        self.traces: list[BlockTrace] = []

    def block_start(self, state: torch.Tensor, gen_start: int) -> None:
        self.traces.append(
            BlockTrace([state.clone()], [None], gen_start, self.mask_id, self.small_block_size, self.stop_id)
        )

    def step(self, logits: torch.Tensor, next_state: torch.Tensor) -> None:
        trace = self.traces[-1]
        ctx = draft_context(logits, next_state, self.mask_id, self.small_block_size, self.max_vocab_rank)
        if torch.equal(next_state, trace.states[-1]):
            # a pass that unmasked nothing (LLaDA's zero-quota steps, the cached pass after a boundary forward that
            # filled the block): no transition to draft, but the next one is drafted from these logits
            trace.contexts[-1] = ctx
            return
        trace.states.append(next_state.clone())
        trace.contexts.append(ctx)
