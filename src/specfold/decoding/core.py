"""The decoding core: block-wise decoding (SPEC §2) with optional multi-branch speculation (SPEC §3), for one request
or a continuous batch of them. Batch-1 :func:`~specfold.decoding.decoder.decode` is this core with one request.

Dims: ``R`` active requests, ``K`` branches per request in a pass, ``N`` block length, ``V`` vocabulary.

Each request keeps its own prompt, prefix KV cache (a slot of one :class:`~specfold.model.cache.BatchCache`,
ragged lengths masked in attention), block state, small-block window, stop state and — with a drafter (spiffy,
specfold) — the logits that produced its state, from which its drafts are made. One :meth:`Decoder.step`:

1. admits waiting requests into free slots (the family's prefill and first block, one request at a time);
2. drafts per request, runs **one verification pass** over every active request's branches (a single request
   through :meth:`~specfold.engine.base.Verifier.verify`, several through ``verify_batch``: dense, or folded inside
   each request);
3. applies the pass per request (:func:`apply_pass`: the family's rule on the main row, then accepted drafts);
4. settles (:meth:`Decoder._settle`): blocks whose stop, last mask or step cap was reached are finished, written to
   their caches in one batched forward (:func:`~specfold.model.families.base.commit_blocks`, with boundary drafts
   where the drafter asks for them) and the next blocks seeded; finished requests leave with their results.

Everything family-specific — prefill, masks, the rule's comparison and dtype, the block commit — comes from the
model's :class:`~specfold.model.families.base.FamilySpec`; nothing here names a family.

* vanilla: every pass verifies just the main state ``X_0``;
* spiffy / specfold: a drafter proposes branch states from the logits that produced ``X_0``; after the pass the
  rule is applied to ``X_0``'s logits and, while the next state equals a verified branch state exactly, that
  branch's logits are used without a forward pass (an accepted draft). The trajectory is the vanilla one.

**Boundary drafts** (``drafter.lookahead``, families with
:attr:`~specfold.model.families.base.FamilySpec.boundary_drafts`): the forward that writes a finished block to the
cache also runs the next block's first state ``[ŝ, M, …, M]``, with ``ŝ`` the seed guessed from the last pass's
prediction of the token after the block (position 0 of its logits). When the real seed equals ``ŝ``, those rows are
exactly the next block's first denoising pass, which is skipped. The trajectory is the vanilla one.

**Fully bidirectional families** (LLaDA, Dream: :attr:`~specfold.model.families.base.FamilySpec.bidirectional`) run
their references' protocols instead of prefill + block commits (:mod:`specfold.decoding.sequence`): every pass is
a window of rows over the request's cache slot (the whole sequence, or the block and the masked suffix over a
prefix cache, or the block alone over Fast-dLLM v1's dual cache); drafts are block states, the window rows around
the block are the same in every branch, and the rule reads the block's rows only. A block boundary's full forward
refills the cache and commits tokens; NFE counts it (``nfe_cache``).

**No decode runs forever**: a block takes at most ``rule.max_steps(N)`` rule applications (one per vanilla pass);
a block that still holds masks then (only possible when the argmax is the mask token itself) ends as it is, and the
result counts it in ``capped_blocks``.

NFE counts denoising passes and cache-writing forwards (separately too); prefill is reported apart. A request's
decode time runs from the end of its prefill to its last event; tokenisation is never included. A request's tokens
do not depend on its batch neighbours (tested in fp64), except that the folded verifier's cost rule decides a
layer's dense fallback for the whole pass, which at δ > 0 can change which rows fold.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

import torch

from specfold.config import DecodeConfig
from specfold.decoding.sequence import SequenceProtocol, boundary_forward, sequence_protocol, window_parts
from specfold.decoding.unmasking import StopIds, quota_short, rule_step, stop_ids_tuple, stop_reached
from specfold.engine.base import BatchBranches
from specfold.engine.dense import DenseVerifier
from specfold.engine.stats import FoldStats
from specfold.model.cache import BatchCache
from specfold.model.families import family_of, get_family
from specfold.model.families.base import FamilySpec, UnmaskRule, commit_blocks, seed_block
from specfold.model.loading import LoadedModel


@dataclass
class GenerationResult:
    token_ids: list[int]  # generated tokens, up to and including the stop token
    text: str | None
    nfe: int  # denoising passes + cache-writing forwards
    nfe_denoise: int
    nfe_cache: int
    prefill_forwards: int  # chunks of the prefill
    steps_per_block: list[int]  # rule applications per block (a pass may cover several)
    seconds: float  # decode wall time, prefill and tokenisation excluded
    generated_tokens: int
    stopped: bool  # the stop token ended generation (else max_new_tokens did)
    accepted_drafts: int = 0
    boundary_drafts: int = 0  # block starts whose first pass a boundary draft saved
    engine_stats: FoldStats = field(default_factory=FoldStats)  # the verifier's statistics, summed over passes
    prefill_seconds: float = 0.0  # prefill wall time (not in ``seconds``)
    capped_blocks: int = 0  # blocks ended by the step cap with masks left (the argmax was the mask token)

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.seconds if self.seconds > 0 else float("inf")

    @property
    def tokens_per_forward(self) -> float:
        return self.generated_tokens / self.nfe if self.nfe else float(self.generated_tokens)

    def to_dict(self) -> dict:
        out = asdict(replace(self, engine_stats=FoldStats()))
        out["engine_stats"] = self.engine_stats.to_dict()
        out["tokens_per_second"] = self.tokens_per_second
        out["tokens_per_forward"] = self.tokens_per_forward
        return out


class Drafter(Protocol):
    lookahead: bool  # also draft the next block's first state in the cache-writing forward (boundary drafts)

    def draft(
        self,
        logits: torch.Tensor,  # [N, V] the logits that produced x0
        x0: torch.Tensor,  # [N]
        gen_start: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns ``(states [K, N], parents [K])`` with row 0 = ``x0`` and ``parents[0] = -1``."""
        ...


class StepObserver(Protocol):
    """Sees the vanilla trajectory (used by calibration). A ``step`` whose ``next_state`` equals the current state
    is no transition: it only brings newer logits to draft the next one from (a pass that unmasked nothing, or
    Dream's boundary forward)."""

    def block_start(self, state: torch.Tensor, gen_start: int) -> None: ...

    def step(self, logits: torch.Tensor, next_state: torch.Tensor) -> None: ...


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


def lookahead_supported(net: Any, family: str, block_size: int) -> str | None:
    """Why boundary drafts cannot run for this model and block size (None when they can)."""
    if not get_family(family).boundary_drafts:
        return "boundary drafts need a Fast-dLLM-v2-family model (shifted logits, bidirectional block commit)"
    if block_size != net.cfg.block_size:
        return f"boundary drafts need the model's block size {net.cfg.block_size}, got {block_size}"
    return None


def check_prompt(model: LoadedModel, prompt_ids: list[int] | torch.Tensor, cfg: DecodeConfig) -> torch.Tensor:
    """The prompt as a ``[T]`` long tensor on the model's device; ValueError naming what is wrong with it."""
    prompt = torch.as_tensor(prompt_ids, dtype=torch.long, device=model.net.device).flatten()
    if prompt.numel() == 0:
        raise ValueError("empty prompt")
    n, mask_id = cfg.block_size, model.mask_id
    limit = model.config.max_position_embeddings
    if prompt.numel() + cfg.max_new_tokens + n > limit:
        raise ValueError(
            f"prompt ({prompt.numel()} tokens) + max_new_tokens ({cfg.max_new_tokens}) + one block ({n}) exceeds "
            f"the model's position limit {limit}"
        )
    if bool((prompt == mask_id).any()):
        raise ValueError(f"the prompt contains the mask token id {mask_id}")
    top, low, vocab = int(prompt.max()), int(prompt.min()), model.config.vocab_size
    if top >= vocab:
        raise ValueError(f"the prompt has token id {top}, past the vocabulary ({vocab})")
    if low < 0:
        raise ValueError(f"the prompt has a negative token id {low}")
    return prompt


def cache_rows_needed(prompt_len: int, cfg: DecodeConfig) -> int:
    """Cache rows one request can use: its prompt, its generation, and the blocks a commit may write past it."""
    return prompt_len + cfg.max_new_tokens + 2 * cfg.block_size


class NonFiniteLogits(ValueError):
    """A pass produced NaN or infinite logits (broken weights, or an overflow in the chosen dtype)."""


class QuotaShort(ValueError):
    """A quota rule's pass found fewer masks than its quota, where the reference would rewrite decoded positions
    (:func:`~specfold.decoding.unmasking.quota_short`)."""


def check_quota_rule(rule: UnmaskRule, block_size: int, gen_start: int | None = None) -> None:
    """Refuse, before decoding, a quota schedule under which the reference (SDAR's top-k over the whole block)
    rewrites decoded positions: ``low_confidence_dynamic`` with fewer steps than the block size (a pass that
    unmasks more than its quota leaves a later one short), and ``low_confidence_static`` whose first block holds a
    prompt tail of ``gen_start`` tokens that the schedule's quotas overrun (fewer masks than a pass's quota)."""
    if not rule.has_quota or rule.max_steps(block_size) >= block_size:
        return
    steps = rule.max_steps(block_size)
    if rule.kind == "quota_dynamic":
        raise ValueError(
            f"steps {steps} < block size {block_size} with low_confidence_dynamic: the reference's top-k then rewrites "
            "decoded positions (after a pass above its quota); use steps >= block size or low_confidence_static"
        )
    left = block_size - (gen_start or 0)
    for s in range(steps):
        q = rule.quota(block_size, s)
        if 0 < left < q:
            raise ValueError(
                f"a prompt tail of {gen_start} tokens in the first block of {block_size} with steps {steps}: pass {s} "
                f"would have {left} masks for a quota of {q}, and the reference's top-k rewrites prompt tokens then; "
                "use steps >= block size or a prompt of whole blocks"
            )
        left -= min(q, left)


@dataclass
class PassOutcome:
    """What one verification pass did to a block: the new state, rule applications, accepted drafts, the stop
    position (or None) and the logits that produced the new state ``[N, V]``."""

    block: torch.Tensor  # [N]
    steps: int
    accepted: int
    stop_at: int | None
    logits: torch.Tensor


def apply_pass(
    logits: torch.Tensor,  # [K, N, V] position logits of the verified states
    states: torch.Tensor,  # [K, N] row 0 = the current state
    block: torch.Tensor,  # [N]
    gen_start: int,
    cfg: DecodeConfig,
    mask_id: int,
    stop_id: StopIds,
    rule: UnmaskRule,
    budget: int,
    observer: StepObserver | None = None,
    step0: int = 0,
) -> PassOutcome:
    """Apply the rule to row 0's logits and, while the next state equals a verified state exactly, continue from
    that row's logits (an accepted draft): the vanilla trajectory, several steps per pass, at most ``budget``.
    ``step0``: rule applications the block already had (a quota rule's pass index)."""
    row = steps = accepted = 0
    while True:
        row_logits = logits[row]
        short = quota_short(block, mask_id, rule, step0 + steps)
        block, conf = rule_step(row_logits, block, mask_id, cfg.small_block_size, cfg.threshold, rule, step0 + steps)
        steps += 1
        # NOTE: one host read for all three: does the block still hold a mask, were these logits finite, and did a
        # quota rule's pass have fewer masks than its quota
        masked, finite, short = torch.stack([(block == mask_id).any(), torch.isfinite(conf).all(), short]).tolist()
        if not finite:
            raise NonFiniteLogits("the model produced non-finite logits")
        if short:
            raise QuotaShort(
                f"pass {step0 + steps - 1} of a block has fewer masks left than its quota "
                f"{rule.quota(block.shape[-1], step0 + steps - 1)} (steps {rule.steps} < block size "
                f"{block.shape[-1]}): the reference's top-k would rewrite decoded positions here; use more steps"
            )
        if observer is not None:
            observer.step(row_logits, block)
        stop_at = stop_reached(block, gen_start, mask_id, stop_id)
        if stop_at is not None or steps >= budget or not masked or states.shape[0] == 1:
            break
        match = (states == block).all(dim=-1).nonzero()
        if match.numel() == 0:
            break
        row = int(match[0, 0])  # an accepted draft: its logits are the model's for this state
        accepted += 1
    return PassOutcome(block, steps, accepted, stop_at, row_logits)


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
    observer: StepObserver | None = None
    generated: list[int] = field(default_factory=list)
    steps_per_block: list[int] = field(default_factory=list)
    steps: int = 0  # rule applications in the current block
    nfe_denoise: int = 0
    nfe_cache: int = 0
    accepted: int = 0
    boundary: int = 0
    capped: int = 0
    engine_stats: FoldStats = field(default_factory=FoldStats)
    ctx_logits: torch.Tensor | None = None  # [N, V] the logits that produced the block (None at a block start)
    emitted: int = 0
    stop_at: int | None = None
    rule: UnmaskRule | None = None  # the request's rule (a bidirectional family's depends on its generation length)
    prompt: torch.Tensor | None = None  # [T] (bidirectional families: the window's rows before the generation)
    sequence: SequenceProtocol | None = None  # bidirectional families only
    passes: int = 0  # passes over the current block after its boundary forward (bidirectional families)


class Decoder:
    """A continuous batch of at most ``max_batch`` requests (``submit``, then ``step`` until ``idle``).

    ``capacity``: cache rows per slot (default: the model's position limit plus the two blocks a boundary draft's
    commit writes past a request's end; :func:`decode_requests` sizes it to its requests)."""

    def __init__(
        self, model: LoadedModel, cfg: DecodeConfig, method: Any = None, max_batch: int = 8,
        capacity: int | None = None,
    ) -> None:
        cfg.validate()
        if max_batch <= 0:
            raise ValueError(f"max_batch must be positive, got {max_batch}")
        self.model, self.cfg, self.max_batch = model, cfg, max_batch
        net, c = model.net, model.config
        self.family: FamilySpec = family_of(c)
        self.bidirectional = self.family.bidirectional
        if cfg.cache is not None and not self.bidirectional:
            raise ValueError(f"--cache applies to the fully bidirectional families (LLaDA, Dream), not "
                             f"{self.family.name} (its blocks are cached as they finish)")
        if self.bidirectional:
            self.rule = sequence_protocol(self.family, cfg).rule
        else:
            self.rule = self.family.rule.with_options(cfg.strategy, cfg.steps)
        check_quota_rule(self.rule, cfg.block_size)
        self.verifier = getattr(method, "verifier", None) or DenseVerifier(net)
        self.drafter = getattr(method, "drafter", None)
        self.lookahead = self.drafter is not None and getattr(self.drafter, "lookahead", False)
        if self.lookahead and (why := lookahead_supported(net, c.family, cfg.block_size)) is not None:
            raise ValueError(why)
        rows = capacity or c.max_position_embeddings + 2 * cfg.block_size
        self.cache = BatchCache(c.num_layers, max_batch, c.num_kv_heads, c.head_dim, rows, net.dtype, net.device)
        self.free = list(range(max_batch))
        self.waiting: list[tuple[Hashable, torch.Tensor, DecodeConfig, StepObserver | None]] = []
        self.active: dict[Hashable, _Request] = {}

    @property
    def idle(self) -> bool:
        return not self.active and not self.waiting

    def submit(self, request: BatchRequest, observer: StepObserver | None = None) -> None:
        cfg = self.cfg if request.max_new_tokens is None else replace(self.cfg, max_new_tokens=request.max_new_tokens)
        cfg.validate()
        if request.request_id in self.active or any(w[0] == request.request_id for w in self.waiting):
            raise ValueError(f"request id {request.request_id!r} is already in the batch")
        prompt = check_prompt(self.model, request.prompt_ids, cfg)
        if self.bidirectional:
            sequence_protocol(self.family, cfg)  # refuses what the references do not define
        else:
            check_quota_rule(self.rule, cfg.block_size, prompt.numel() % cfg.block_size)
        if cache_rows_needed(prompt.numel(), cfg) > self.cache.capacity:
            raise ValueError(
                f"prompt ({prompt.numel()} tokens) + max_new_tokens ({cfg.max_new_tokens}) needs "
                f"{cache_rows_needed(prompt.numel(), cfg)} cache rows; this decoder holds {self.cache.capacity}"
            )
        self.waiting.append((request.request_id, prompt, cfg, observer))

    def cancel(self, request_id: Hashable) -> None:
        self.waiting = [w for w in self.waiting if w[0] != request_id]
        req = self.active.pop(request_id, None)
        if req is not None:
            self._release(req)

    def _release(self, req: _Request) -> None:
        """Free the request's slot; the request in the highest slot moves into it (one copy of its cache), so the
        active requests keep slots ``0 .. R-1`` and every pass reads the prefixes as one view."""
        hole = req.slot
        last = max(self.active.values(), key=lambda r: r.slot, default=None)
        if last is not None and last.slot > hole:
            src, dst = self.cache.slot(last.slot), self.cache.slot(hole)
            length = src.length
            dst.k[:, :, :length] = src.k[:, :, :length]
            dst.v[:, :, :length] = src.v[:, :, :length]
            dst.length, dst.window_start = length, src.window_start
            hole, last.slot = last.slot, hole
        self.cache.reset(hole)
        self.free.append(hole)
        self.free.sort()

    @torch.no_grad()
    def step(self) -> list[BatchEvent]:
        events: list[BatchEvent] = []
        admitted = [self._admit(*self.waiting.pop(0)) for _ in range(min(len(self.waiting), len(self.free)))]
        settle = self._settle_sequence if self.bidirectional else self._settle
        settle(admitted, events)
        reqs = sorted(self.active.values(), key=lambda r: r.slot)
        if reqs:
            drafts = [self._draft(req) for req in reqs]
            for req, (states, _), (logits, stats) in zip(reqs, drafts, self._verify(reqs, drafts), strict=True):
                req.nfe_denoise += 1
                req.passes += 1
                req.engine_stats = req.engine_stats + stats
                self._apply(req, logits, states)
            settle(reqs, events)
        return events

    def _admit(
        self, rid: Hashable, prompt: torch.Tensor, cfg: DecodeConfig, observer: StepObserver | None
    ) -> _Request:
        """Prefill one request into a free slot and set up its first block."""
        net = self.model.net
        if self.bidirectional:
            return self._admit_sequence(rid, prompt, cfg, observer)
        slot = self.free.pop(0)
        t_pre = time.perf_counter()
        block, gen_start, forwards = self.family.start(
            net, prompt, self.cache.slot(slot), cfg.block_size, self.model.mask_id, cfg.prefill_chunk
        )
        _sync(net.device)
        now = time.perf_counter()
        req = _Request(rid, cfg, slot, block, gen_start, forwards, now - t_pre, now, observer, rule=self.rule)
        self.active[rid] = req
        if observer is not None:
            observer.block_start(block, gen_start)
        return req

    def _admit_sequence(
        self, rid: Hashable, prompt: torch.Tensor, cfg: DecodeConfig, observer: StepObserver | None
    ) -> _Request:
        """A bidirectional family's request: no prefill; its first block starts (with a boundary forward under a
        cache, part of the decode time)."""
        slot = self.free.pop(0)
        self.cache.reset(slot)
        proto = sequence_protocol(self.family, cfg)
        block = torch.full((cfg.block_size,), self.model.mask_id, dtype=torch.long, device=prompt.device)
        now = time.perf_counter()
        req = _Request(rid, cfg, slot, block, 0, 0, 0.0, now, observer, rule=proto.rule, prompt=prompt,
                       sequence=proto)
        self.active[rid] = req
        self._start_block(req)
        return req

    def _start_block(self, req: _Request) -> None:
        """A bidirectional family's next block: all masks; under a cache, the boundary forward refills the slot and
        commits from its logits (the rule's first application, or the block's first token)."""
        n, mask_id, proto = req.cfg.block_size, self.model.mask_id, req.sequence
        req.block = torch.full_like(req.block, mask_id)
        req.steps = req.passes = 0
        req.ctx_logits = None
        if not proto.cached:
            if req.observer is not None:
                req.observer.block_start(req.block, 0)
            return
        done = len(req.generated)
        seq = torch.cat([req.prompt, torch.tensor(req.generated, dtype=torch.long, device=req.block.device),
                         torch.full((req.cfg.max_new_tokens - done,), mask_id, dtype=torch.long,
                                    device=req.block.device)])
        start = req.prompt.numel() + done
        logits = boundary_forward(self.model.net, self.cache.slot(req.slot), seq, start, n, proto.cache)  # [N, V]
        req.nfe_cache += 1
        if proto.boundary_first:
            req.block[0] = logits[0].argmax()
            req.ctx_logits = logits
            if req.observer is not None:
                req.observer.block_start(req.block, 0)
                req.observer.step(logits, req.block)  # no transition: the logits the first pass is drafted from
        else:
            if req.observer is not None:
                req.observer.block_start(req.block, 0)
            self._apply(req, logits[None], req.block[None])

    def _draft(self, req: _Request) -> tuple[torch.Tensor, torch.Tensor]:
        """The request's branch states ``[K, N]`` and parents ``[K]`` for the next pass (just its state at a block
        start or without a drafter)."""
        if self.drafter is not None and req.ctx_logits is not None:
            return self.drafter.draft(req.ctx_logits, req.block, req.gen_start)
        return req.block[None], torch.full((1,), -1, dtype=torch.long, device=req.block.device)

    def _verify(
        self, reqs: list[_Request], drafts: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> list[tuple[torch.Tensor, FoldStats]]:
        """One verification pass over every request's branches: per request, logits ``[K_r, N, V]`` and stats."""
        dual = self.bidirectional and all(r.sequence.cache == "dual" for r in reqs)
        if self.bidirectional and (len(reqs) == 1 or not dual):
            # NOTE: without the dual cache a window's rows differ in number between requests (prompt and suffix
            # lengths), and every row sees every row: each request runs its own pass.
            return [self._verify_window(req, states, parents) for req, (states, parents) in zip(reqs, drafts,
                                                                                                strict=True)]
        if len(reqs) == 1:
            # NOTE: one request runs the single-request pass over its slot's cache (no ragged masking or padding).
            (states, parents), req = drafts[0], reqs[0]
            result = self.verifier.verify(self.cache.slot(req.slot), states, parents)
            return [(result.logits, result.stats)]
        n = self.cfg.block_size
        k = max(st.shape[0] for st, _ in drafts)
        states = torch.stack([torch.cat([st, st[:1].expand(k - st.shape[0], n)]) for st, _ in drafts])
        parents = torch.stack([torch.cat([par, par.new_zeros(k - par.shape[0])]) for _, par in drafts])
        slots, lengths = self._slots(reqs)
        # the dual cache holds the suffix after the prefix: each block starts at its window start, before the end
        starts = torch.tensor([self.cache.slot(r.slot).start for r in reqs], dtype=torch.long) if dual else None
        batch = BatchBranches(self.cache, slots, lengths, states, parents, [st.shape[0] for st, _ in drafts], starts)
        result = self.verifier.verify_batch(batch)  # states [R, K, N], parents [R, K]
        if dual:  # the window is the block: every draft row is a block row
            return [(logits, replace(st, block_draft_triples=st.draft_triples, block_folded_triples=st.folded_triples))
                    for logits, st in zip(result.logits, result.stats, strict=True)]
        return list(zip(result.logits, result.stats, strict=True))

    def _verify_window(
        self, req: _Request, states: torch.Tensor, parents: torch.Tensor
    ) -> tuple[torch.Tensor, FoldStats]:
        """A bidirectional family's pass: branch block states ``[K, N]`` inside the request's window, over its cache
        slot; the block rows' logits ``[K, N, V]``."""
        n = req.cfg.block_size
        left, right = window_parts(req.prompt, req.generated, req.cfg.max_new_tokens, n, self.model.mask_id,
                                   req.sequence.cache)
        k = states.shape[0]
        window = torch.cat([left.expand(k, -1), states, right.expand(k, -1)], dim=1)  # [K, W]
        rows = slice(left.numel(), left.numel() + n)
        result = self.verifier.verify(self.cache.slot(req.slot), window, parents, rows=rows)
        return result.logits, result.stats

    def _apply(self, req: _Request, logits: torch.Tensor, states: torch.Tensor) -> None:
        """Apply a pass's logits ``[K, N, V]`` (over branch states ``[K, N]``) to the request's block."""
        budget = req.rule.max_steps(req.cfg.block_size) - req.steps
        try:
            out = apply_pass(
                logits, states, req.block, req.gen_start, req.cfg, self.model.mask_id, self.model.stop_ids,
                req.rule, budget, req.observer, req.steps,
            )
        except NonFiniteLogits:
            raise NonFiniteLogits(
                f"non-finite logits from {self.model.path} in {str(self.model.net.dtype).removeprefix('torch.')} "
                f"(request {req.request_id!r}): the weights hold NaN/inf or the dtype overflows; decoding stopped"
            ) from None
        req.block, req.ctx_logits = out.block, out.logits
        req.steps += out.steps
        req.accepted += out.accepted

    def _slots(self, reqs: list[_Request]) -> tuple[torch.Tensor, torch.Tensor]:
        """Slots and cached lengths ``[R]`` (host tensors: a pass reads them without a device sync)."""
        slots = torch.tensor([r.slot for r in reqs], dtype=torch.long)
        lengths = torch.tensor([self.cache.slot(r.slot).length for r in reqs], dtype=torch.long)
        return slots, lengths

    def _settle(self, reqs: list[_Request], events: list[BatchEvent]) -> None:
        """After a rule application: finish blocks whose stop, last mask or step cap was reached, write them to the
        caches (one batched forward), seed the next blocks, and repeat for blocks finished at once; emit events."""
        n, mask_id, stop_id = self.cfg.block_size, self.model.mask_id, self.model.stop_ids
        pending = reqs
        while pending:
            to_write = []
            for req in pending:
                req.stop_at = stop_reached(req.block, req.gen_start, mask_id, stop_id)
                masked = bool((req.block == mask_id).any())
                capped = req.steps >= req.rule.max_steps(n)
                if req.stop_at is None and masked and not capped:
                    new = self._new_tokens(req)
                    if new:
                        events.append(BatchEvent(req.request_id, new))
                    continue
                if not self._close_block(req, req.gen_start, masked, events):
                    to_write.append(req)
            guessing = [r for r in to_write if self.lookahead and r.ctx_logits is not None]
            plain = [r for r in to_write if not (self.lookahead and r.ctx_logits is not None)]
            for group, guess in ((plain, False), (guessing, True)):
                if group:
                    self._commit(group, guess)
            pending = to_write

    def _settle_sequence(self, reqs: list[_Request], events: list[BatchEvent]) -> None:
        """:meth:`_settle` for bidirectional families: a block is finished at a stop, or when its scheduled passes
        ran (ML-GSAI), or when it has no mask (or reached the step cap) and, under a cache, had a pass after its
        boundary forward; then the next block starts (:meth:`_start_block`)."""
        n, mask_id, stop_id = self.cfg.block_size, self.model.mask_id, self.model.stop_ids
        for req in reqs:
            proto = req.sequence
            while True:
                req.stop_at = stop_reached(req.block, 0, mask_id, stop_id)
                masked = bool((req.block == mask_id).any())
                capped = req.steps >= req.rule.max_steps(n)
                if proto.every_step:
                    done = capped
                else:
                    done = (not masked or capped) and (req.passes >= 1 or not proto.cached)
                if req.stop_at is None and not done:
                    new = self._new_tokens(req)
                    if new:
                        events.append(BatchEvent(req.request_id, new))
                    break
                if self._close_block(req, 0, masked, events):
                    break
                self._start_block(req)

    def _close_block(self, req: _Request, gen_from: int, masked: bool, events: list[BatchEvent]) -> bool:
        """A block ends (finished, at a stop, or capped with masks left): its generated tokens from ``gen_from`` up to
        the stop join the request's; True when that finishes the request (its event appended)."""
        req.capped += int(req.stop_at is None and masked)
        req.steps_per_block.append(req.steps)
        end = self.cfg.block_size if req.stop_at is None else req.stop_at + 1
        req.generated.extend(req.block[gen_from:end].tolist())
        if req.stop_at is not None or len(req.generated) >= req.cfg.max_new_tokens:
            events.append(self._finish(req))
            return True
        return False

    def _commit(self, reqs: list[_Request], guess: bool) -> None:
        """Write the requests' finished blocks to their caches (one forward) and seed their next blocks; with
        ``guess``, each next block's first rule application is made from the boundary draft's rows where it hit."""
        n, mask_id = self.cfg.block_size, self.model.mask_id
        slots, lengths = self._slots(reqs)
        guesses = torch.stack([r.ctx_logits[0].argmax() for r in reqs]) if guess else None  # [R']
        blocks = torch.stack([r.block for r in reqs])  # [R', N]
        out = commit_blocks(self.model.net, self.family, self.cache, slots, lengths, blocks, mask_id, guesses)
        for req, seed, first in zip(reqs, out.seeds, out.first_logits, strict=True):
            req.nfe_cache += 1
            nxt = seed_block(seed, n, mask_id) if self.family.seeded_blocks else torch.full_like(req.block, mask_id)
            req.block, req.gen_start, req.steps, req.ctx_logits = nxt, 0, 0, None
            if req.observer is not None:
                req.observer.block_start(req.block, 0)
            if first is not None:
                self._apply(req, first[None], req.block[None])
                req.boundary += 1

    def _new_tokens(self, req: _Request) -> list[int]:
        """The request's committed tokens not yet emitted (the generation's contiguous unmasked prefix)."""
        tail = req.block[req.gen_start :]
        masked = (tail == self.model.mask_id).nonzero()
        upto = int(masked[0, 0]) if masked.numel() else tail.numel()
        return self._emit(req, req.generated + tail[:upto].tolist())

    def _emit(self, req: _Request, current: list[int]) -> list[int]:
        stops = stop_ids_tuple(self.model.stop_ids)
        first = next((i for i, t in enumerate(current) if t in stops), None)
        if first is not None:
            current = current[: first + 1]
        current = current[: req.cfg.max_new_tokens]
        new = current[req.emitted :]
        req.emitted = max(req.emitted, len(current))
        return new

    def _finish(self, req: _Request) -> BatchEvent:
        _sync(self.model.net.device)
        seconds = time.perf_counter() - req.t0
        generated = req.generated[: req.cfg.max_new_tokens]
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
            stopped=req.stop_at is not None and any(t in self.model.stop_ids for t in generated),
            accepted_drafts=req.accepted,
            boundary_drafts=req.boundary,
            engine_stats=req.engine_stats,
            prefill_seconds=req.prefill_seconds,
            capped_blocks=req.capped,
        )
        committed = self._emit(req, generated)
        del self.active[req.request_id]
        self._release(req)
        return BatchEvent(req.request_id, committed, result)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_to_completion(decoder: Decoder, count: int) -> list[GenerationResult]:
    """Step ``decoder`` until idle; the results of requests ``0 .. count-1`` in order."""
    results: list[GenerationResult | None] = [None] * count
    while not decoder.idle:
        for event in decoder.step():
            if event.result is not None:
                results[event.request_id] = event.result
    return results  # type: ignore[return-value]


def decode_requests(
    model: LoadedModel,
    prompts: Sequence[Sequence[int] | torch.Tensor],
    cfg: DecodeConfig,
    method: Any = None,
    max_batch: int = 8,
    observers: Sequence[StepObserver | None] | None = None,
) -> list[GenerationResult]:
    """Decode every prompt through one :class:`Decoder` of at most ``max_batch`` requests (results in prompt order),
    its cache sized to the longest request."""
    cfg.validate()
    ids = [check_prompt(model, p, cfg) for p in prompts]
    capacity = max((cache_rows_needed(p.numel(), cfg) for p in ids), default=cfg.block_size)
    decoder = Decoder(model, cfg, method, min(max_batch, max(len(ids), 1)), capacity=capacity)
    for i, prompt in enumerate(ids):
        decoder.submit(BatchRequest(i, prompt), None if observers is None else observers[i])
    return run_to_completion(decoder, len(ids))
