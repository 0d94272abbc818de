"""CUDA-graph capture of a whole folded verification pass (triton backend), one graph per (branches, block length,
prefix-length bucket), replayed with new states.

Dims: ``K`` branches, ``N`` block positions, ``P`` live prefix length, ``B`` its bucket (``P`` rounded up to a
multiple of ``bucket``, at most the cache capacity), ``V`` vocabulary.

The triton pass issues no host sync (:mod:`specfold.engine.triton_backend`), so it can be captured as it is. What
changes from one pass to the next lives in static device buffers that each replay refills: the states, the parents,
the RoPE tables of the block positions and the prefix length (``prefix_len``, a device scalar: the attention
kernel reads the first ``P`` keys of a ``B``-key view of the cache). The captured graph reads the cache's storage
directly, so a cache that grows (new storage) drops the graphs of the old one. After the replay the statistics are
read once (:func:`~specfold.engine.stats.fold_stats`) — the pass's one host sync — and the logits copied out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specfold.engine.base import VerifyResult
from specfold.engine.folded import FoldedVerifier
from specfold.engine.gate import safe_parents
from specfold.engine.layer_types import LayerCounts
from specfold.engine.stats import fold_stats
from specfold.engine.triton_backend import GraphContext
from specfold.model.cache import PrefixCache

DEFAULT_BUCKET = 256  # prefix lengths per captured graph; attention work scales with the live length, not B


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    states: torch.Tensor  # [K, N] long
    parents: torch.Tensor  # [K] long, as given (validated from the one host read)
    cos: torch.Tensor  # [N, D]
    sin: torch.Tensor  # [N, D]
    qscale: torch.Tensor | None  # [N]
    prefix_len: torch.Tensor  # [1] int32
    logits: torch.Tensor  # [K, N, V]
    counts: list[LayerCounts]


class GraphedVerifier:
    """A :class:`~specfold.engine.folded.FoldedVerifier` with ``backend="triton"`` on CUDA, replayed from CUDA
    graphs; same :meth:`verify` results as the eager verifier (tested under ``-m gpu``). ``graphs`` counts the
    captured graphs (one per (K, N, bucket))."""

    def __init__(self, folded: FoldedVerifier, bucket: int = DEFAULT_BUCKET) -> None:
        if folded.cfg.backend != "triton":
            raise ValueError(f"CUDA graphs capture the triton backend's pass, got backend={folded.cfg.backend!r}")
        if folded.net.device.type != "cuda":
            raise ValueError(f"CUDA graphs need the model on a CUDA device, got {folded.net.device}")
        if bucket < 1:
            raise ValueError(f"bucket must be a positive number of prefix positions, got {bucket}")
        self.folded, self.bucket = folded, bucket
        self._graphs: dict[tuple[int, int, int], _Captured] = {}
        self._storage: tuple[int, int] | None = None
        self._pool = torch.cuda.graph_pool_handle()

    @property
    def graphs(self) -> int:
        return len(self._graphs)

    def _bucket(self, cache: PrefixCache) -> int:
        return min(-(-cache.length // self.bucket) * self.bucket, cache.capacity)

    @torch.no_grad()
    def verify(
        self,
        cache: PrefixCache,
        states: torch.Tensor,  # [K, N]
        parents: torch.Tensor,  # [K] long, parents[0] = -1
    ) -> VerifyResult:
        storage = (cache.k.data_ptr(), cache.v.data_ptr())
        if storage != self._storage:  # a new (or grown) cache: the graphs read the old storage
            self._graphs.clear()
            self._storage = storage
        k, n = states.shape
        key = (k, n, self._bucket(cache))
        cap = self._graphs.get(key)
        if cap is None:
            cap = self._graphs[key] = self._capture(cache, states, parents, key[2])
        self._load(cap, cache, states, parents)
        cap.graph.replay()
        return VerifyResult(cap.logits.clone(), fold_stats(cap.counts, cap.parents, n))

    def _load(self, cap: _Captured, cache: PrefixCache, states: torch.Tensor, parents: torch.Tensor) -> None:
        cos, sin, qscale = self.folded.net.rope_tables(cache.start, states.shape[1])
        cap.states.copy_(states, non_blocking=True)
        cap.parents.copy_(parents, non_blocking=True)
        cap.cos.copy_(cos)
        cap.sin.copy_(sin)
        if qscale is not None:
            cap.qscale.copy_(qscale)
        cap.prefix_len.fill_(cache.length)

    def _capture(self, cache: PrefixCache, states: torch.Tensor, parents: torch.Tensor, bucket: int) -> _Captured:
        net = self.folded.net
        dev = net.device
        cos, sin, qscale = net.rope_tables(cache.start, states.shape[1])
        static = dict(
            states=states.to(dev, torch.long).clone(), parents=parents.to(dev, torch.long).clone(),
            cos=cos.clone(), sin=sin.clone(), qscale=None if qscale is None else qscale.clone(),
            prefix_len=torch.tensor([cache.length], dtype=torch.int32, device=dev),
        )
        prefixes = [(cache.k[i, :, :bucket], cache.v[i, :, :bucket]) for i in range(len(net.layers))]

        def body():
            ctx = GraphContext(cos=static["cos"], sin=static["sin"], qscale=static["qscale"], scale=net.scale,
                               parents=safe_parents(static["parents"]), prefix_len=static["prefix_len"])
            logits, counts, _ = self.folded.forward(static["states"], ctx, prefixes)
            return logits, counts

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # compiles every kernel before capture
            body()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            logits, counts = body()
        return _Captured(graph=graph, logits=logits, counts=counts, **static)
