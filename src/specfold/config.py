"""Configuration dataclasses: the model (read from a checkpoint's ``config.json``) and decoding.

Two DLLM families are supported; each is one value of :class:`Family`:

* ``fast_dllm_v2`` — Fast-dLLM-v2 (``model_type`` ``Fast_dLLM_Qwen`` or plain ``qwen2``): Qwen2 layers with q/k/v
  bias, logits shifted (position ``i`` is read from row ``i-1``), block-causal prefill, small blocks of 8.
* ``nld`` — Nemotron-Labs-Diffusion (``model_type`` ``nemotron_labs_diffusion``): a Ministral3 backbone under
  ``encoder.*`` with a separate ``diffusion_head``, no biases, YaRN RoPE and Llama-4 style query scaling,
  logits unshifted, causal prefill and causal refresh of each finished block.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Family(enum.StrEnum):
    FAST_DLLM_V2 = "fast_dllm_v2"
    NLD = "nld"


# model_type in config.json -> family. The keys are what real checkpoints carry.
MODEL_TYPES: dict[str, Family] = {
    "Fast_dLLM_Qwen": Family.FAST_DLLM_V2,
    "fast_dllm_qwen": Family.FAST_DLLM_V2,
    "qwen2": Family.FAST_DLLM_V2,
    "nemotron_labs_diffusion": Family.NLD,
}


class ConfigError(ValueError):
    """A checkpoint's config.json cannot be used (missing field, unsupported model_type, bad value)."""


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    kind: str = "default"  # "default" | "yarn"
    factor: float = 1.0
    original_max_position_embeddings: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True
    # Llama-4 style query scaling: q *= 1 + beta * log(1 + floor(pos / llama4_max_position)).
    llama4_beta: float | None = None
    llama4_max_position: int | None = None


@dataclass(frozen=True)
class ModelConfig:
    family: Family
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    qkv_bias: bool
    tie_word_embeddings: bool
    rope: RopeConfig
    block_size: int = 32  # bd_size
    mask_token_id: int | None = None
    eos_token_id: int | None = None
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def shifted_logits(self) -> bool:
        return self.family is Family.FAST_DLLM_V2

    @property
    def default_small_block_size(self) -> int | None:
        return 8 if self.family is Family.FAST_DLLM_V2 else None

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> ModelConfig:
        model_type = cfg.get("model_type")
        if model_type not in MODEL_TYPES:
            supported = ", ".join(sorted(MODEL_TYPES))
            raise ConfigError(f"unsupported model_type {model_type!r}; supported: {supported}")
        family = MODEL_TYPES[model_type]
        # NLD checkpoints may nest the backbone's fields under text_config / encoder_config (check).
        body = dict(cfg)
        for nested in ("text_config", "encoder_config"):
            if isinstance(cfg.get(nested), dict):
                body = {**cfg[nested], **{k: v for k, v in cfg.items() if k not in cfg[nested]}}
                break

        def need(key: str) -> Any:
            if key not in body or body[key] is None:
                raise ConfigError(f"config.json lacks required field {key!r}")
            return body[key]

        hidden = int(need("hidden_size"))
        heads = int(need("num_attention_heads"))
        kv_heads = int(body.get("num_key_value_heads") or heads)
        head_dim = int(body.get("head_dim") or hidden // heads)
        if heads % kv_heads:
            raise ConfigError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
        max_pos = int(body.get("max_position_embeddings") or 32768)
        eos = body.get("eos_token_id")
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        return cls(
            family=family,
            model_type=model_type,
            vocab_size=int(need("vocab_size")),
            hidden_size=hidden,
            intermediate_size=int(need("intermediate_size")),
            num_layers=int(need("num_hidden_layers")),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(body.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=max_pos,
            qkv_bias=bool(body.get("attention_bias", family is Family.FAST_DLLM_V2)),
            tie_word_embeddings=bool(body.get("tie_word_embeddings", False)),
            rope=_rope_from(body, max_pos),
            block_size=int(body.get("bd_size") or body.get("block_size") or 32),
            mask_token_id=body.get("mask_token_id"),
            eos_token_id=eos,
            raw=dict(cfg),
        )


def _rope_from(body: dict[str, Any], max_pos: int) -> RopeConfig:
    # transformers >= 5 writes rope_parameters; older checkpoints write rope_theta + rope_scaling.
    params = dict(body.get("rope_parameters") or {})
    scaling = body.get("rope_scaling") or {}
    params = {**scaling, **params}
    theta = float(params.get("rope_theta", body.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default")) or "default"
    if kind not in ("default", "yarn"):
        raise ConfigError(f"unsupported RoPE type {kind!r}; supported: default, yarn")
    orig = params.get("original_max_position_embeddings")
    factor = params.get("factor")
    if kind == "yarn" and factor is None:
        if orig is None:
            raise ConfigError("YaRN RoPE needs 'factor' or 'original_max_position_embeddings'")
        factor = max_pos / orig
    return RopeConfig(
        theta=theta,
        kind=kind,
        factor=float(factor or 1.0),
        original_max_position_embeddings=int(orig) if orig is not None else None,
        beta_fast=float(params.get("beta_fast") or 32.0),
        beta_slow=float(params.get("beta_slow") or 1.0),
        mscale=params.get("mscale"),
        mscale_all_dim=params.get("mscale_all_dim"),
        attention_factor=params.get("attention_factor"),
        truncate=bool(params.get("truncate", True)),
        llama4_beta=params.get("llama_4_scaling_beta"),
        llama4_max_position=int(orig) if (params.get("llama_4_scaling_beta") is not None and orig) else None,
    )


@dataclass(frozen=True)
class DecodeConfig:
    """Vanilla block decoding parameters (SPEC §2)."""

    max_new_tokens: int = 256
    threshold: float = 0.9
    block_size: int = 32
    small_block_size: int | None = 8  # None: every mask of the block is eligible (NLD)
    prefill_chunk: int | None = None  # prompt rows per prefill forward (None: the model's default)

    def validate(self) -> None:
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")
        if self.max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be positive, got {self.max_new_tokens}")
        if self.block_size <= 0:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        if self.prefill_chunk is not None and self.prefill_chunk <= 0:
            raise ValueError(f"prefill_chunk must be positive, got {self.prefill_chunk}")
        if self.small_block_size is not None:
            if self.small_block_size <= 0:
                raise ValueError(f"small_block_size must be positive, got {self.small_block_size}")
            if self.block_size % self.small_block_size:
                raise ValueError(
                    f"block_size {self.block_size} is not a multiple of small_block_size {self.small_block_size}"
                )
