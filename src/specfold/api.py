"""The public entry points: :func:`load_model` and :func:`generate`."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from specfold.config import DecodeConfig
from specfold.decoding.decoder import GenerationResult, decode
from specfold.model.loading import LoadedModel, load_model

__all__ = ["GenerationResult", "encode_prompt", "generate", "load_model", "decode_config_for"]

METHODS = ("vanilla",)


def encode_prompt(model: LoadedModel, prompt: str, chat: bool = True) -> list[int]:
    """Token ids of a text prompt, through the model's chat template when it has one and ``chat`` is set."""
    if not prompt:
        raise ValueError("empty prompt")
    tok = model.tokenizer
    if tok is None:
        raise ValueError(f"{model.path} has no tokenizer; pass token ids instead of text")
    if chat and getattr(tok, "chat_template", None):
        text = tok.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        return list(tok.encode(text, add_special_tokens=False))
    return list(tok.encode(prompt, add_special_tokens=False))


def decode_config_for(
    model: LoadedModel,
    max_new_tokens: int = 256,
    threshold: float = 0.9,
    block_size: int | None = None,
    small_block_size: int | None | str = "auto",
) -> DecodeConfig:
    """Decoding parameters with the family's defaults (block = the checkpoint's ``bd_size``; small blocks of 8
    for Fast-dLLM-v2, none for Nemotron-Labs-Diffusion)."""
    sbs = model.config.default_small_block_size if small_block_size == "auto" else small_block_size
    cfg = DecodeConfig(
        max_new_tokens=max_new_tokens,
        threshold=threshold,
        block_size=block_size or model.config.block_size,
        small_block_size=sbs,
    )
    if cfg.small_block_size is not None and cfg.small_block_size > cfg.block_size:
        cfg = replace(cfg, small_block_size=cfg.block_size)
    cfg.validate()
    return cfg


def generate(
    model: LoadedModel,
    prompt_or_ids: str | list[int] | torch.Tensor,
    *,
    max_new_tokens: int = 256,
    threshold: float = 0.9,
    block_size: int | None = None,
    small_block_size: int | None | str = "auto",
    method: str = "vanilla",
    chat: bool = True,
    **method_options: Any,
) -> GenerationResult:
    """Decode one prompt (text through the chat template, or token ids as given) and return a typed result."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    if method_options:
        raise ValueError(f"method {method!r} takes no options {sorted(method_options)}")
    cfg = decode_config_for(model, max_new_tokens, threshold, block_size, small_block_size)
    ids = encode_prompt(model, prompt_or_ids, chat) if isinstance(prompt_or_ids, str) else prompt_or_ids
    result = decode(model, ids, cfg)
    if model.tokenizer is not None:
        result.text = model.tokenizer.decode(result.token_ids, skip_special_tokens=True)
    return result
