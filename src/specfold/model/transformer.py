"""Our transformer for both DLLM families: RMSNorm, RoPE (plain / YaRN), GQA, SwiGLU, optional q/k/v bias.

Dims: ``B`` branches, ``T`` block rows, ``E`` hidden size, ``F`` FFN size, ``Hq``/``Hkv`` heads, ``D`` head dim,
``V`` vocabulary.

The layer exposes its pieces (``qkv``, ``attn_out``, ``ffn``) because the folded verifier runs them on packed
subsets of rows; :meth:`DLLM.forward` is the dense composition of the same pieces. Q/K/V and gate/up weights are
fused (one GEMM each), as in gpt-fast.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specfold.config import ModelConfig
from specfold.model.attention import AttnState, attend, block_bias
from specfold.model.cache import PrefixCache
from specfold.model.rope import Rotary, apply_rotary


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: ``[..., E]``. Computed in fp32 (fp64 stays fp64) and cast back, as Qwen2 / Ministral3 do."""
    work = x if x.dtype == torch.float64 else x.float()
    var = work.pow(2).mean(-1, keepdim=True)
    return weight * (work * torch.rsqrt(var + eps)).to(x.dtype)


class Layer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        e, hq, hkv, d, f = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size
        self.hq, self.hkv, self.d, self.eps = hq, hkv, d, cfg.rms_norm_eps
        self.input_norm = nn.Parameter(torch.ones(e))
        self.wqkv = nn.Parameter(torch.empty((hq + 2 * hkv) * d, e))
        self.bqkv = nn.Parameter(torch.zeros((hq + 2 * hkv) * d)) if cfg.qkv_bias else None
        self.wo = nn.Parameter(torch.empty(e, hq * d))
        self.post_norm = nn.Parameter(torch.ones(e))
        self.w_gate_up = nn.Parameter(torch.empty(2 * f, e))
        self.w_down = nn.Parameter(torch.empty(e, f))

    def qkv(
        self,
        h: torch.Tensor,  # [R, E] layer input rows (any set of rows)
        cos: torch.Tensor,  # [R, D]
        sin: torch.Tensor,  # [R, D]
        qscale: torch.Tensor | None,  # [R]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """RMSNorm -> fused QKV GEMM -> RoPE (-> query scale). Returns q ``[R, Hq, D]``, k, v ``[R, Hkv, D]``."""
        x = rms_norm(h, self.input_norm, self.eps)
        qkv = F.linear(x, self.wqkv, self.bqkv)
        q, k, v = qkv.split([self.hq * self.d, self.hkv * self.d, self.hkv * self.d], dim=-1)
        q = apply_rotary(q.view(-1, self.hq, self.d), cos, sin)
        k = apply_rotary(k.view(-1, self.hkv, self.d), cos, sin)
        if qscale is not None:
            q = q * qscale[:, None, None]
        return q, k, v.reshape(-1, self.hkv, self.d)

    def attn_out(self, o: torch.Tensor) -> torch.Tensor:
        """o: ``[R, Hq, D]`` (model dtype). Returns ``[R, E]``."""
        return F.linear(o.reshape(o.shape[0], -1), self.wo)

    def ffn(self, h: torch.Tensor) -> torch.Tensor:
        """h: ``[R, E]`` post-attention residual. RMSNorm -> fused gate/up -> SiLU·mul -> down. Returns ``[R, E]``."""
        x = rms_norm(h, self.post_norm, self.eps)
        gate, up = F.linear(x, self.w_gate_up).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, self.w_down)


class DLLM(nn.Module):
    """A masked-diffusion LM. ``forward`` runs a block of rows for ``B`` branches against a shared prefix cache."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size))
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.num_layers))
        self.final_norm = nn.Parameter(torch.ones(cfg.hidden_size))
        self.head = None if cfg.tie_word_embeddings else nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size))
        self.rotary = Rotary(cfg.rope, cfg.head_dim)
        self.scale = cfg.head_dim**-0.5

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def head_weight(self) -> torch.Tensor:
        return self.embed if self.head is None else self.head

    def new_cache(self, capacity: int) -> PrefixCache:
        c = self.cfg
        return PrefixCache(c.num_layers, c.num_kv_heads, c.head_dim, capacity, self.dtype, self.device)

    def rope_tables(self, start: int, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Tables for absolute positions ``start .. start+rows-1``: cos, sin ``[T, D]``, qscale ``[T]`` or None."""
        positions = torch.arange(start, start + rows, device=self.device)
        return self.rotary.tables(positions, self.dtype)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """h: ``[..., E]`` last hidden state. Returns raw (unshifted) rows ``[..., V]``."""
        return F.linear(rms_norm(h, self.final_norm, self.cfg.rms_norm_eps), self.head_weight())

    def position_logits(self, raw: torch.Tensor) -> torch.Tensor:
        """Raw rows ``[B, T, V]`` -> logits per block position. Fast-dLLM-v2 is shifted: position ``i`` is read
        from row ``i-1`` and row 0 predicts itself; Nemotron-Labs-Diffusion is unshifted."""
        if not self.cfg.shifted_logits:
            return raw
        return torch.cat([raw[:, :1], raw[:, :-1]], dim=1)

    def forward(
        self,
        tokens: torch.Tensor,  # [B, T]
        cache: PrefixCache | None,
        mask: str = "bidirectional",
        write_cache: bool = False,
    ) -> torch.Tensor:
        """Dense forward of ``B`` block states at positions ``cache.length ..``. Returns raw logits ``[B, T, V]``.

        ``mask`` is the attention inside the block (``bidirectional``, ``causal``, ``block_causal`` with the
        family's block size). With ``write_cache`` (``B == 1``) the rows' K/V are appended to the cache.
        """
        b, t = tokens.shape
        if write_cache and (cache is None or b != 1):
            raise ValueError("write_cache needs a cache and exactly one branch")
        start = 0 if cache is None else cache.length
        cos, sin, qscale = self.rope_tables(start, t)
        cos_r, sin_r = cos.repeat(b, 1), sin.repeat(b, 1)
        qscale_r = None if qscale is None else qscale.repeat(b)
        bias = block_bias(mask, t, self.cfg.block_size, self.dtype, self.device)
        h = F.embedding(tokens, self.embed).reshape(b * t, -1)  # [B*T, E]
        for i, layer in enumerate(self.layers):
            q, k, v = layer.qkv(h, cos_r, sin_r, qscale_r)
            pk, pv = (None, None) if cache is None else cache.layer(i)
            state: AttnState = attend(
                q.view(b, t, layer.hq, layer.d), pk, pv, k.view(b, t, layer.hkv, layer.d),
                v.view(b, t, layer.hkv, layer.d), bias, self.scale,
            )
            if write_cache:
                cache.write(i, k, v)
            h = h + layer.attn_out(state.o.to(h.dtype).reshape(b * t, layer.hq, layer.d))
            h = h + layer.ffn(h)
        if write_cache:
            cache.commit(t)
        return self.logits(h).view(b, t, -1)
