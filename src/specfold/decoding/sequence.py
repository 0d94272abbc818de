"""Whole-sequence decoding of the fully bidirectional families (LLaDA, Dream; SPEC §2 "More families"): their
reference protocols as one :class:`SequenceProtocol` the decoding core (:mod:`specfold.decoding.core`) runs.

Dims: ``T`` prompt length, ``G`` generation length, ``L = T + G``, ``N`` block length, ``W`` window rows, ``V``
vocabulary.

The generation is ``G`` masks after the prompt, decoded in semi-autoregressive blocks of ``N``. Every pass is a
*window* of rows over a cached context (the cache slot's :attr:`~specfold.model.cache.PrefixCache.start` is the
window's first absolute position):

* ``cache="none"`` — empty cache; the window is the whole sequence (prompt, finished blocks, the block, the future
  blocks as masks). ML-GSAI's ``generate()`` (``steps``) and Fast-dLLM v1's ``generate`` (``threshold``).
* ``cache="prefix"`` — at each block boundary one full forward of the whole sequence stores the prefix's K/V (an
  NFE); later passes run the block **and the masked suffix** over it (Fast-dLLM ``generate_with_prefix_cache``).
* ``cache="dual"`` — the boundary forward stores the prefix's **and the suffix's** K/V, frozen for the block
  (keys after the prefix in the cache, with their own positions: attention is a sum over keys); later passes run
  the block only (``generate_with_dual_cache``).

The boundary forward's logits commit tokens: LLaDA applies the rule to the block (the block's first rule
application; a block it fills still gets one cached pass, as upstream's loop tests only after a pass); Dream commits
exactly the block's first token from the shifted row before the block, unconditionally (Fast-dLLM's block mode for
the shifted family: that row's context is the finished prefix). The rule reads only the block's rows of a window.

Rules: ``threshold`` — the block's most confident masked position plus every one with ``conf >= τ`` (fp64 for
Fast-dLLM's LLaDA, the logits' dtype for Dream, from the family's rule). ``steps`` counts the passes of the whole
generation, as both references do: ``steps // (G // N)`` per block, pass ``s`` unmasking the top ``quota(N, s)``
(``get_num_transfer_tokens``). Without a cache that is ML-GSAI's ``generate()`` — confidence in the logits' dtype and
**every** scheduled pass run, a zero quota included —; with a cache Fast-dLLM's (fp64; a full block ends at once).
Dream has no steps mode here (its reference's is an entropy schedule) and no uncached mode (a blockless algorithm).

Deliberate differences, stated: upstream never stops early (the text is cut at a stop id afterwards); ours stops
once a stop id stands with no mask before it — the same tokens up to it, fewer passes. Where upstream hangs or
overruns its schedule (the argmax is the mask id, so a position stays masked), a block takes at most
``rule.max_steps(N)`` rule applications and ends as it is, counted in ``capped_blocks``. ``G`` must be a multiple of
``N`` and ``steps`` of ``G // N`` (upstream asserts both).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from specfold.config import DecodeConfig
from specfold.model.cache import PrefixCache
from specfold.model.families.base import FamilySpec, UnmaskRule
from specfold.model.transformer import DLLM

DEFAULT_CACHE = "dual"  # Fast-dLLM v1's fastest mode


@dataclass(frozen=True)
class SequenceProtocol:
    """How one request of a fully bidirectional family decodes: its cache mode, its per-pass rule (per block), what
    the boundary forward commits and whether every scheduled pass runs."""

    cache: str  # "none" | "prefix" | "dual"
    rule: UnmaskRule
    boundary_first: bool = False  # the boundary forward commits the block's first token only (Dream), else the rule
    every_step: bool = False  # ML-GSAI: a block takes all its scheduled passes (zero quotas included)

    @property
    def cached(self) -> bool:
        return self.cache != "none"


def sequence_protocol(family: FamilySpec, cfg: DecodeConfig, gen_length: int | None = None) -> SequenceProtocol:
    """The protocol of a decode of ``gen_length`` tokens (default ``cfg.max_new_tokens``); ValueError (one line)
    for what the references do not define."""
    g, n = cfg.max_new_tokens if gen_length is None else gen_length, cfg.block_size
    cache = cfg.cache or DEFAULT_CACHE
    base = family.rule
    first = family.shifted_logits  # Fast-dLLM v1's Dream (shifted) commits the block's first token at the boundary
    if g % n:
        raise ValueError(f"max_new_tokens {g} is not a multiple of the block size {n} (the references assert it)")
    if cfg.strategy is not None:
        raise ValueError("--strategy applies to SDAR's quota rules, not this family (use --steps or --threshold)")
    if cfg.small_block_size is not None:
        raise ValueError(f"{family.name} has no small blocks: every mask of the block is eligible")
    if first and cache == "none":
        raise ValueError(f"{family.name} without a cache is a different, blockless algorithm: use --cache prefix|dual")
    if cfg.steps is None:
        return SequenceProtocol(cache, base, first)
    if first:
        raise ValueError(f"{family.name}'s steps mode (an entropy schedule) is not implemented: use --threshold")
    blocks = g // n
    if cfg.steps % blocks:
        raise ValueError(f"steps {cfg.steps} is not a multiple of the {blocks} blocks of max_new_tokens {g} "
                         f"(block size {n}); the references assert it")
    ml_gsai = cache == "none"  # ML-GSAI's generate(): the softmax in the logits' dtype, every pass run
    rule = replace(base, kind="quota_static", steps=cfg.steps // blocks,
                   confidence_dtype="model" if ml_gsai else base.confidence_dtype)
    return SequenceProtocol(cache, rule, every_step=ml_gsai)  # (LLaDA: unshifted, the rule at the boundary)


def window_parts(
    prompt: torch.Tensor,  # [T]
    generated: list[int],
    gen_length: int,
    n: int,
    mask_id: int,
    cache: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The window's rows before the block (``[W_left]``: prompt and finished blocks without a cache, else none) and
    after it (``[W_right]``: the future blocks' masks, except under the dual cache, which holds them)."""
    dev = prompt.device
    left = torch.cat([prompt, torch.tensor(generated, dtype=torch.long, device=dev)]) if cache == "none" else \
        prompt.new_zeros(0)
    rest = gen_length - len(generated) - n
    right = torch.full((rest if cache != "dual" else 0,), mask_id, dtype=torch.long, device=dev)
    return left, right


@torch.no_grad()
def boundary_forward(
    net: DLLM,
    cache: PrefixCache,
    seq: torch.Tensor,  # [L] the whole sequence: prompt, finished blocks, the block, the future blocks' masks
    start: int,  # the block's first position
    n: int,
    mode: str,  # "prefix" | "dual"
) -> torch.Tensor:
    """Fast-dLLM v1's boundary: one full bidirectional forward of ``seq`` from position 0 that refills ``cache``
    with the prefix's K/V (and, ``dual``, the suffix's after them) and sets the window start to the block. Returns
    the block's position logits ``[N, V]`` (shifted families: position ``i`` from row ``i - 1``)."""
    total = seq.numel()
    rows = torch.arange(start, device=seq.device)
    if mode == "dual":
        rows = torch.cat([rows, torch.arange(start + n, total, device=seq.device)])
    cache.length, cache.window_start = 0, None
    first = max(start - 1, 0)
    raw = net(seq[None], cache, mask="bidirectional", write_cache=True, cache_rows=rows,
              logit_rows=slice(first, start + n))  # [1, N (+1), V]
    cache.window_start = start
    return net.sequence_logits(raw)[0, -n:]
