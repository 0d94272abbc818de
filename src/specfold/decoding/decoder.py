"""Block-wise decoding (SPEC §2) with optional multi-branch speculation (SPEC §3): one loop for every method.

Dims: ``N`` block length, ``V`` vocabulary, ``K`` branches in a verification pass.

The two families differ only in how a generation starts and how a finished block enters the cache; those are
the small strategies in :data:`PROTOCOLS`. Everything else — the unmasking rule, stop detection, draft reuse —
is shared:

* vanilla: every pass verifies just the main state ``X_0``;
* spiffy / specfold: a drafter proposes branch states from the logits that produced ``X_0``; after the pass the
  rule is applied to ``X_0``'s logits and, while the next state equals a verified branch state exactly, that
  branch's logits are used without a forward pass (an accepted draft). The trajectory is the vanilla one.

NFE counts denoising passes and cache-writing/refresh forwards (separately too); prefill is reported apart.
Decode time excludes prefill and tokenisation.

**Boundary drafts** (``drafter.lookahead``, shifted families): the forward that writes a finished block to the cache
also runs the next block's first state ``[ŝ, M, …, M]`` (block-causal over both blocks, only the finished block's
K/V kept), with ``ŝ`` the seed guessed from the last pass's prediction of the token after the block (position 0
of its logits, :meth:`~specfold.model.transformer.DLLM.position_logits`). When the forward's own seed equals ``ŝ``,
those rows are exactly the next block's first denoising pass (the same keys: prefix, finished block, own block),
so that pass is skipped; otherwise nothing but the wider forward is lost. The trajectory is the vanilla one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Protocol

import torch

from specfold.config import DecodeConfig, Family
from specfold.decoding.unmasking import stop_reached, unmask_step
from specfold.engine.base import Verifier
from specfold.engine.dense import DenseVerifier
from specfold.model.cache import PrefixCache
from specfold.model.loading import LoadedModel
from specfold.model.transformer import DLLM


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
    engine_stats: dict[str, float] = field(default_factory=dict)
    prefill_seconds: float = 0.0  # prefill wall time (not in ``seconds``)

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.seconds if self.seconds > 0 else float("inf")

    @property
    def tokens_per_forward(self) -> float:
        return self.generated_tokens / self.nfe if self.nfe else float(self.generated_tokens)

    def to_dict(self) -> dict:
        out = asdict(self)
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
    """Sees the vanilla trajectory (used by calibration)."""

    def block_start(self, state: torch.Tensor, gen_start: int) -> None: ...

    def step(self, logits: torch.Tensor, next_state: torch.Tensor) -> None: ...


# --------------------------------------------------------------------------------------------------------------
# Family strategies: how a generation starts, and how a finished block enters the prefix cache.


@dataclass(frozen=True)
class BlockProtocol:
    prefill_mask: str  # attention inside the prompt during prefill
    finish_mask: str  # attention inside a finished block when it is written to the cache
    start: Callable[..., tuple[torch.Tensor, int, int]]  # (net, prompt, cache, n, mask_id, chunk=None)


def _seed_block(seed: torch.Tensor, n: int, mask_id: int) -> torch.Tensor:
    block = torch.full((n,), mask_id, dtype=torch.long, device=seed.device)
    block[0] = seed
    return block


def _start_fast_dllm(
    net: DLLM, prompt: torch.Tensor, cache: PrefixCache, n: int, mask_id: int, chunk: int | None = None
):
    """Prefill the block-aligned part of the prompt (block-causal, in chunks); a shorter tail stays fixed in the
    first active block; an aligned prompt seeds the first block with the argmax of the prefill's last row."""
    aligned = (prompt.numel() // n) * n
    forwards = 0
    last_logits = None
    if aligned:
        pre = net.prefill(prompt[:aligned], cache, mask="block_causal", chunk=chunk)
        last_logits, forwards = pre.last_logits, pre.forwards
    tail = prompt[aligned:]
    if tail.numel():
        block = torch.full((n,), mask_id, dtype=torch.long, device=prompt.device)
        block[: tail.numel()] = tail
        return block, tail.numel(), forwards
    return _seed_block(last_logits.argmax(), n, mask_id), 0, forwards


def lookahead_supported(net: DLLM, family: Family, block_size: int) -> str | None:
    """Why boundary drafts cannot run for this model and block size (None when they can)."""
    if not net.cfg.shifted_logits or PROTOCOLS[family].finish_mask != "bidirectional":
        return "boundary drafts need a Fast-dLLM-v2-family model (shifted logits, bidirectional block commit)"
    if block_size != net.cfg.block_size:
        return f"boundary drafts need the model's block size {net.cfg.block_size}, got {block_size}"
    return None


def commit_block(
    net: DLLM,
    finish_mask: str,
    cache: PrefixCache,
    block: torch.Tensor,  # [N] a finished block
    mask_id: int,
    guess: torch.Tensor | None = None,  # [] long: the guessed seed of the next block (a boundary draft)
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Write ``block`` to the cache; returns the next block's seed ``[]`` and, for a ``guess`` that equals it, the
    next block's first-pass position logits ``[N, V]`` (else None; see the module docstring)."""
    n = block.shape[0]
    if guess is None:
        last = net(block[None], cache, mask=finish_mask, write_cache=True, logit_rows=slice(-1, None))
        return last[0, -1].argmax(), None
    both = torch.cat([block, _seed_block(guess, n, mask_id)])[None]  # [1, 2N]
    raw = net(both, cache, mask="block_causal", write_cache=True, cache_rows=n, logit_rows=slice(n - 1, None))
    seed = raw[0, 0].argmax()  # [1, N+1, V]: row N-1 seeds the next block, rows N.. are its first pass
    if bool(seed != guess):
        return seed, None
    return seed, net.position_logits(raw[:, 1:])[0]


def _start_nld(net: DLLM, prompt: torch.Tensor, cache: PrefixCache, n: int, mask_id: int, chunk: int | None = None):
    """Causal prefill of the whole prompt (in chunks); the argmax of its last row seeds ``[seed, M × (N-1)]``."""
    pre = net.prefill(prompt, cache, mask="causal", chunk=chunk)
    return _seed_block(pre.last_logits.argmax(), n, mask_id), 0, pre.forwards


PROTOCOLS: dict[Family, BlockProtocol] = {
    Family.FAST_DLLM_V2: BlockProtocol("block_causal", "bidirectional", _start_fast_dllm),
    Family.NLD: BlockProtocol("causal", "causal", _start_nld),
}


# --------------------------------------------------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
    stop_id: int | None,
    observer: StepObserver | None = None,
) -> PassOutcome:
    """Apply the rule to row 0's logits and, while the next state equals a verified state exactly, continue from
    that row's logits (an accepted draft): the vanilla trajectory, several steps per pass."""
    row = steps = accepted = 0
    while True:
        row_logits = logits[row]
        block = unmask_step(row_logits, block, mask_id, cfg.small_block_size, cfg.threshold)
        steps += 1
        if observer is not None:
            observer.step(row_logits, block)
        stop_at = stop_reached(block, gen_start, mask_id, stop_id)
        if stop_at is not None or not bool((block == mask_id).any()) or states.shape[0] == 1:
            break
        match = (states == block).all(dim=-1).nonzero()
        if match.numel() == 0:
            break
        row = int(match[0, 0])  # an accepted draft: its logits are the model's for this state
        accepted += 1
    return PassOutcome(block, steps, accepted, stop_at, row_logits)


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


@torch.no_grad()
def decode(
    model: LoadedModel,
    prompt_ids: list[int] | torch.Tensor,
    cfg: DecodeConfig,
    verifier: Verifier | None = None,
    drafter: Drafter | None = None,
    observer: StepObserver | None = None,
) -> GenerationResult:
    """Decode one prompt. ``drafter=None`` is vanilla decoding; the verifier defaults to dense."""
    cfg.validate()
    net = model.net
    prompt = check_prompt(model, prompt_ids, cfg)
    n, mask_id, stop_id = cfg.block_size, model.mask_id, model.stop_id
    verifier = verifier or DenseVerifier(net)
    proto = PROTOCOLS[model.config.family]
    cache = net.new_cache(prompt.numel() + cfg.max_new_tokens + 2 * n)

    t_pre = time.perf_counter()
    block, gen_start, prefill_forwards = proto.start(net, prompt, cache, n, mask_id, chunk=cfg.prefill_chunk)
    _sync(net.device)
    t0 = time.perf_counter()
    generated: list[int] = []
    steps_per_block: list[int] = []
    nfe_denoise = nfe_cache = accepted = 0
    engine_stats: dict[str, float] = {}
    no_parent = torch.tensor([-1], device=net.device)
    lookahead = drafter is not None and getattr(drafter, "lookahead", False)
    if lookahead and (why := lookahead_supported(net, model.config.family, n)) is not None:
        raise ValueError(why)
    boundary = 0
    first = None  # [N, V] the block's first-pass logits, when a boundary draft provided them
    while True:
        if observer is not None:
            observer.block_start(block, gen_start)
        stop_at = stop_reached(block, gen_start, mask_id, stop_id)
        steps = 0
        ctx_logits = None  # the logits that produced the current state (none at a block's first step)
        if first is not None:  # the boundary draft was the next state: its pass is done
            out = apply_pass(first[None], block[None], block, gen_start, cfg, mask_id, stop_id, observer)
            block, stop_at, ctx_logits = out.block, out.stop_at, out.logits
            steps += out.steps
            boundary += 1
        while stop_at is None and bool((block == mask_id).any()):
            if drafter is not None and ctx_logits is not None:
                states, parents = drafter.draft(ctx_logits, block, gen_start)
            else:
                states, parents = block[None], no_parent
            result = verifier.verify(cache, states, parents)
            nfe_denoise += 1
            for key, value in result.stats.items():
                engine_stats[key] = engine_stats.get(key, 0.0) + value
            out = apply_pass(result.logits, states, block, gen_start, cfg, mask_id, stop_id, observer)
            block, stop_at, ctx_logits = out.block, out.stop_at, out.logits
            steps += out.steps
            accepted += out.accepted
        steps_per_block.append(steps)
        end = n if stop_at is None else stop_at + 1
        generated.extend(block[gen_start:end].tolist())
        if stop_at is not None or len(generated) >= cfg.max_new_tokens:
            break
        # The finished block enters the cache; its last row seeds the next block.
        guess = ctx_logits[0].argmax() if lookahead and ctx_logits is not None else None
        seed, first = commit_block(net, proto.finish_mask, cache, block, mask_id, guess)
        nfe_cache += 1
        block, gen_start = _seed_block(seed, n, mask_id), 0
    _sync(net.device)
    seconds = time.perf_counter() - t0
    generated = generated[: cfg.max_new_tokens]
    stopped = stop_at is not None and stop_id in generated
    return GenerationResult(
        token_ids=generated,
        text=None,
        nfe=nfe_denoise + nfe_cache,
        nfe_denoise=nfe_denoise,
        nfe_cache=nfe_cache,
        prefill_forwards=prefill_forwards,
        steps_per_block=steps_per_block,
        seconds=seconds,
        generated_tokens=len(generated),
        stopped=stopped,
        accepted_drafts=accepted,
        boundary_drafts=boundary,
        engine_stats=engine_stats,
        prefill_seconds=t0 - t_pre,
    )
