"""The confidence unmasking rule shared by every decoder (SPEC §2).

Dims: ``N`` block length, ``V`` vocabulary, ``...`` any leading batch dims (branches).

A *block state* is a LongTensor ``[N]`` of token ids in which ``mask_id`` marks a masked position.
Confidence of a masked position is the softmax probability of its argmax token, computed in the dtype the family's
reference uses (:class:`~specfold.model.families.base.UnmaskRule`: the logits' own dtype for Fast-dLLM-v2 and NLD,
so in bf16 the threshold compares as a bf16 number). One step unmasks every eligible masked position whose
confidence is ``> threshold`` (``>=`` for an inclusive rule) and, always, the single most confident eligible one.
Ties in confidence go to the lowest position (``torch.argmax`` returns the first maximum), and a tied argmax token
to the lowest id, so the rule is deterministic. The argmax may be the mask token itself (the references do not
exclude it): that position then stays masked.

Eligibility follows the family's protocol: with a small block size ``S`` (Fast-dLLM-v2) only masks inside the
first small block that still has a mask are eligible; without one (Nemotron-Labs-Diffusion) every mask is.
"""

from __future__ import annotations

import torch

from specfold.model.families.base import UnmaskRule

DEFAULT_RULE = UnmaskRule()


def confidence(logits: torch.Tensor, rule: UnmaskRule = DEFAULT_RULE) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-1 probability and token per position.

    logits: ``[..., N, V]``; the softmax runs in the logits' dtype (``rule.confidence_dtype == "model"``) or fp64.
    Returns ``(conf [..., N], top [..., N] long)``.
    """
    work = logits.double() if rule.confidence_dtype == "fp64" else logits
    probs = torch.softmax(work, dim=-1)
    conf, top = probs.max(dim=-1)
    return conf, top


def eligible_mask(state: torch.Tensor, mask_id: int, small_block_size: int | None) -> torch.Tensor:
    """Which positions the rule may unmask now.

    state: ``[..., N]`` token ids. Returns bool ``[..., N]``.
    """
    masked = state == mask_id
    if small_block_size is None:
        return masked
    n = state.shape[-1]
    if n % small_block_size:
        raise ValueError(f"block length {n} is not a multiple of the small block size {small_block_size}")
    sb = torch.arange(n, device=state.device) // small_block_size  # [N] small-block index
    # The first small block holding a mask; rows with no mask get an index past the end (nothing eligible).
    big = n // small_block_size
    first = torch.where(masked, sb.expand_as(state), torch.full_like(state, big)).amin(dim=-1, keepdim=True)
    return masked & (sb == first)


def select_unmask(
    conf: torch.Tensor, eligible: torch.Tensor, threshold: float, inclusive: bool = False
) -> torch.Tensor:
    """Positions the rule unmasks: ``conf > threshold`` (``>=`` when ``inclusive``) plus the single most confident
    eligible position. The comparison runs in ``conf``'s dtype (a bf16 ``conf`` compares with ``threshold`` rounded
    to bf16, as the references' ``x1_p > threshold`` does).

    conf: ``[..., N]``; eligible: bool ``[..., N]``. Returns bool ``[..., N]`` (all False where nothing is eligible).
    """
    neg = torch.tensor(-1.0, dtype=conf.dtype, device=conf.device)
    masked_conf = torch.where(eligible, conf, neg)
    best = masked_conf.argmax(dim=-1, keepdim=True)  # first maximum -> lowest position on ties
    passes = conf >= threshold if inclusive else conf > threshold
    chosen = eligible & passes
    chosen = chosen.scatter(-1, best, True) & eligible
    return chosen


def unmask_step(
    logits: torch.Tensor,  # [..., N, V]
    state: torch.Tensor,  # [..., N]
    mask_id: int,
    small_block_size: int | None,
    threshold: float,
    rule: UnmaskRule = DEFAULT_RULE,
) -> torch.Tensor:
    """One application of the rule. Returns the next state ``[..., N]`` (a new tensor)."""
    return rule_step(logits, state, mask_id, small_block_size, threshold, rule)[0]


def rule_step(
    logits: torch.Tensor,  # [..., N, V]
    state: torch.Tensor,  # [..., N]
    mask_id: int,
    small_block_size: int | None,
    threshold: float,
    rule: UnmaskRule = DEFAULT_RULE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`unmask_step` that also returns the confidences it used ``[..., N]`` (non-finite ones flag bad logits)."""
    conf, top = confidence(logits, rule)
    chosen = select_unmask(conf, eligible_mask(state, mask_id, small_block_size), threshold, rule.inclusive)
    return torch.where(chosen, top, state), conf


def stop_reached(state: torch.Tensor, gen_start: int, mask_id: int, stop_id: int | None) -> int | None:
    """Index (in the block) of a stop token unmasked with no mask before it, if any.

    state: ``[N]``. Only generated positions ``>= gen_start`` count: a prompt tail may hold a stop token of an
    earlier chat turn. Returns the first such index or ``None``.
    """
    if stop_id is None:
        return None
    gen = state[gen_start:]
    is_stop = gen == stop_id
    if not bool(is_stop.any()):
        return None
    first_stop = int(is_stop.nonzero()[0, 0])
    if bool((gen[:first_stop] == mask_id).any()):
        return None
    return gen_start + first_stop
