"""The prefix KV cache: prompt + finished blocks, one copy shared by every branch of a verification pass.

Dims: ``L`` layers, ``Hkv`` key/value heads, ``C`` capacity, ``P`` cached length, ``T`` rows being appended,
``D`` head dim.

Branches never get their own copy: :meth:`PrefixCache.layer` returns views ``[Hkv, P, D]`` and
:meth:`PrefixCache.expanded` a zero-copy ``[B, Hkv, P, D]`` broadcast view for consumers that want a batch dim.
Appending is two-phase so that every layer of one forward sees the same prefix: ``write`` stores a layer's rows
past the current length, ``commit`` makes them visible once the forward is done.

Size the cache once (:meth:`reserve`, or the capacity given at construction): growing copies the committed rows
into a larger buffer, so for a moment both are alive.
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
        self.window_start: int | None = None

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    @property
    def start(self) -> int:
        """The absolute position of the rows a forward runs over this cache: ``window_start`` when set (Fast-dLLM
        v1's dual cache holds the suffix keys after the prefix, so the block starts before the cache's end), else
        the cached length."""
        return self.length if self.window_start is None else self.window_start

    def layer(self, layer: int, pending: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Views ``(k [Hkv, P, D], v [Hkv, P, D])`` of the committed prefix of one layer; with ``pending`` they
        also cover that many rows written past it but not yet committed (``P = length + pending``)."""
        end = self.length + pending
        return self.k[layer, :, :end], self.v[layer, :, :end]

    def expanded(self, layer: int, branches: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Zero-copy ``[B, Hkv, P, D]`` views (stride 0 over branches)."""
        k, v = self.layer(layer)
        return k.expand(branches, *k.shape), v.expand(branches, *v.shape)

    def reserve(self, total: int) -> None:
        """Make room for ``total`` rows in all, in one step (no-op when the capacity suffices)."""
        if total > self.capacity:
            self._resize(total)

    def _ensure(self, extra: int) -> None:
        need = self.length + extra
        if need > self.capacity:
            self._resize(max(need, 2 * self.capacity))

    def _resize(self, capacity: int) -> None:
        # One buffer at a time: k's old copy is released before v's new one is allocated.
        for name in ("k", "v"):
            old = getattr(self, name)
            new = old.new_zeros(*old.shape[:2], capacity, old.shape[3])
            new[:, :, : old.shape[2]] = old
            setattr(self, name, new)
            del old, new

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store rows past the committed length. k, v: ``[T, Hkv, D]``."""
        t = k.shape[0]
        self._ensure(t)
        self.k[layer, :, self.length : self.length + t] = k.transpose(0, 1)
        self.v[layer, :, self.length : self.length + t] = v.transpose(0, 1)

    def commit(self, rows: int) -> None:
        self.length += rows


class BatchCache:
    """Prefix caches of up to ``S`` requests in one buffer ``[L, S, Hkv, C, D]`` with a length per slot.

    :meth:`slot` is a :class:`PrefixCache` view of one slot (prefill writes through it unchanged); batched
    forwards read every slot's prefix as one padded view and mask each past its own length. The capacity is fixed
    (a slot view cannot grow).
    """

    def __init__(
        self,
        num_layers: int,
        slots: int,
        num_kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        self.k = torch.zeros(num_layers, slots, num_kv_heads, capacity, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.views = [self._view(s) for s in range(slots)]

    def _view(self, s: int) -> PrefixCache:
        view = PrefixCache.__new__(PrefixCache)
        view.k, view.v, view.length, view.window_start = self.k[:, s], self.v[:, s], 0, None
        return view

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    def slot(self, s: int) -> PrefixCache:
        return self.views[s]

    def reset(self, s: int) -> None:
        self.views[s].length = 0
        self.views[s].window_start = None

    def write(
        self,
        layer: int,
        slots: torch.Tensor,  # [R] long
        positions: torch.Tensor,  # [R, T] long
        k: torch.Tensor,  # [R, T, Hkv, D]
        v: torch.Tensor,  # [R, T, Hkv, D]
    ) -> None:
        """Store each request's rows at its own positions (lengths are advanced by the caller's views)."""
        self.k[layer][slots[:, None], :, positions] = k
        self.v[layer][slots[:, None], :, positions] = v
