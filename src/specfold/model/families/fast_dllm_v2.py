"""Fast-dLLM-v2 (NVlabs; ``model_type`` ``Fast_dLLM_Qwen``, or a plain ``qwen2`` checkpoint): Qwen2 layers with q/k/v
bias, **shifted** logits (position ``i`` is read from row ``i-1``).

Protocol (the reference ``batch_sample``/``generate``): the block-aligned part of the prompt is prefilled
block-causally; a shorter tail stays fixed in the first active block, an aligned prompt seeds it with the argmax of
the prefill's last row. Blocks of 32 are decoded in small blocks of 8, left to right (only the current small
block's masks are eligible). A finished block is written to the cache with bidirectional attention inside it;
its last row's argmax seeds the next block. Rule: every eligible position with softmax probability ``> τ`` (in the
logits' dtype), plus the single most confident one; stop ``<|im_end|>``.
"""

from __future__ import annotations

from typing import Any

import torch

from specfold.model.cache import PrefixCache
from specfold.model.families.base import FamilySpec, UnmaskRule, seed_block
from specfold.model.transformer import DLLM


def start(net: DLLM, prompt: torch.Tensor, cache: PrefixCache, n: int, mask_id: int, chunk: int | None = None):
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
    return seed_block(last_logits.argmax(), n, mask_id), 0, forwards


def example_config(common: dict[str, Any]) -> dict[str, Any]:
    """config.json as the published checkpoints write it, over the shape fields in ``common``."""
    return {
        **common,
        "model_type": "Fast_dLLM_Qwen",
        "architectures": ["Fast_dLLM_QwenForCausalLM"],
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "bd_size": 32,
    }


FAMILY = FamilySpec(
    name="fast_dllm_v2",
    model_types=("Fast_dLLM_Qwen", "fast_dllm_qwen", "qwen2"),
    weight_prefix="model.",
    head_keys=("lm_head.weight",),
    shifted_logits=True,
    qkv_bias=True,
    prefill_mask="block_causal",
    finish_mask="bidirectional",
    default_small_block_size=8,
    # The reference compares `x1_p > threshold` on probabilities in the logits' dtype and has no step cap (it loops
    # forever when the argmax is the mask token); ours ends such a block after N rule applications.
    rule=UnmaskRule(inclusive=False, confidence_dtype="model"),
    start=start,
    stop_token_names=("<|im_end|>", "<|eot_id|>", "</s>"),
    example_config=example_config,
)
