"""Rotary position embeddings: plain RoPE and YaRN, plus the Llama-4 style query scaling of Ministral3.

Dims: ``T`` rows, ``D`` head dim, ``H`` heads.

The angle tables are computed in fp32 exactly as ``transformers`` does (fp32 inverse frequencies, fp32
``position * inv_freq``, cos/sin scaled by the attention factor, then cast to the model dtype), so that our
logits match the reference implementation even in fp64.
"""

from __future__ import annotations

import math

import torch

from specfold.config import RopeConfig


def inverse_frequencies(rope: RopeConfig, head_dim: int) -> tuple[torch.Tensor, float]:
    """``(inv_freq [D/2] fp32, attention_factor)`` for plain RoPE or YaRN."""
    dim = head_dim
    pos_freqs = rope.theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim)
    if rope.kind == "default":
        return 1.0 / pos_freqs, 1.0

    factor = rope.factor
    orig = rope.original_max_position_embeddings
    if orig is None:
        raise ValueError("YaRN RoPE needs original_max_position_embeddings")

    def get_mscale(scale: float, mscale: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    attention_factor = rope.attention_factor
    if attention_factor is None:
        if rope.mscale and rope.mscale_all_dim:
            attention_factor = get_mscale(factor, rope.mscale) / get_mscale(factor, rope.mscale_all_dim)
        else:
            attention_factor = get_mscale(factor)

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(rope.theta))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attention_factor)


class Rotary:
    """Precomputed inverse frequencies; ``tables(positions)`` gives cos/sin for any absolute positions."""

    def __init__(self, rope: RopeConfig, head_dim: int) -> None:
        self.rope = rope
        self.inv_freq, self.attention_factor = inverse_frequencies(rope, head_dim)

    def tables(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """positions: ``[T]`` long. Returns ``cos [T, D]``, ``sin [T, D]`` in ``dtype`` and the query scale
        ``[T]`` (or ``None`` when the model has no Llama-4 scaling)."""
        inv = self.inv_freq.to(positions.device)
        freqs = positions.float()[:, None] * inv[None, :]  # [T, D/2] fp32
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * self.attention_factor).to(dtype)
        sin = (emb.sin() * self.attention_factor).to(dtype)
        qscale = None
        if self.rope.llama4_beta is not None and self.rope.llama4_max_position:
            scale = 1 + self.rope.llama4_beta * torch.log(1 + torch.floor(positions / self.rope.llama4_max_position))
            qscale = scale.to(dtype)
        return cos, sin, qscale


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: ``[T, H, D]``; cos/sin: ``[T, D]``. Returns the rotated ``[T, H, D]``."""
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]
