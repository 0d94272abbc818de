"""Counting what a piece of code dispatches: framework ops, and the ops that wait for a host value (syncs).

``with OpCounter() as c: fn()`` records every ATen op that reaches the dispatcher (after autograd, so views and
in-place ops count as the kernels they are). ``c.syncs`` are the ops whose result the host must read before it can
go on — on a GPU each one drains the launch queue:

* ``aten._local_scalar_dense``: ``tensor.item()``, ``int(t)``, ``float(t)``, ``bool(t)``, ``tolist()`` of elements;
* ``aten.nonzero`` / ``aten.masked_select`` / ``aten.unique*``: a result whose *size* depends on the values;
* ``aten.is_nonzero``, ``aten.equal``: Python truth of a tensor, ``torch.equal``.

``.tolist()`` of a whole tensor reaches the dispatcher as ``_local_scalar_dense`` once per element on CPU; such a
call is counted per element here, which over-counts the syncs of one ``tolist`` (the bound a test asserts is
therefore conservative).
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

SYNC_OPS = frozenset({
    "aten._local_scalar_dense",
    "aten.nonzero",
    "aten.nonzero_static",
    "aten.masked_select",
    "aten.is_nonzero",
    "aten.equal",
    "aten._unique2",
    "aten.unique_consecutive",
    "aten.unique_dim",
})


def _name(func) -> str:
    packet = getattr(func, "overloadpacket", func)
    return f"aten.{getattr(packet, '__name__', str(packet))}"


class OpCounter(TorchDispatchMode):
    """Counts dispatched ATen ops by name; ``syncs`` counts those in :data:`SYNC_OPS`."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[_name(func)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.ops.values())

    @property
    def syncs(self) -> int:
        return sum(c for op, c in self.ops.items() if op in SYNC_OPS)

    def sync_ops(self) -> dict[str, int]:
        return {op: c for op, c in self.ops.items() if op in SYNC_OPS}


def count_ops(fn) -> OpCounter:
    """Run ``fn()`` under an :class:`OpCounter` (no grad) and return the counter."""
    counter = OpCounter()
    with torch.no_grad(), counter:
        fn()
    return counter
