"""Our transformer for every DLLM family: RMSNorm, RoPE (plain / YaRN), GQA, SwiGLU, optional q/k/v bias, optional
per-head q/k RMSNorm before RoPE (Qwen3 / SDAR).

Dims: ``B`` branches, ``T`` block rows, ``E`` hidden size, ``F`` FFN size, ``Hq``/``Hkv`` heads, ``D`` head dim,
``V`` vocabulary.

The layer exposes its pieces (``qkv``, ``attn_out``, ``ffn``) because the folded verifier runs them on packed
subsets of rows; :meth:`DLLM.forward` is the dense composition of the same pieces. Q/K/V and gate/up weights are
fused (one GEMM each), as in gpt-fast.

:meth:`DLLM.prefill` writes a prompt of any length to the cache in chunks of :data:`DEFAULT_PREFILL_CHUNK` rows:
each chunk attends to the cache written so far and to itself with the family's mask (fused SDPA, no score
matrix), so memory grows linearly with the prompt; only the last row of the last layer goes through attention
output, FFN and the LM head, since nothing else of it is used.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specfold.config import ModelConfig
from specfold.model.attention import attend_fused, attend_prefill, attend_ragged, block_bias
from specfold.model.cache import BatchCache, PrefixCache
from specfold.model.linear import linear, pad_rows
from specfold.model.rope import Rotary, apply_rotary

# NOTE: measured on CPU (README, "Long prompts"): 1024 rows per chunk is as fast as one-shot at 4k prompts and keeps
# the per-chunk activations (the [chunk, keys] mask, FFN rows) small. A multiple of every usual block size.
DEFAULT_PREFILL_CHUNK = 1024


@dataclass
class Prefill:
    """What a prefill returns: the raw logits of the prompt's last row ``[V]`` and the forwards it took."""

    last_logits: torch.Tensor
    forwards: int


def prefill_chunk_size(chunk: int | None, mask: str, block_size: int) -> int:
    """Rows per prefill chunk: ``chunk`` (default :data:`DEFAULT_PREFILL_CHUNK`); for ``block_causal`` rounded
    down to a multiple of the block (at least one), so that every chunk starts at a block boundary."""
    size = DEFAULT_PREFILL_CHUNK if chunk is None else chunk
    if size <= 0:
        raise ValueError(f"the prefill chunk must be positive, got {size}")
    return max(block_size, size // block_size * block_size) if mask == "block_causal" else size


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
        self.q_norm = nn.Parameter(torch.ones(d)) if cfg.qk_norm else None  # [D] per-head RMSNorm on q (Qwen3)
        self.k_norm = nn.Parameter(torch.ones(d)) if cfg.qk_norm else None  # [D] on k
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
        """RMSNorm -> fused QKV GEMM (-> per-head q/k RMSNorm) -> RoPE (-> query scale). Returns q ``[R, Hq, D]``,
        k, v ``[R, Hkv, D]``."""
        x = rms_norm(h, self.input_norm, self.eps)
        qkv = linear(x, self.wqkv, self.bqkv)
        q, k, v = qkv.split([self.hq * self.d, self.hkv * self.d, self.hkv * self.d], dim=-1)
        q, k = q.reshape(-1, self.hq, self.d), k.reshape(-1, self.hkv, self.d)
        q_norm, k_norm = getattr(self, "q_norm", None), getattr(self, "k_norm", None)  # absent on reference stand-ins
        if q_norm is not None:
            q, k = rms_norm(q, q_norm, self.eps), rms_norm(k, k_norm, self.eps)
        q = apply_rotary(q, cos, sin)
        k = apply_rotary(k, cos, sin)
        if qscale is not None:
            q = q * qscale[:, None, None]
        return q, k, v.reshape(-1, self.hkv, self.d)

    def attn_out(self, o: torch.Tensor) -> torch.Tensor:
        """o: ``[R, Hq, D]`` (model dtype). Returns ``[R, E]``."""
        return linear(o.reshape(o.shape[0], -1), self.wo)

    def ffn(self, h: torch.Tensor) -> torch.Tensor:
        """h: ``[R, E]`` post-attention residual. RMSNorm -> fused gate/up -> SiLU·mul -> down. Returns ``[R, E]``."""
        m = h.shape[0]
        x = pad_rows(rms_norm(h, self.post_norm, self.eps))  # padded once for both GEMMs (see model/linear.py)
        gate, up = linear(x, self.w_gate_up).chunk(2, dim=-1)
        out = linear(F.silu(gate) * up, self.w_down)
        return out if out.shape[0] == m else out[:m]


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
        return linear(rms_norm(h, self.final_norm, self.cfg.rms_norm_eps), self.head_weight())

    def position_logits(self, raw: torch.Tensor) -> torch.Tensor:
        """Raw rows ``[B, T, V]`` -> logits per block position. Fast-dLLM-v2 is shifted: position ``i >= 1`` is
        read from row ``i-1``; position 0 (never masked in a block: a seed or a prompt token) carries row ``T-1``,
        the prediction of the token after the block (what a boundary draft guesses the next block's seed from,
        :mod:`specfold.decoding.decoder`). Nemotron-Labs-Diffusion is unshifted."""
        if not self.cfg.shifted_logits:
            return raw
        return torch.cat([raw[:, -1:], raw[:, :-1]], dim=1)

    def sequence_logits(self, raw: torch.Tensor) -> torch.Tensor:
        """Raw rows ``[B, L, V]`` of a whole sequence from position 0 -> logits per position. Shifted (Dream):
        position ``i >= 1`` is read from row ``i-1``, position 0 from row 0 itself; unshifted (LLaDA): the rows."""
        if not self.cfg.shifted_logits:
            return raw
        return torch.cat([raw[:, :1], raw[:, :-1]], dim=1)

    def forward(
        self,
        tokens: torch.Tensor,  # [B, T]
        cache: PrefixCache | None,
        mask: str = "bidirectional",
        write_cache: bool = False,
        logit_rows: slice | None = None,
        cache_rows: int | torch.Tensor | None = None,
        start: int | None = None,
    ) -> torch.Tensor:
        """Dense forward of ``B`` block states at positions ``start ..`` (default :attr:`PrefixCache.start
        <specfold.model.cache.PrefixCache.start>`: the cached length unless the cache sets a window start; 0 without
        a cache). Returns raw logits ``[B, T, V]`` (``[B, T', V]`` for the rows ``logit_rows`` selects, e.g.
        ``slice(-1, None)`` for a seed row only).

        ``mask`` is the attention inside the block (``bidirectional``, ``causal``, ``block_causal`` with the
        family's block size); every row sees every cached key. With ``write_cache`` (``B == 1``) the K/V of the
        first ``cache_rows`` rows (default: all) are appended to the cache — or, with ``cache_rows`` a ``[W]`` long
        tensor of row indices, those rows in that order.

        Fast-dLLM v1's caches for the fully bidirectional families (LLaDA, Dream) are these two calls: the whole
        sequence ``[1, L]`` over an empty cache with ``write_cache`` and ``cache_rows`` = the prefix rows
        ``[0, s)`` (prefix cache) or those and the suffix rows ``[e, L)`` (dual cache) — one full bidirectional
        forward that stores RoPE'd K/V —; then a window of rows (``[s, L)`` for the prefix cache, the block ``[s,
        e)`` for the dual cache) over that cache with ``start=s``: its rows equal the full forward's rows wherever
        the cached K/V are the full forward's. The cache order of keys does not matter (no mask over the cache).
        """
        b, t = tokens.shape
        if write_cache and (cache is None or b != 1):
            raise ValueError("write_cache needs a cache and exactly one branch")
        picked = isinstance(cache_rows, torch.Tensor)
        w = t if cache_rows is None else (cache_rows.numel() if picked else cache_rows)
        if start is None:
            start = 0 if cache is None else cache.start
        cos, sin, qscale = self.rope_tables(start, t)
        cos_r, sin_r = cos.repeat(b, 1), sin.repeat(b, 1)
        qscale_r = None if qscale is None else qscale.repeat(b)
        bias = block_bias(mask, t, self.cfg.block_size, self.dtype, self.device)
        h = F.embedding(tokens, self.embed).reshape(b * t, -1)  # [B*T, E]
        for i, layer in enumerate(self.layers):
            q, k, v = layer.qkv(h, cos_r, sin_r, qscale_r)
            pk, pv = (None, None) if cache is None else cache.layer(i)
            o = attend_fused(
                q.view(b, t, layer.hq, layer.d), pk, pv, k.view(b, t, layer.hkv, layer.d),
                v.view(b, t, layer.hkv, layer.d), bias, self.scale,
            )
            if write_cache:
                rows = cache_rows if picked else slice(0, w)
                cache.write(i, k[rows], v[rows])
            h = h + layer.attn_out(o.to(h.dtype).reshape(b * t, layer.hq, layer.d))
            h = h + layer.ffn(h)
        if write_cache:
            cache.commit(w)
        h = h.view(b, t, -1)
        return self.logits(h if logit_rows is None else h[:, logit_rows])

    def forward_ragged(
        self,
        tokens: torch.Tensor,  # [R, K, T] K branch states per request (or [R, T]: one each)
        cache: BatchCache,
        slots: torch.Tensor,  # [R] long, each request's cache slot
        lengths: torch.Tensor,  # [R] long, each request's cached length
        mask: str = "bidirectional",
        write_cache: bool = False,
        logit_rows: slice | None = None,
        valid: torch.Tensor | None = None,  # [R, K] bool: branch blocks to compute (the rest are padding)
        starts: torch.Tensor | None = None,  # [R] long: each block's first absolute position (default: lengths)
        layers: Callable[..., torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Dense forward of ``R`` requests' branch blocks, each at positions ``lengths[r] ..`` over its request's
        prefix. Returns raw logits ``[R, K, T, V]`` (``[R, T, V]`` for 2-D tokens; ``T'`` rows with
        ``logit_rows``). With ``write_cache`` (one branch each) each block's K/V is stored past its request's
        length (the caller advances the lengths).

        With ``valid`` only the valid blocks are computed (requests with fewer branches than ``K`` pay nothing
        for their padding): logits ``[B', T, V]`` of the valid blocks in (request, branch) order.

        ``starts``: the blocks' positions when they are not the cached lengths (Fast-dLLM v1's dual cache holds the
        suffix keys after the block: the block starts before the cache's end). Cache writes still go past
        ``lengths``.

        The host-side work (the longest prefix, the valid blocks, RoPE tables) happens here; the layer stack runs in
        :meth:`ragged_layers`, or in ``layers`` with its signature (:mod:`specfold.engine.compiled` passes it
        compiled: a graph free of host reads)."""
        flat = tokens.dim() == 2
        if flat:
            tokens = tokens[:, None]
        r, k, t = tokens.shape
        if write_cache and (k != 1 or valid is not None):
            raise ValueError("write_cache needs exactly one branch per request")
        p_max = int(lengths.max())  # NOTE: host reads (free for the batch decoder's host tensors)
        in_order = slots.tolist() == list(range(r))
        slots, lengths = slots.to(self.device), lengths.to(self.device)
        offsets = torch.arange(t, device=self.device)
        positions = lengths[:, None] + offsets  # [R, T] the cache rows written
        rope_pos = positions if starts is None else starts.to(self.device)[:, None] + offsets  # [R, T]
        block_pos = rope_pos[:, None].expand(r, k, t).reshape(r * k, t)
        keep = None if valid is None else valid.reshape(-1).nonzero().squeeze(1)  # [B'] computed blocks
        request = torch.arange(r, device=self.device).repeat_interleave(k)  # [R*K] request of each block
        if keep is not None:
            tokens, block_pos, request = tokens.reshape(r * k, t)[keep], block_pos[keep], request[keep]
        cos, sin, qscale = self.rotary.tables(block_pos.reshape(-1), self.dtype)
        bias = block_bias(mask, t, self.cfg.block_size, self.dtype, self.device)
        # Slots 0..R-1 in order (the batch decoder keeps them so) are read as a view; otherwise they are gathered.
        # NOTE: gathered for every layer at once (L x one layer's prefixes in memory; the decoding core never does)
        rows = slice(0, r) if in_order else slots
        blocks = request.shape[0]
        h = F.embedding(tokens.reshape(blocks, t), self.embed)  # [B', T, E] (B' = R*K without valid)
        cos, sin = cos.view(blocks, t, -1), sin.view(blocks, t, -1)
        qscale = None if qscale is None else qscale.view(blocks, t)
        prefix = (cache.k[:, rows, :, :p_max], cache.v[:, rows, :, :p_max])  # [L, R, Hkv, P, D] each
        write = (cache, slots, positions) if write_cache else None
        h = (self.ragged_layers if layers is None else layers)(h, cos, sin, qscale, *prefix, lengths, request, bias,
                                                               write)
        if keep is not None:
            return self.logits(h if logit_rows is None else h[:, logit_rows])
        h = h.view(r, k, t, -1)
        out = self.logits(h if logit_rows is None else h[:, :, logit_rows])
        return out[:, 0] if flat else out

    def ragged_layers(
        self,
        h: torch.Tensor,  # [B', T, E] embedded rows of the computed blocks
        cos: torch.Tensor,  # [B', T, D]
        sin: torch.Tensor,  # [B', T, D]
        qscale: torch.Tensor | None,  # [B', T]
        prefix_k: torch.Tensor,  # [L, R, Hkv, P, D] each request's prefix, padded past its length (a view)
        prefix_v: torch.Tensor,  # [L, R, Hkv, P, D]
        lengths: torch.Tensor,  # [R] long
        request: torch.Tensor,  # [B'] long: each block's request
        bias: torch.Tensor | None,  # [T, T] additive inside the block, None = bidirectional
        write: tuple[BatchCache, torch.Tensor, torch.Tensor] | None = None,  # (cache, slots [R], positions [R, T])
    ) -> torch.Tensor:
        """:meth:`forward_ragged`'s layer stack: the last hidden rows ``[B', T, E]``. With ``write``, each block's K/V
        is stored at its request's positions.

        NOTE: rows stay ``[B', T, ...]`` and every view names its sizes: under ``torch.compile`` with dynamic shapes a
        size derived by division (``rows // blocks``, or a ``-1`` in a view of flattened rows) becomes a floor-division
        symbol, and inductor then spent over 10 minutes in sympy on one graph of this stack (py-spy, AVX2 EPYC)."""
        b, t, e = h.shape
        h = h.reshape(b * t, e)
        cos, sin = cos.reshape(b * t, -1), sin.reshape(b * t, -1)
        qscale = None if qscale is None else qscale.reshape(b * t)
        for i, layer in enumerate(self.layers):
            q, kk, v = layer.qkv(h, cos, sin, qscale)
            kk, v = kk.view(b, t, layer.hkv, layer.d), v.view(b, t, layer.hkv, layer.d)
            o = attend_ragged(q.view(b, t, layer.hq, layer.d), prefix_k[i], prefix_v[i], lengths, request, kk, v,
                              bias, self.scale)
            if write is not None:
                write[0].write(i, write[1], write[2], kk, v)
            h = h + layer.attn_out(o.to(h.dtype).reshape(b * t, layer.hq, layer.d))
            h = h + layer.ffn(h)
        return h.view(b, t, e)

    def prefill(
        self,
        tokens: torch.Tensor,  # [T] prompt ids, written at positions cache.length ..
        cache: PrefixCache,
        mask: str = "causal",
        chunk: int | None = None,
        block_size: int | None = None,
    ) -> Prefill:
        """Append a prompt's K/V to the cache in chunks (``causal``, or ``block_causal`` with the family's block
        size counted from the prompt's first row) and return the raw logits of its last row.

        Each chunk of ``chunk`` rows (see :func:`prefill_chunk_size`) sees the cache written so far and itself
        with ``mask``: the cache and last row equal a one-shot :meth:`forward` over the whole prompt. The cache is
        reserved once; a prompt past ``max_position_embeddings`` is refused before any work. ``block_size``: the
        ``block_causal`` block (default the model's; SDAR's blocks are the decode's block length).
        """
        if mask not in ("causal", "block_causal"):
            raise ValueError(f"prefill needs a causal or block_causal mask, got {mask!r}")
        t, start = tokens.numel(), cache.length
        if t == 0:
            raise ValueError("empty prompt")
        limit = self.cfg.max_position_embeddings
        if start + t > limit:
            raise ValueError(f"the prompt ends at position {start + t}, past the model's position limit {limit}")
        block = block_size or self.cfg.block_size
        size = prefill_chunk_size(chunk, mask, block)
        cache.reserve(start + t)
        chunks = range(0, t, size)
        for a in chunks:
            h = self._prefill_chunk(tokens[a : a + size], cache, mask, last=a + size >= t, block=block)
        return Prefill(self.logits(h)[0], len(chunks))

    def _prefill_chunk(
        self, tokens: torch.Tensor, cache: PrefixCache, mask: str, last: bool, block: int | None = None
    ) -> torch.Tensor:
        """tokens ``[C]`` at positions ``cache.length ..``, chunk-aligned. Writes and commits their K/V; returns the
        final hidden state of the last row ``[1, E]`` when ``last`` (an empty ``[0, E]`` otherwise)."""
        c, p = tokens.numel(), cache.length
        cos, sin, qscale = self.rope_tables(p, c)
        # Earlier chunks are wholly visible (they end at a block boundary); only the chunk itself is masked. A causal
        # chunk with nothing before it is the square case SDPA's is_causal covers (skipping the masked half).
        causal = mask == "causal" and p == 0
        bias = None
        if not causal:
            inner = block_bias(mask, c, block or self.cfg.block_size, self.dtype, self.device)  # [C, C]
            bias = torch.cat([inner.new_zeros(c, p), inner], dim=1)  # [C, P + C]
        h = F.embedding(tokens, self.embed)  # [C, E]
        for i, layer in enumerate(self.layers):
            q, k, v = layer.qkv(h, cos, sin, qscale)
            cache.write(i, k, v)
            keys, values = cache.layer(i, pending=c)  # [Hkv, P + C, D]
            if i == len(self.layers) - 1:
                # NOTE: the last layer's outputs feed only the LM head: just the prompt's last row is needed.
                if not last:
                    h = h[:0]
                    break
                h, q, bias, causal = h[-1:], q[-1:], None, False  # the last row sees every key under either mask
            o = attend_prefill(q, keys, values, bias, self.scale, causal)
            h = h + layer.attn_out(o)
            h = h + layer.ffn(h)
        cache.commit(c)
        return h
