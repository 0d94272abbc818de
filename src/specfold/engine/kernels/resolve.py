"""Kernel 2 (SPEC §5): source resolution along fold chains.

Dims: ``K`` branches (``parents[k] < k``), ``N`` block positions.

A folded (branch, position) holds its parent's table entry, which may itself be inherited. One program per
(branch ``i``, block of positions) walks the chain hop by hop — ``j ← par(j)`` while ``(j, n)`` is folded —
to the nearest recomputed ancestor (self included); at most ``i`` hops, since ``par(j) < j`` and the main branch
recomputes everything. It writes that source and the source's slot, i.e. the pool row (branch, position) holds.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specfold.engine.kernels._common import LaunchConfig, check, check_device, check_tensor, launch, pow2


@triton.jit
def _resolve_sources_kernel(
    rec_ptr, par_ptr, slot_ptr, src_ptr, table_ptr,
    N,
    BLOCK_N: tl.constexpr,
):
    i = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    msk = offs < N
    cur = tl.zeros([BLOCK_N], dtype=tl.int64) + i
    for _ in range(i):  # depth(i) ≤ i hops reach the main branch
        r = tl.load(rec_ptr + cur * N + offs, mask=msk, other=1)
        p = tl.load(par_ptr + cur, mask=msk & (r == 0), other=0)
        cur = tl.where(r != 0, cur, p)
    tl.store(src_ptr + i * N + offs, cur, mask=msk)
    tl.store(table_ptr + i * N + offs, tl.load(slot_ptr + cur * N + offs, mask=msk, other=-1), mask=msk)


def resolve_config(k: int, n: int) -> LaunchConfig:
    """Grid ``(K, ⌈N / BLOCK_N⌉)``: a branch's whole block in one program (up to 1024 positions)."""
    block = min(pow2(n, 16), 1024)
    return LaunchConfig(grid=(k, triton.cdiv(n, block)), tiles={"BLOCK_N": block})


def resolve_sources(
    recompute: torch.Tensor,  # [K, N] bool, row 0 all True
    parents: torch.Tensor,  # [K] long, parents[0] = -1
    slot: torch.Tensor,  # [K, N] int: pool slot of each recomputed (branch, position); ignored where folded
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``src [K, N]`` long (nearest recomputing ancestor, self included) and ``table [K, N]`` long (the
    source's slot: the pool row each (branch, position) holds)."""
    check_tensor("recompute", recompute, 2, (torch.bool,))
    k, n = recompute.shape
    check_tensor("parents", parents, 1, (torch.int64, torch.int32))
    check(parents.shape[0] == k, f"parents has {parents.shape[0]} entries for {k} branches")
    check_tensor("slot", slot, 2, (torch.int32, torch.int64))
    check(tuple(slot.shape) == (k, n), f"slot must be [{k}, {n}], got {tuple(slot.shape)}")
    check_device(recompute, parents, slot)
    src = torch.empty(k, n, dtype=torch.long, device=recompute.device)
    table = torch.empty(k, n, dtype=torch.long, device=recompute.device)
    launch(
        _resolve_sources_kernel, resolve_config(k, n),
        recompute.to(torch.int8).contiguous(), parents.to(torch.int64).contiguous(), slot.contiguous(), src, table, n,
    )
    return src, table
