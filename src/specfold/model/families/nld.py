"""Nemotron-Labs-Diffusion (``model_type`` ``nemotron_labs_diffusion``): a Ministral3 backbone under ``encoder.*`` with
a separate ``diffusion_head``, no biases, YaRN RoPE with Llama-4 query scaling, **unshifted** logits.

Protocol (its ``generate()``): causal prefill of the whole prompt; the argmax of its last row seeds the first block
``[seed, M × 31]``; every mask of the block is eligible. A finished block is run once more causally to refresh the
cache (an NFE); its last row seeds the next block. Rule: the single most confident masked position plus every one
with confidence ``>= τ``, the softmax in the model's dtype, at most ``block_length`` passes per block. Stop: the
config's ``eos_token_id`` (11 for NLD-8B).
"""

from __future__ import annotations

from typing import Any

import torch

from specfold.model.cache import PrefixCache
from specfold.model.families.base import FamilySpec, UnmaskRule, seed_block
from specfold.model.transformer import DLLM


def start(net: DLLM, prompt: torch.Tensor, cache: PrefixCache, n: int, mask_id: int, chunk: int | None = None):
    pre = net.prefill(prompt, cache, mask="causal", chunk=chunk)
    return seed_block(pre.last_logits.argmax(), n, mask_id), 0, pre.forwards


def example_config(common: dict[str, Any]) -> dict[str, Any]:
    """config.json as the published NLD-8B writes it (YaRN, Llama-4 scaling), over the shape fields in ``common``."""
    return {
        **common,
        "model_type": "nemotron_labs_diffusion",
        "architectures": ["NemotronLabsDiffusionModel"],
        "rms_norm_eps": 1e-5,
        "head_dim": common["hidden_size"] // common["num_attention_heads"],
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 1000000.0,
            "factor": 16.0,
            "original_max_position_embeddings": 64,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "llama_4_scaling_beta": 0.1,
        },
    }


FAMILY = FamilySpec(
    name="nld",
    model_types=("nemotron_labs_diffusion",),
    weight_prefix="encoder.",
    head_keys=("diffusion_head.weight", "lm_head.weight"),
    shifted_logits=False,
    qkv_bias=False,
    prefill_mask="causal",
    finish_mask="causal",
    default_small_block_size=None,
    rule=UnmaskRule(inclusive=True, confidence_dtype="model"),
    start=start,
    stop_token_names=("<|im_end|>", "<|eot_id|>", "</s>"),
    config_nested=("text_config", "encoder_config"),
    example_config=example_config,
)
