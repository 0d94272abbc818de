"""Compiled dense forwards (``MethodConfig.compile``, ``--compile``): :meth:`DLLM.forward` and
:meth:`DLLM.forward_ragged` under ``torch.compile`` with dynamic shapes, shared by every verifier of one model in a
process (vanilla, spiffy and specfold's dense passes, batch-1 and batched).

The prefix length changes every block and the branch and row counts every pass, so the forwards are compiled with
``dynamic=True``: after the first call of each (one graph per static specialisation inductor makes, a few in all),
the same graphs serve every length and branch count. Each call checks dynamo's ``unique_graphs`` counter: a call
that compiled a graph adds its wall time to :attr:`CompiledForwards.compile_seconds` and the graphs to
:attr:`CompiledForwards.graphs` — what the statistics report (``FoldStats.compile_seconds``,
``FoldStats.compiled_graphs``), so that a run says what compiling cost it and how often it recompiled.

Inductor keeps compiled kernels in its on-disk cache (``TORCHINDUCTOR_CACHE_DIR``, default
``/tmp/torchinductor_$USER``): a second process skips the C++ builds but still traces (measured on this AVX2 EPYC
under load: tens of seconds per process either way — see docs/results.md, "Compiled forwards").
"""

from __future__ import annotations

import time
import weakref
from typing import Any

import torch

from specfold.model.transformer import DLLM

# NOTE: generous: one entry per static specialisation; dynamic=True keeps this to a handful per forward.
RECOMPILE_LIMIT = 16


def graphs_compiled() -> int:
    """Graphs dynamo compiled in this process so far (all callers)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


class CompiledForwards:
    """The model's two dense forwards compiled, with the compile seconds and graphs of the calls so far."""

    def __init__(self, net: DLLM) -> None:
        import torch._dynamo

        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, RECOMPILE_LIMIT)
        self._forward = torch.compile(net.forward, dynamic=True)
        self._ragged = torch.compile(net.forward_ragged, dynamic=True)
        self.compile_seconds = 0.0
        self.graphs = 0

    def _call(self, fn, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, float, int]:
        before = graphs_compiled()
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        new = graphs_compiled() - before
        seconds = time.perf_counter() - t0 if new else 0.0
        self.compile_seconds += seconds
        self.graphs += new
        return out, seconds, new

    def forward(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, float, int]:
        """:meth:`DLLM.forward`'s result, and the seconds and graphs this call spent compiling."""
        return self._call(self._forward, *args, **kwargs)

    def forward_ragged(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, float, int]:
        """:meth:`DLLM.forward_ragged`'s result, and the seconds and graphs this call spent compiling."""
        return self._call(self._ragged, *args, **kwargs)


_OF: weakref.WeakKeyDictionary[DLLM, CompiledForwards] = weakref.WeakKeyDictionary()


def compiled_forwards(net: DLLM) -> CompiledForwards:
    """The model's compiled forwards, made once per model object and process."""
    if net not in _OF:
        _OF[net] = CompiledForwards(net)
    return _OF[net]
