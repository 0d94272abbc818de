"""Dream (Dream-org Dream-v0-Instruct-7B / -Base-7B; ``model_type`` ``Dream``, capital D): Qwen2 layers with q/k/v
bias, untied ``lm_head``, attending **fully bidirectionally with no mask at all**, with **shifted** logits (position
``i`` of the sequence is read from row ``i-1``, position 0 from row 0 itself).

Checkpoint (its ``config.json``, the Qwen2 fields): hidden 3584, 28 layers, 28/4 heads, FFN 18944, vocabulary
152064, ``rope_theta`` 1e6, ``rms_norm_eps`` 1e-6, ``mask_token_id`` 151666, ``eos_token_id`` 151643; tensors under
``model.`` with the Qwen2 names, head ``lm_head.weight``.

Stop ids: the config's EOS (``<|endoftext|>`` 151643) and the tokenizer's ``<|im_end|>`` (151645); upstream never
stops early, the text is cut at either.

Decoding is not the block-cache protocol of ``decoding/core.py``: every pass is a forward of the whole sequence, or a
window over Fast-dLLM v1's prefix / dual cache built by one (:meth:`specfold.model.transformer.DLLM.forward` with
``cache_rows`` and ``start``); :meth:`~specfold.model.transformer.DLLM.sequence_logits` applies the shift over a
whole sequence.
"""

from __future__ import annotations

from typing import Any

from specfold.model.families.base import FamilySpec, UnmaskRule, no_block_protocol


def example_config(common: dict[str, Any]) -> dict[str, Any]:
    """config.json as the published Dream-v0-Instruct-7B writes it, over the shape fields in ``common``."""
    return {
        **common,
        "model_type": "Dream",
        "architectures": ["DreamModel"],
        "attention_dropout": 0.0,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "sliding_window": None,
        "use_sliding_window": False,
        "use_cache": False,
        "mask_token_id": common["vocab_size"] - 1,
        "eos_token_id": common["vocab_size"] - 2,
        "bos_token_id": common["vocab_size"] - 2,
        "pad_token_id": common["vocab_size"] - 2,
    }



FAMILY = FamilySpec(
    name="dream",
    model_types=("Dream", "dream"),
    weight_prefix="model.",
    head_keys=("lm_head.weight",),
    shifted_logits=True,
    qkv_bias=True,
    prefill_mask="bidirectional",
    finish_mask="bidirectional",
    default_small_block_size=None,
    # Fast-dLLM v1 (dream/): the block's most confident masked position plus every one with conf >= τ, the softmax
    # in the logits' dtype.
    rule=UnmaskRule(inclusive=True, confidence_dtype="model"),
    start=no_block_protocol("Dream"),
    stop_token_names=("<|endoftext|>", "<|im_end|>"),
    example_config=example_config,
    attention="bidirectional",
    extra_stop_token_names=("<|im_end|>",),
    # Its tokenizer_config.json names DreamTokenizer (remote code: Qwen2's byte-level BPE) over vocab.json +
    # merges.txt, with no tokenizer.json: read by the stock Qwen2 class.
    tokenizer_class="Qwen2Tokenizer",
)
