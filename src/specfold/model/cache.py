"""The prefix KV cache: prompt + finished blocks, one copy shared by every branch of a verification pass.

Dims: ``L`` layers, ``Hkv`` key/value heads, ``C`` capacity, ``P`` cached length, ``T`` rows being appended,
``D`` head dim.

Branches never get their own copy: :meth:`PrefixCache.layer` returns views ``[Hkv, P, D]`` and
:meth:`PrefixCache.expanded` a zero-copy ``[B, Hkv, P, D]`` broadcast view for consumers that want a batch dim.
Appending is two-phase so that every layer of one forward sees the same prefix: ``write`` stores a layer's rows
past the current length, ``commit`` makes them visible once the forward is done.
"""

from __future__ import annotations

import torch


class PrefixCache:
    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        self.k = torch.zeros(num_layers, num_kv_heads, capacity, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views ``(k [Hkv, P, D], v [Hkv, P, D])`` of the committed prefix of one layer."""
        return self.k[layer, :, : self.length], self.v[layer, :, : self.length]

    def expanded(self, layer: int, branches: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Zero-copy ``[B, Hkv, P, D]`` views (stride 0 over branches)."""
        k, v = self.layer(layer)
        return k.expand(branches, *k.shape), v.expand(branches, *v.shape)

    def _ensure(self, extra: int) -> None:
        need = self.length + extra
        if need <= self.capacity:
            return
        new_cap = max(need, 2 * self.capacity)
        grow = new_cap - self.capacity
        pad = torch.zeros(*self.k.shape[:2], grow, self.k.shape[3], dtype=self.k.dtype, device=self.k.device)
        self.k = torch.cat([self.k, pad], dim=2)
        self.v = torch.cat([self.v, pad.clone()], dim=2)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store rows past the committed length. k, v: ``[T, Hkv, D]``."""
        t = k.shape[0]
        self._ensure(t)
        self.k[layer, :, self.length : self.length + t] = k.transpose(0, 1)
        self.v[layer, :, self.length : self.length + t] = v.transpose(0, 1)

    def commit(self, rows: int) -> None:
        self.length += rows
