"""Batched block decoding with continuous batching: up to ``max_batch`` requests share one forward per step.

Dims: ``R`` active requests, ``K`` branches per request in a pass (padded to the largest), ``N`` block length,
``V`` vocabulary.

Each request keeps its own prompt, prefix KV cache (a slot of one :class:`~specfold.model.cache.BatchCache`,
ragged lengths masked in attention), block state, small-block window, stop state and — with a drafter (spiffy,
specfold) — the logits that produced its state, from which its drafts are made. A step admits waiting requests
(prefill, one request at a time), drafts per request, runs one verification pass over every active request's
branches (:meth:`~specfold.engine.base.Verifier.verify_batch`: dense, or folded inside each request), applies the
pass per request (:func:`~specfold.decoding.decoder.apply_pass`: the rule, then accepted drafts), and writes every
finished block to its request's cache in one batched forward. Finished requests leave at once; waiting ones join
at the next step. Active requests always occupy slots ``0 .. R-1`` (a leaving request's slot is refilled by
moving the last one, once), so every pass reads the prefixes as one view, never copied per step.

The per-request rule (unmask, stop, block end, draft acceptance) is the one
:func:`~specfold.decoding.decoder.decode` applies, so a request's tokens do not depend on its batch neighbours
(tested in fp64 against batch-1 decoding). One exception: the folded verifier's cost rule decides a layer's
dense fallback for the whole pass, which at δ > 0 can change which rows fold.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from specfold.config import DecodeConfig
from specfold.decoding.decoder import (
    PROTOCOLS,
    GenerationResult,
    _seed_block,
    apply_pass,
    check_prompt,
    lookahead_supported,
)
from specfold.decoding.unmasking import stop_reached
from specfold.engine.base import BatchBranches
from specfold.engine.dense import DenseVerifier
from specfold.model.cache import BatchCache
from specfold.model.loading import LoadedModel


@dataclass
class BatchRequest:
    request_id: Hashable
    prompt_ids: list[int]
    max_new_tokens: int | None = None  # None: cfg.max_new_tokens


@dataclass
class BatchEvent:
    request_id: Hashable
    committed: list[int]  # newly committed ids: the contiguous unmasked prefix only, truncated after the stop
    result: GenerationResult | None = None  # set exactly once, in the request's last event


@dataclass
class BatchMethod:
    """What decodes: ``drafter=None`` is vanilla. Anything with ``verifier`` / ``drafter`` attributes works."""

    verifier: Any | None = None
    drafter: Any | None = None


@dataclass
class _Request:
    """One request's decoding state between passes."""

    request_id: Hashable
    cfg: DecodeConfig
    slot: int
    block: torch.Tensor  # [N]
    gen_start: int
    prefill_forwards: int
    prefill_seconds: float
    t0: float
    generated: list[int] = field(default_factory=list)
    steps_per_block: list[int] = field(default_factory=list)
    steps: int = 0
    nfe_denoise: int = 0
    nfe_cache: int = 0
    accepted: int = 0
    boundary: int = 0
    engine_stats: dict[str, float] = field(default_factory=dict)
    ctx_logits: torch.Tensor | None = None  # [N, V] the logits that produced the block (None at a block start)
    emitted: int = 0
    stop_at: int | None = None


class BatchDecoder:
    def __init__(self, model: LoadedModel, cfg: DecodeConfig, method: Any = None, max_batch: int = 8) -> None:
        cfg.validate()
        if max_batch <= 0:
            raise ValueError(f"max_batch must be positive, got {max_batch}")
        self.model, self.cfg, self.max_batch = model, cfg, max_batch
        net, c = model.net, model.config
        self.verifier = getattr(method, "verifier", None) or DenseVerifier(net)
        self.drafter = getattr(method, "drafter", None)
        self.proto = PROTOCOLS[c.family]
        self.lookahead = self.drafter is not None and getattr(self.drafter, "lookahead", False)
        if self.lookahead and (why := lookahead_supported(net, c.family, cfg.block_size)) is not None:
            raise ValueError(why)
        self.cache = BatchCache(
            c.num_layers, max_batch, c.num_kv_heads, c.head_dim, c.max_position_embeddings, net.dtype, net.device
        )
        self.free = list(range(max_batch))
        self.waiting: list[tuple[Hashable, torch.Tensor, DecodeConfig]] = []
        self.active: dict[Hashable, _Request] = {}

    @property
    def idle(self) -> bool:
        return not self.active and not self.waiting

    def submit(self, request: BatchRequest) -> None:
        cfg = self.cfg if request.max_new_tokens is None else replace(self.cfg, max_new_tokens=request.max_new_tokens)
        cfg.validate()
        if request.request_id in self.active or any(w[0] == request.request_id for w in self.waiting):
            raise ValueError(f"request id {request.request_id!r} is already in the batch")
        prompt = check_prompt(self.model, request.prompt_ids, cfg)
        self.waiting.append((request.request_id, prompt, cfg))

    def cancel(self, request_id: Hashable) -> None:
        self.waiting = [w for w in self.waiting if w[0] != request_id]
        req = self.active.pop(request_id, None)
        if req is not None:
            self._release(req)

    def _release(self, req: _Request) -> None:
        """Free the request's slot; the request in the highest slot moves into it (one copy of its cache), so the
        active requests keep slots ``0 .. R-1``."""
        hole = req.slot
        last = max(self.active.values(), key=lambda r: r.slot, default=None)
        if last is not None and last.slot > hole:
            src, dst = self.cache.slot(last.slot), self.cache.slot(hole)
            length = src.length
            dst.k[:, :, :length] = src.k[:, :, :length]
            dst.v[:, :, :length] = src.v[:, :, :length]
            dst.length = length
            hole, last.slot = last.slot, hole
        self.cache.reset(hole)
        self.free.append(hole)
        self.free.sort()

    @torch.no_grad()
    def step(self) -> list[BatchEvent]:
        events: list[BatchEvent] = []
        net, n, mask_id = self.model.net, self.cfg.block_size, self.model.mask_id
        admitted = []
        while self.waiting and self.free:
            rid, prompt, cfg = self.waiting.pop(0)
            slot = self.free.pop(0)
            t_pre = time.perf_counter()
            block, gen_start, forwards = self.proto.start(
                net, prompt, self.cache.slot(slot), n, mask_id, chunk=cfg.prefill_chunk
            )
            now = time.perf_counter()
            req = _Request(rid, cfg, slot, block, gen_start, forwards, now - t_pre, now)
            self.active[rid] = req
            admitted.append(req)
        self._settle(admitted, events)
        reqs = sorted(self.active.values(), key=lambda r: r.slot)
        if reqs:
            drafts = [self._draft(req) for req in reqs]
            k = max(st.shape[0] for st, _ in drafts)
            states = torch.stack([torch.cat([st, st[:1].expand(k - st.shape[0], n)]) for st, _ in drafts])
            parents = torch.stack([torch.cat([par, par.new_zeros(k - par.shape[0])]) for _, par in drafts])
            slots, lengths = self._slots(reqs)
            batch = BatchBranches(self.cache, slots, lengths, states, parents, [st.shape[0] for st, _ in drafts])
            result = self.verifier.verify_batch(batch)  # states [R, K, N], parents [R, K]
            for req, (st, _), logits, stats in zip(reqs, drafts, result.logits, result.stats, strict=True):
                req.nfe_denoise += 1
                for key, value in stats.items():
                    req.engine_stats[key] = req.engine_stats.get(key, 0.0) + value
                out = apply_pass(logits, st, req.block, req.gen_start, req.cfg, mask_id, self.model.stop_id)
                req.block, req.ctx_logits = out.block, out.logits
                req.steps += out.steps
                req.accepted += out.accepted
            self._settle(reqs, events)
        return events

    def _draft(self, req: _Request) -> tuple[torch.Tensor, torch.Tensor]:
        """The request's branch states ``[K, N]`` and parents ``[K]`` for the next pass (just its state at a block
        start or without a drafter)."""
        if self.drafter is not None and req.ctx_logits is not None:
            return self.drafter.draft(req.ctx_logits, req.block, req.gen_start)
        return req.block[None], torch.full((1,), -1, dtype=torch.long, device=req.block.device)

    def _slots(self, reqs: list[_Request]) -> tuple[torch.Tensor, torch.Tensor]:
        """Slots and cached lengths ``[R]`` (host tensors: a pass reads them without a device sync)."""
        slots = torch.tensor([r.slot for r in reqs], dtype=torch.long)
        lengths = torch.tensor([self.cache.slot(r.slot).length for r in reqs], dtype=torch.long)
        return slots, lengths

    def _settle(self, reqs: list[_Request], events: list[BatchEvent]) -> None:
        """After a rule application: finish blocks whose stop or last mask was reached, write them to the caches
        (one batched forward; with boundary drafts a second one for the requests that guess their next seed), seed the
        next blocks, and repeat for blocks finished at once; emit events."""
        n, mask_id, stop_id = self.cfg.block_size, self.model.mask_id, self.model.stop_id
        pending = reqs
        while pending:
            to_write = []
            for req in pending:
                req.stop_at = stop_reached(req.block, req.gen_start, mask_id, stop_id)
                if req.stop_at is None and bool((req.block == mask_id).any()):
                    new = self._new_tokens(req)
                    if new:
                        events.append(BatchEvent(req.request_id, new))
                    continue
                req.steps_per_block.append(req.steps)
                end = n if req.stop_at is None else req.stop_at + 1
                req.generated.extend(req.block[req.gen_start : end].tolist())
                if req.stop_at is not None or len(req.generated) >= req.cfg.max_new_tokens:
                    events.append(self._finish(req))
                else:
                    to_write.append(req)
            guessing = [r for r in to_write if self.lookahead and r.ctx_logits is not None]
            plain = [r for r in to_write if not (self.lookahead and r.ctx_logits is not None)]
            if plain:
                self._commit(plain)
            if guessing:
                self._commit_guessing(guessing)
            pending = to_write

    def _commit(self, reqs: list[_Request]) -> None:
        """Write the requests' finished blocks to their caches (one forward) and seed their next blocks."""
        net, n, mask_id = self.model.net, self.cfg.block_size, self.model.mask_id
        states = torch.stack([r.block for r in reqs])  # [R', N]
        slots, lengths = self._slots(reqs)
        last = net.forward_ragged(
            states, self.cache, slots, lengths, mask=self.proto.finish_mask, write_cache=True,
            logit_rows=slice(-1, None),
        )  # [R', 1, V]
        seeds = last[:, -1].argmax(dim=-1)
        for req, seed in zip(reqs, seeds, strict=True):
            self.cache.slot(req.slot).length += n
            req.nfe_cache += 1
            req.block, req.gen_start, req.steps = _seed_block(seed, n, mask_id), 0, 0
            req.ctx_logits = None

    def _commit_guessing(self, reqs: list[_Request]) -> None:
        """:meth:`_commit` with a boundary draft per request (:func:`~specfold.decoding.decoder.commit_block`):
        one block-causal forward over each finished block and its guessed next block; where the seed equals the
        guess, the next block's first rule application is made from those rows."""
        net, n, mask_id, stop_id = self.model.net, self.cfg.block_size, self.model.mask_id, self.model.stop_id
        guesses = torch.stack([r.ctx_logits[0].argmax() for r in reqs])  # [R']
        nxt = torch.full((len(reqs), n), mask_id, dtype=torch.long, device=guesses.device)
        nxt[:, 0] = guesses
        states = torch.cat([torch.stack([r.block for r in reqs]), nxt], dim=1)  # [R', 2N]
        slots, lengths = self._slots(reqs)
        raw = net.forward_ragged(
            states, self.cache, slots, lengths, mask="block_causal", write_cache=True, logit_rows=slice(n - 1, None)
        )  # [R', N+1, V]: row N-1 seeds the next block, rows N.. are its first pass (their K/V are not kept)
        seeds = raw[:, 0].argmax(dim=-1)
        hits = (seeds == guesses).tolist()
        for i, (req, seed, hit) in enumerate(zip(reqs, seeds, hits, strict=True)):
            self.cache.slot(req.slot).length += n
            req.nfe_cache += 1
            req.block, req.gen_start, req.steps = _seed_block(seed, n, mask_id), 0, 0
            req.ctx_logits = None
            if hit:
                first = net.position_logits(raw[i : i + 1, 1:])  # [1, N, V]
                out = apply_pass(first, req.block[None], req.block, 0, req.cfg, mask_id, stop_id)
                req.block, req.ctx_logits = out.block, out.logits
                req.steps += out.steps
                req.boundary += 1

    def _new_tokens(self, req: _Request) -> list[int]:
        """The request's committed tokens not yet emitted (the generation's contiguous unmasked prefix)."""
        tail = req.block[req.gen_start :]
        masked = (tail == self.model.mask_id).nonzero()
        upto = int(masked[0, 0]) if masked.numel() else tail.numel()
        current = req.generated + tail[:upto].tolist()
        return self._emit(req, current)

    def _emit(self, req: _Request, current: list[int]) -> list[int]:
        stop_id = self.model.stop_id
        if stop_id is not None and stop_id in current:
            current = current[: current.index(stop_id) + 1]
        current = current[: req.cfg.max_new_tokens]
        new = current[req.emitted :]
        req.emitted = max(req.emitted, len(current))
        return new

    def _finish(self, req: _Request) -> BatchEvent:
        if self.model.net.device.type == "cuda":
            torch.cuda.synchronize(self.model.net.device)
        seconds = time.perf_counter() - req.t0
        generated = req.generated[: req.cfg.max_new_tokens]
        stopped = req.stop_at is not None and self.model.stop_id in generated
        result = GenerationResult(
            token_ids=generated,
            text=None,
            nfe=req.nfe_denoise + req.nfe_cache,
            nfe_denoise=req.nfe_denoise,
            nfe_cache=req.nfe_cache,
            prefill_forwards=req.prefill_forwards,
            steps_per_block=req.steps_per_block,
            seconds=seconds,
            generated_tokens=len(generated),
            stopped=stopped,
            accepted_drafts=req.accepted,
            boundary_drafts=req.boundary,
            engine_stats=req.engine_stats,
            prefill_seconds=req.prefill_seconds,
        )
        committed = self._emit(req, generated)
        del self.active[req.request_id]
        self._release(req)
        return BatchEvent(req.request_id, committed, result)


def decode_batch(
    model: LoadedModel,
    prompts: Sequence[Sequence[int]],
    cfg: DecodeConfig,
    method: Any = None,
    max_batch: int = 8,
) -> list[GenerationResult]:
    """Decode every prompt through a batch of at most ``max_batch`` requests; results in prompt order."""
    decoder = BatchDecoder(model, cfg, method, max_batch)
    for i, prompt in enumerate(prompts):
        decoder.submit(BatchRequest(i, list(prompt)))
    results: list[GenerationResult | None] = [None] * len(prompts)
    while not decoder.idle:
        for event in decoder.step():
            if event.result is not None:
                results[event.request_id] = event.result
    return results  # type: ignore[return-value]
