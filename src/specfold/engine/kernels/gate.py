"""Kernel 1 (SPEC §5): the fold gate (Eq. 4/5) and atomic compaction of the recomputed rows.

Dims: ``K`` branches (row 0 = main, ``parents[k] < k``), ``N`` block positions, ``E`` hidden size, ``R`` recomputed
rows of the layer (≤ ``K·N``).

One program per (branch ``i``, position ``n``) (or per block of positions, see :func:`gate_compact`) computes ρ (Eq.
4) in fp64 — differences and squares of bf16/fp32 values are exact or far from underflow there, so at δ = 0 only
bit-identical rows fold, as in :func:`specfold.engine.gate.relative_residual` — the recompute flag (Eq. 5; the main
branch always recomputes), the one-hop source (self, or the parent when folded), and for a recomputed row a slot in
the layer's global row list and in its branch's list, both taken from atomic counters.

The order inside either list depends on scheduling: consumers index by slot (``slot[i, n]``) or treat the lists
as sets, never as sorted.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specfold.engine.kernels._common import (
    SUPPORTED_DTYPES,
    LaunchConfig,
    check,
    check_device,
    check_inner_contiguous,
    check_tensor,
    interpreting,
    launch,
    pow2,
)
from specfold.engine.reference import GateCompact


@triton.jit
def _gate_compact_kernel(
    h_ptr, par_ptr, fold_ptr,
    rho_ptr, rec_ptr, hop_ptr, slot_ptr, rows_ptr, blist_ptr, bcount_ptr, count_ptr,
    N, E, stride_hk, stride_hn, delta,
    HAS_FOLD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr,
):
    i = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mn = n < N
    flat = i * N + n
    par = tl.load(par_ptr + i)
    pc = tl.maximum(par, 0)
    row = h_ptr + i.to(tl.int64) * stride_hk + n[:, None] * stride_hn
    prow = h_ptr + pc.to(tl.int64) * stride_hk + n[:, None] * stride_hn
    num = tl.zeros([BLOCK_N, BLOCK_E], dtype=tl.float64)
    den = tl.zeros([BLOCK_N, BLOCK_E], dtype=tl.float64)
    for e0 in range(0, E, BLOCK_E):
        offs = e0 + tl.arange(0, BLOCK_E)
        msk = mn[:, None] & (offs[None, :] < E)
        x = tl.load(row + offs[None, :], mask=msk, other=0.0).to(tl.float64)
        y = tl.load(prow + offs[None, :], mask=msk, other=0.0).to(tl.float64)
        d = x - y
        num += d * d
        den += y * y
    num_s = tl.sqrt(tl.sum(num, axis=1))
    den_s = tl.sqrt(tl.sum(den, axis=1))
    # Eq. 4; a zero-norm parent folds only on an exact match (as in engine/gate.py)
    inf = float("inf")
    rho = tl.where(den_s == 0.0, tl.where(num_s == 0.0, 0.0, inf), num_s / tl.where(den_s == 0.0, 1.0, den_s))
    rho = tl.where(par < 0, inf, rho)  # a root: a request's main branch
    if HAS_FOLD:
        folded = tl.load(fold_ptr + flat, mask=mn, other=0) != 0
    else:
        folded = rho <= delta  # Eq. 5
    folded = folded & (par >= 0)
    rec = (~folded) & mn
    tl.store(rho_ptr + flat, rho, mask=mn)
    tl.store(rec_ptr + flat, rec.to(tl.int8), mask=mn)
    tl.store(hop_ptr + flat, tl.where(folded, pc, i).to(tl.int64), mask=mn)
    # NOTE: one atomic per program and list, not per row: the program's recomputed rows take consecutive slots
    # (exclusive prefix sum of the flags); with BLOCK_N = 1 this is exactly one atomic per (branch, position).
    r32 = rec.to(tl.int32)
    nrec = tl.sum(r32, axis=0)
    before = tl.cumsum(r32, axis=0) - r32
    base = tl.atomic_add(count_ptr, nrec)
    bbase = tl.atomic_add(bcount_ptr + i, nrec)
    slot = base + before
    tl.store(slot_ptr + flat, tl.where(rec, slot, -1), mask=mn)
    tl.store(rows_ptr + slot, flat, mask=rec)
    tl.store(blist_ptr + i * N + bbase + before, n, mask=rec)


def gate_config(k: int, n: int, e: int, positions_per_program: int | None = None) -> LaunchConfig:
    """Grid ``(K, ⌈N / BLOCK_N⌉)``; ``BLOCK_N`` positions per program (default: 1 on a GPU, as SPEC §5; the whole
    block in the interpreter, where every program costs milliseconds); ``BLOCK_E`` hidden entries per step."""
    if positions_per_program is None:
        positions_per_program = pow2(n) if interpreting() else 1
    bn = positions_per_program
    check(bn >= 1 and bn & (bn - 1) == 0, f"positions_per_program must be a power of two, got {bn}")
    # NOTE: two fp64 accumulators of BLOCK_N × BLOCK_E live in registers; 4096 entries per program keeps them at
    # 64 doubles a thread (4 warps) with no spill, and a 4096-wide row in one step.
    block_e = min(pow2(e, 16), max(16, 4096 // bn))
    return LaunchConfig(grid=(k, triton.cdiv(n, bn)), tiles={"BLOCK_N": bn, "BLOCK_E": block_e})


def gate_compact(
    h: torch.Tensor,  # [K, N, E] layer input of every branch
    parents: torch.Tensor,  # [K] long, parents[0] = -1
    delta: float,
    fold: torch.Tensor | None = None,  # [K, N] bool: imposed fold decisions instead of Eq. 5 (benchmarks)
    positions_per_program: int | None = None,
) -> GateCompact:
    """Eq. 4/5 and compaction of one layer (see the module docstring). ``positions_per_program`` (a power of two)
    defaults to 1 on a GPU — one program per (branch, position), as SPEC §5 — and to the whole block in the
    interpreter, where every program costs milliseconds."""
    check_tensor("h", h, 3, SUPPORTED_DTYPES + (torch.float64,))
    check_inner_contiguous("h", h)
    k, n, e = h.shape
    check_tensor("parents", parents, 1, (torch.int64, torch.int32))
    check(parents.shape[0] == k, f"parents has {parents.shape[0]} entries for {k} branches")
    if fold is not None:
        check_tensor("fold", fold, 2, (torch.bool,))
        check(tuple(fold.shape) == (k, n), f"fold must be [{k}, {n}], got {tuple(fold.shape)}")
    check_device(h, parents, fold)
    dev = h.device
    rho = torch.empty(k, n, dtype=torch.float64, device=dev)
    rec = torch.empty(k, n, dtype=torch.int8, device=dev)
    hop = torch.empty(k, n, dtype=torch.long, device=dev)
    slot = torch.empty(k, n, dtype=torch.int32, device=dev)
    rows = torch.full((k * n,), -1, dtype=torch.int32, device=dev)
    blist = torch.full((k, n), -1, dtype=torch.int32, device=dev)
    bcount = torch.zeros(k, dtype=torch.int32, device=dev)
    count = torch.zeros(1, dtype=torch.int32, device=dev)
    fold_i8 = fold.to(torch.int8).contiguous() if fold is not None else rec  # dummy pointer when unused
    launch(
        _gate_compact_kernel, gate_config(k, n, e, positions_per_program),
        h, parents.contiguous(), fold_i8, rho, rec, hop, slot, rows, blist, bcount, count,
        n, e, h.stride(0), h.stride(1), float(delta),
        HAS_FOLD=fold is not None,
    )
    return GateCompact(rho, rec.bool(), hop, slot, rows, blist, bcount, count)
