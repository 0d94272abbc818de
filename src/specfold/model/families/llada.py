"""LLaDA (GSAI-ML LLaDA-8B-Instruct / -Base, LLaDA-1.5; ``model_type`` ``llada``): an OLMo-style Llama block —
RMSNorm, RoPE, no biases, SwiGLU ``ff_out(silu(ff_proj(x)) * up_proj(x))``, untied head — attending **fully
bidirectionally with no mask at all**, with **unshifted** logits.

Checkpoint (its ``config.json`` and ``modeling_llada.py``): fields ``d_model``, ``n_layers``, ``n_heads``,
``n_kv_heads``, ``mlp_hidden_size``, ``embedding_size`` (the embedding / head rows, >= ``vocab_size``),
``max_sequence_length``, ``rope_theta`` (500000), ``rms_norm_eps`` (1e-5), ``weight_tying``, ``mask_token_id``
(126336), ``eos_token_id`` (126081); tensors ``model.transformer.wte``, ``blocks.N.{attn_norm, q_proj, k_proj,
v_proj, attn_out, ff_norm, ff_proj (gate), up_proj, ff_out (down)}``, ``ln_f`` and the head
``model.transformer.ff_out``. Head dim ``d_model // n_heads``. Only the Llama block with RMSNorm, SiLU and RoPE is
mapped (the published checkpoints); any other choice of the OLMo config is refused by name.

One stated difference: ``rope_full_precision`` (published: true) upcasts q and k to fp32 for RoPE; ours applies
RoPE in the model's dtype as Llama / Qwen2 do — identical in fp32 and fp64, within bf16 rounding in bf16.

Stop ids: the config's EOS (126081) and the tokenizer's ``<|eot_id|>`` (126348). Its reference ``generate()`` never
stops early; the text is cut at either.

Decoding is not the block-cache protocol of ``decoding/core.py``: every pass is a forward of the whole sequence
(prompt + all generated positions), or a window over Fast-dLLM v1's prefix / dual cache built by one
(:meth:`specfold.model.transformer.DLLM.forward` with ``cache_rows`` and ``start``).
"""

from __future__ import annotations

from typing import Any

from specfold.config import ConfigError
from specfold.model.families.base import FamilySpec, UnmaskRule, no_block_protocol

LAYER_KEYS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("input_norm", ("attn_norm.weight",)),
    ("wqkv", ("q_proj.weight", "k_proj.weight", "v_proj.weight")),
    ("bqkv", ("q_proj.bias", "k_proj.bias", "v_proj.bias")),  # include_qkv_bias only (false when published)
    ("wo", ("attn_out.weight",)),
    ("post_norm", ("ff_norm.weight",)),
    ("w_gate_up", ("ff_proj.weight", "up_proj.weight")),
    ("w_down", ("ff_out.weight",)),
)

# OLMo options the published checkpoints set, each with the only value mapped here.
_REQUIRED = {
    "block_type": "llama",
    "layer_norm_type": "rms",
    "activation_type": "silu",
    "alibi": False,
    "rope": True,
    "include_bias": False,
    "attention_layer_norm": False,
    "input_emb_norm": False,
    "scale_logits": False,
    "block_group_size": 1,
}


def standard_config(raw: dict[str, Any]) -> dict[str, Any]:
    """LLaDA's config.json fields as the HF transformer fields :func:`~specfold.model.families.base.model_config`
    reads."""
    for key, want in _REQUIRED.items():
        if key in raw and raw[key] is not None and raw[key] != want:
            raise ConfigError(f"LLaDA config {key}={raw[key]!r} is not supported (only {want!r}, as published)")

    def need(key: str) -> Any:
        if raw.get(key) is None:
            raise ConfigError(f"config.json lacks required field {key!r}")
        return raw[key]

    d_model, heads = int(need("d_model")), int(need("n_heads"))
    head_dim = d_model // heads
    if raw.get("head_dim") not in (None, head_dim):
        raise ConfigError(f"LLaDA's head dim is d_model // n_heads = {head_dim}, config.json says {raw['head_dim']}")
    ffn = raw.get("mlp_hidden_size") or int(raw.get("mlp_ratio", 4)) * d_model
    return {
        **raw,
        "hidden_size": d_model,
        "num_hidden_layers": int(need("n_layers")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(raw.get("n_kv_heads") or heads),
        "head_dim": head_dim,
        "intermediate_size": int(ffn),
        # The embedding and the head have embedding_size rows (padded past vocab_size): logits span all of them.
        "vocab_size": int(raw.get("embedding_size") or need("vocab_size")),
        "max_position_embeddings": int(raw.get("max_sequence_length") or 4096),
        "tie_word_embeddings": bool(raw.get("weight_tying", False)),
        "attention_bias": bool(raw.get("include_qkv_bias", False)),
        "rms_norm_eps": float(raw.get("rms_norm_eps", 1e-5)),
        "rope_theta": float(raw.get("rope_theta", 10000.0)),
    }


def example_config(common: dict[str, Any]) -> dict[str, Any]:
    """config.json as the published LLaDA-8B-Instruct writes it, over the HF shape fields in ``common``."""
    if common["hidden_size"] % common["num_attention_heads"]:
        raise ValueError("LLaDA's head dim is d_model // n_heads: hidden_size must be a multiple of the heads")
    return {
        "model_type": "llada",
        "architectures": ["LLaDAModelLM"],
        "activation_type": "silu",
        "alibi": False,
        "attention_layer_norm": False,
        "bias_for_layer_norm": False,
        "block_group_size": 1,
        "block_type": "llama",
        "d_model": common["hidden_size"],
        "embedding_size": common["vocab_size"],
        "vocab_size": common["vocab_size"],
        "flash_attention": False,
        "include_bias": False,
        "include_qkv_bias": False,
        "input_emb_norm": False,
        "layer_norm_type": "rms",
        "layer_norm_with_affine": True,
        "max_sequence_length": common["max_position_embeddings"],
        "mlp_hidden_size": common["intermediate_size"],
        "mlp_ratio": 4,
        "n_heads": common["num_attention_heads"],
        "n_kv_heads": common["num_key_value_heads"],
        "n_layers": common["num_hidden_layers"],
        "rms_norm_eps": 1e-5,
        "rope": True,
        "rope_full_precision": True,
        "rope_theta": 500000.0,
        "scale_logits": False,
        "use_cache": False,
        "weight_tying": common["tie_word_embeddings"],
        "mask_token_id": common["vocab_size"] - 1,
        "eos_token_id": common["vocab_size"] - 2,
        "pad_token_id": common["vocab_size"] - 2,
    }



FAMILY = FamilySpec(
    name="llada",
    model_types=("llada",),
    weight_prefix="model.transformer.",
    head_keys=("model.transformer.ff_out.weight",),
    shifted_logits=False,
    qkv_bias=False,
    prefill_mask="bidirectional",
    finish_mask="bidirectional",
    default_small_block_size=None,
    # Fast-dLLM v1's threshold rule: the block's most confident masked position plus every one with conf >= τ, the
    # softmax in fp64 (ML-GSAI's generate() is a per-step quota instead: decoding chooses it).
    rule=UnmaskRule(inclusive=True, confidence_dtype="fp64"),
    start=no_block_protocol("LLaDA"),
    stop_token_names=("<|eot_id|>", "<|endoftext|>"),
    example_config=example_config,
    attention="bidirectional",
    standard_config=standard_config,
    embed_key="wte.weight",
    norm_key="ln_f.weight",
    layer_prefix="blocks.",
    layer_keys=LAYER_KEYS,
    extra_stop_token_names=("<|eot_id|>",),
)
