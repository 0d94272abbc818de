"""SDAR (JetAstra: SDAR-1.7B / 4B / 8B-Chat; ``model_type`` ``sdar``): Qwen3 layers — per-head RMSNorm ``q_norm`` /
``k_norm`` on q and k before RoPE, no q/k/v bias, untied ``lm_head`` — with **unshifted** logits.

Protocol (its ``generate.py``, ``block_diffusion_generate``): attention is block-causal (bidirectional inside a
block of the decode's block length ``B`` — the config's ``block_size`` by default —, causal across blocks). The
prompt's whole blocks are prefilled in one block-causal pass; its remaining ``L mod B`` tokens stand, fixed, at the
start of the first decode block, the rest of which is masks (an aligned prompt starts with a block of masks: no seed
token). Every block after that starts as ``B`` masks. Each block takes ``steps`` denoising passes (default ``B``)
with the per-pass quota ``B // steps + (s < B % steps)`` — :class:`~specfold.model.families.base.UnmaskRule`
``quota_dynamic`` (its ``low_confidence_dynamic``, the default; threshold 0.9) or ``quota_static``
(``low_confidence_static``); confidence is the softmax probability of the argmax in the model's dtype. A block with
no masks left gets one more forward that stores its K/V (block-causal, so bidirectional inside it; an NFE). Stop:
every ``eos_token_id`` of ``generation_config.json`` (``[151645, 151643]`` for SDAR-8B-Chat).

Differences from upstream, deliberate and stated: ``generate.py`` samples; greedy here is the argmax with the
untempered probability as confidence (as LMDeploy scores it). Upstream stops after the block holding the stop id is
complete; ours stops as soon as the stop id stands with no mask before it (the same tokens up to it, fewer passes).
Where upstream's top-k would rewrite already decoded positions (``steps < B``) the decode is refused
(:func:`specfold.decoding.core.check_quota_rule`; at run time :class:`~specfold.decoding.core.QuotaShort`); where it
would raise (the argmax is the mask id and the schedule runs out) the block ends after ``steps`` passes, counted in
``capped_blocks``.
"""

from __future__ import annotations

from typing import Any

import torch

from specfold.model.cache import PrefixCache
from specfold.model.families.base import FamilySpec, UnmaskRule
from specfold.model.transformer import DLLM


def start(net: DLLM, prompt: torch.Tensor, cache: PrefixCache, n: int, mask_id: int, chunk: int | None = None):
    aligned = (prompt.numel() // n) * n
    forwards = 0
    if aligned:
        forwards = net.prefill(prompt[:aligned], cache, mask="block_causal", chunk=chunk, block_size=n).forwards
    tail = prompt[aligned:]
    block = torch.full((n,), mask_id, dtype=torch.long, device=prompt.device)
    block[: tail.numel()] = tail
    return block, tail.numel(), forwards


def example_config(common: dict[str, Any]) -> dict[str, Any]:
    """config.json as the published SDAR-8B-Chat writes it (Qwen3 fields), over the shape fields in ``common``."""
    return {
        **common,
        "model_type": "sdar",
        "architectures": ["SDARForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "head_dim": common["hidden_size"] // common["num_attention_heads"],
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "sliding_window": None,
        "use_sliding_window": False,
        "block_size": 4,
        "mask_token_id": common["vocab_size"] - 1,
        "eos_token_id": common["vocab_size"] - 2,
        "bos_token_id": common["vocab_size"] - 2,
    }


FAMILY = FamilySpec(
    name="sdar",
    model_types=("sdar",),
    weight_prefix="model.",
    head_keys=("lm_head.weight",),
    shifted_logits=False,
    qkv_bias=False,
    prefill_mask="block_causal",
    finish_mask="bidirectional",
    default_small_block_size=None,
    # generate.py: `confidence > confidence_threshold` on probabilities in the logits' dtype; steps = block size.
    rule=UnmaskRule(kind="quota_dynamic", inclusive=False, confidence_dtype="model"),
    start=start,
    stop_token_names=("<|im_end|>", "<|endoftext|>"),
    block_size_keys=("block_size",),
    example_config=example_config,
    qk_norm=True,
    generation_config_stops=True,
    seeded_blocks=False,
)
