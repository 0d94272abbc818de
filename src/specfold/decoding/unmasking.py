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
first small block that still has a mask are eligible; without one (Nemotron-Labs-Diffusion, SDAR) every mask is.

Quota rules (SDAR, ``UnmaskRule.kind`` ``quota_dynamic`` / ``quota_static``) take the pass's index within the block
instead of the "single most confident" floor: pass ``s`` unmasks the ``quota(N, s)`` most confident masked
positions (ties to the lowest position), or — dynamic — every masked position strictly above the threshold when
there are at least ``quota`` of them. Upstream's top-k runs over the whole block with ``-inf`` for decoded
positions, so a pass whose quota exceeds the masks left would rewrite decoded positions (in an order top-k leaves
undefined): :func:`quota_short` flags that case and the decoder refuses it rather than differ silently.
"""

from __future__ import annotations

from collections.abc import Sequence

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


def select_quota(
    conf: torch.Tensor, eligible: torch.Tensor, threshold: float, quota: int, dynamic: bool
) -> torch.Tensor:
    """Positions a quota rule unmasks: the ``quota`` most confident eligible positions (ties to the lowest
    position); ``dynamic``: every eligible position with ``conf > threshold`` instead when there are at least
    ``quota`` of them (SDAR's ``low_confidence_dynamic``). Never more positions than are eligible.

    conf: ``[..., N]``; eligible: bool ``[..., N]``. Returns bool ``[..., N]``.
    """
    neg = torch.tensor(float("-inf"), dtype=conf.dtype, device=conf.device)
    masked_conf = torch.where(eligible, conf, neg)
    order = torch.sort(masked_conf, dim=-1, descending=True, stable=True).indices  # stable: lowest position first
    rank = order.argsort(dim=-1)  # each position's place in that order
    chosen = eligible & (rank < quota)
    if dynamic:
        above = eligible & (conf > threshold)
        chosen = torch.where((above.sum(-1, keepdim=True) >= quota), above, chosen)
    return chosen


def quota_short(state: torch.Tensor, mask_id: int, rule: UnmaskRule, step: int) -> torch.Tensor:
    """Whether a quota rule's pass ``step`` has fewer masks left than its quota (but some): upstream's top-k would
    then rewrite decoded positions. state: ``[..., N]``; returns bool ``[...]`` (all False for a threshold rule)."""
    if not rule.has_quota:
        return torch.zeros(state.shape[:-1], dtype=torch.bool, device=state.device)
    left = (state == mask_id).sum(-1)
    return (left > 0) & (left < rule.quota(state.shape[-1], step))


def unmask_step(
    logits: torch.Tensor,  # [..., N, V]
    state: torch.Tensor,  # [..., N]
    mask_id: int,
    small_block_size: int | None,
    threshold: float,
    rule: UnmaskRule = DEFAULT_RULE,
    step: int = 0,
) -> torch.Tensor:
    """One application of the rule (``step``: the pass's index within the block, used by quota rules). Returns the
    next state ``[..., N]`` (a new tensor)."""
    return rule_step(logits, state, mask_id, small_block_size, threshold, rule, step)[0]


def rule_step(
    logits: torch.Tensor,  # [..., N, V]
    state: torch.Tensor,  # [..., N]
    mask_id: int,
    small_block_size: int | None,
    threshold: float,
    rule: UnmaskRule = DEFAULT_RULE,
    step: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`unmask_step` that also returns the confidences it used ``[..., N]`` (non-finite ones flag bad logits)."""
    conf, top = confidence(logits, rule)
    eligible = eligible_mask(state, mask_id, small_block_size)
    if rule.has_quota:
        quota = rule.quota(state.shape[-1], step)
        chosen = select_quota(conf, eligible, threshold, quota, rule.kind == "quota_dynamic")
    else:
        chosen = select_unmask(conf, eligible, threshold, rule.inclusive)
    return torch.where(chosen, top, state), conf


StopIds = int | Sequence[int] | None  # one stop id, several (SDAR), or none


def stop_ids_tuple(stop: StopIds) -> tuple[int, ...]:
    if stop is None:
        return ()
    return (int(stop),) if isinstance(stop, int) else tuple(int(s) for s in stop)


def stop_reached(state: torch.Tensor, gen_start: int, mask_id: int, stop_id: StopIds) -> int | None:
    """Index (in the block) of a stop token (any of ``stop_id``) unmasked with no mask before it, if any.

    state: ``[N]``. Only generated positions ``>= gen_start`` count: a prompt tail may hold a stop token of an
    earlier chat turn. Returns the first such index or ``None``.
    """
    stops = stop_ids_tuple(stop_id)
    if not stops:
        return None
    gen = state[gen_start:]
    is_stop = torch.isin(gen, torch.tensor(stops, dtype=gen.dtype, device=gen.device))
    if not bool(is_stop.any()):
        return None
    first_stop = int(is_stop.nonzero()[0, 0])
    if bool((gen[:first_stop] == mask_id).any()):
        return None
    return gen_start + first_stop
