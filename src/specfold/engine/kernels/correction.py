"""Kernel 5 (SPEC §5): the Eq. 8 correction of folded rows, with the cancellation guard.

Dims: ``K`` branches, ``N`` block positions, ``R`` pool rows (recomputed rows of the layer), ``Hq``/``Hkv`` heads
(GQA group ``G``), ``D`` head dim.

One order-free launch over all branches: program (branch ``i``, block of positions); recomputed rows are masked. A
folded row holds its source ``a = src[i, n]``'s query and ``(m, Z, O)`` (pool row ``table[i, n]``). Branch ``i``'s
block K/V differs from ``a``'s exactly where their table rows differ — ``Δ = {p : table[i, p] ≠ table[a, p]}``,
which is the union of the recomputed sets along the fold chain ``a → i`` (each hop of the chain either keeps a
position's pool row or replaces it) — so ``Δ`` comes from comparing the two table rows; the removed terms are found
by walking ``i``'s fold chain ancestor by ancestor (a row's source is one of them), and Eq. 8 is applied once over
``Δ`` (equivalent to hop by hop, with one subtraction instead of one per hop)::

    m' = max(m, max_{p∈Δ} s'_p)
    Z' = e^{m−m'} Z − Σ_{p∈Δ} e^{s_p−m'} + Σ_{p∈Δ} e^{s'_p−m'}
    O' = ( e^{m−m'} Z·O − Σ_{p∈Δ} e^{s_p−m'} v_a[p] + Σ_{p∈Δ} e^{s'_p−m'} v_i[p] ) / Z'

Rows with ``Δ = ∅`` keep their source's state and are marked 0; corrected rows are marked 1, and 2 when the
guard of :mod:`specfold.engine.correction` fires (removed mass ≥ ``guard · e^{m−m'}Z`` in any head; the caller
recomputes those by direct attention). Scores use the attention kernel's dot policy, so the removed terms match
what the source accumulated; the signed P·V sums run in fp32.
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
    dot,
    launch,
    native_dot,
    pow2,
)
from specfold.engine.reference import FoldCorrection


@triton.jit
def _scores(q_ptr, q_off, q_mask, k_ptr, k_off, k_mask, D, D_P: tl.constexpr, BLOCK_D: tl.constexpr,
            M: tl.constexpr, N_P: tl.constexpr, NATIVE: tl.constexpr):
    """``q · kᵀ`` ``[M, N_P]`` fp32 for query rows at element offsets ``q_off [M]`` and key rows at ``k_off [N_P]``,
    over the head dim in chunks of ``BLOCK_D``. NOTE: chunked so that an fp32 (FMA) dot holds ``BLOCK_D``, not
    ``D``, operand columns per thread: the whole-``D`` dot spilled kilobytes at D = 128 (compile check)."""
    s = tl.zeros([M, N_P], dtype=tl.float32)
    for d0 in tl.static_range(0, D_P, BLOCK_D):
        od = d0 + tl.arange(0, BLOCK_D)
        md = od < D
        qc = tl.load(q_ptr + q_off[:, None] + od[None, :], mask=q_mask[:, None] & md[None, :], other=0.0)
        kc = tl.load(k_ptr + k_off[None, :] + od[:, None], mask=k_mask[None, :] & md[:, None], other=0.0)
        s += dot(qc, kc, NATIVE)
    return s


@triton.jit
def _correct_folded_kernel(
    q_ptr, m_ptr, z_ptr, o_ptr, kp_ptr, vp_ptr, table_ptr, src_ptr, rec_ptr, par_ptr,
    mo_ptr, zo_ptr, oo_ptr, flag_ptr,
    N, HKV, scale, guard,
    stride_qr, stride_kr, stride_kh, stride_vr, stride_vh,
    HQ: tl.constexpr, G: tl.constexpr, G_P: tl.constexpr, D: tl.constexpr, D_P: tl.constexpr,
    N_P: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, NATIVE: tl.constexpr,
):
    i = tl.program_id(0)
    if tl.load(par_ptr + i) < 0:  # a main branch (a root) never folds
        return
    idx = tl.arange(0, BLOCK_R * G_P)  # tile row = (position, group head)
    n = tl.program_id(1) * BLOCK_R + idx // G_P
    g = idx % G_P
    mn = n < N
    f = i * N + n
    folded = mn & (tl.load(rec_ptr + f, mask=mn, other=1) == 0)
    a = tl.load(src_ptr + f, mask=folded, other=0)
    srow = tl.load(table_ptr + f, mask=folded, other=0).to(tl.int64)  # the source's pool row: q and (m, Z, O)
    offs_p = tl.arange(0, N_P)
    mp = offs_p < N
    ti = tl.load(table_ptr + i * N + offs_p, mask=mp, other=0).to(tl.int64)  # branch i's block, shared by the tile
    ta = tl.load(table_ptr + a[:, None] * N + offs_p[None, :], mask=folded[:, None] & mp[None, :], other=0)
    dl = folded[:, None] & mp[None, :] & (ti[None, :] != ta)  # Δ(i, a) per tile row
    has = tl.sum(dl.to(tl.int32), axis=1) > 0
    live = has & (g < G)
    if tl.max(live.to(tl.int32), axis=0) == 0:
        return
    offs_d = tl.arange(0, D_P)
    md = offs_d < D
    hit = tl.zeros([BLOCK_R * G_P], dtype=tl.int32)
    for hk in range(HKV):
        head = hk * G + g
        q_off = srow * stride_qr + head * D  # [M] the tile rows' queries (their source's pool rows)
        s_new = _scores(q_ptr, q_off, live, kp_ptr, ti * stride_kr + hk * stride_kh, mp, D, D_P, BLOCK_D,
                        BLOCK_R * G_P, N_P, NATIVE)
        s_new = tl.where(dl, s_new * scale, float("-inf"))  # s'_p on Δ
        m = tl.load(m_ptr + srow * HQ + head, mask=live, other=0.0)
        z = tl.load(z_ptr + srow * HQ + head, mask=live, other=1.0)
        m_new = tl.maximum(m, tl.max(s_new, axis=1))
        kept = tl.exp(m - m_new) * z
        e_add = tl.exp(s_new - m_new[:, None])
        v_i = tl.load(vp_ptr + ti[:, None] * stride_vr + hk * stride_vh + offs_d[None, :],
                      mask=mp[:, None] & md[None, :], other=0.0)
        dv = dot(e_add, v_i, False)  # fp32: the subtraction below must not lose mass
        removed = tl.zeros([BLOCK_R * G_P], dtype=tl.float32)
        # Walk the fold chain of i: every source is a strict ancestor, and the ancestor b's keys serve the tile
        # rows whose source is b (s_p = q·k_a[p] on Δ).
        b = i.to(tl.int64)  # parents are int64: the loop-carried branch keeps one type (a GPU compile needs it)
        nb = tl.load(par_ptr + b)
        while nb >= 0:  # up to the root (the main branch of i's request)
            b = nb
            nb = tl.load(par_ptr + b)
            tb = tl.load(table_ptr + b * N + offs_p, mask=mp, other=0).to(tl.int64)
            s_old = _scores(q_ptr, q_off, live, kp_ptr, tb * stride_kr + hk * stride_kh, mp, D, D_P, BLOCK_D,
                            BLOCK_R * G_P, N_P, NATIVE)
            sel = dl & (a == b)[:, None]
            e_rem = tl.where(sel, tl.exp(s_old * scale - m_new[:, None]), 0.0)
            v_b = tl.load(vp_ptr + tb[:, None] * stride_vr + hk * stride_vh + offs_d[None, :],
                          mask=mp[:, None] & md[None, :], other=0.0)
            removed += tl.sum(e_rem, axis=1)
            dv -= dot(e_rem, v_b, False)
        z_new = kept - removed + tl.sum(e_add, axis=1)
        # NOTE: the source's O is read only now, not beside m and Z: one [M, D] fp32 tile fewer live in registers
        # through the chain walk (the compile check saw spills otherwise)
        o = tl.load(o_ptr + (srow * HQ + head)[:, None] * D + offs_d[None, :], mask=live[:, None] & md[None, :],
                    other=0.0)
        o_new = (kept[:, None] * o + dv) / tl.where(live, z_new, 1.0)[:, None]
        hit = tl.maximum(hit, (live & (removed >= guard * kept)).to(tl.int32))
        tl.store(mo_ptr + f * HQ + head, m_new, mask=live)
        tl.store(zo_ptr + f * HQ + head, z_new, mask=live)
        tl.store(oo_ptr + (f * HQ + head)[:, None] * D + offs_d[None, :], o_new, mask=live[:, None] & md[None, :])
    # guard: any head of the row; reduce over the group heads of each position
    hit_row = tl.max(tl.reshape(hit, [BLOCK_R, G_P]), axis=1)
    has_row = tl.max(tl.reshape(has.to(tl.int32), [BLOCK_R, G_P]), axis=1)
    n_row = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    tl.store(flag_ptr + i * N + n_row, (1 + hit_row).to(tl.int8), mask=(has_row > 0) & (n_row < N))


def correction_config(k: int, n: int, group: int, d: int) -> LaunchConfig:
    """Grid ``(K, ⌈N / BLOCK_R⌉)``: ``BLOCK_R`` positions of one branch × the group heads of a kv head per tile."""
    g_p = pow2(group)
    # NOTE: a program takes BLOCK_R positions of one branch × the group heads of a kv head as its M dim (≥ 16,
    # the MMA minimum): the branch's block keys are shared by the tile, and each ancestor on the fold chain is
    # one more [M, N] score tile. Kv heads loop inside, so the guard's "any head" stays program-local. The signed
    # P·V sums are fp32 FMA dots whose operands sit in registers: M = 16 rows over 8 warps, and scores in head-dim
    # chunks of BLOCK_D, hold the kernel at 255 registers with at most a few bytes of spill at D = 128 (64 rows
    # and whole-D dots spilled kilobytes: `specfold bench kernels --compile-only`).
    block_r = max(pow2(16 // g_p), min(pow2(n), 16 // g_p))
    return LaunchConfig(grid=(k, triton.cdiv(n, block_r)), tiles={"BLOCK_R": block_r, "BLOCK_D": min(pow2(d, 16), 32)},
                        num_warps=8)


def correct_folded(
    q: torch.Tensor,  # [R, Hq, D] query pool
    m: torch.Tensor,  # [R, Hq] fp32 pool rows' running max
    z: torch.Tensor,  # [R, Hq] fp32 denominators
    o: torch.Tensor,  # [R, Hq, D] fp32 normalised outputs
    pool_k: torch.Tensor,  # [R, Hkv, D] block key pool
    pool_v: torch.Tensor,  # [R, Hkv, D]
    table: torch.Tensor,  # [K, N] int: pool row each (branch, position) holds
    src: torch.Tensor,  # [K, N] int: nearest recomputing ancestor of each (branch, position)
    recompute: torch.Tensor,  # [K, N] bool
    parents: torch.Tensor,  # [K] long, parents[0] = -1
    scale: float,
    guard: float,
) -> FoldCorrection:
    """Eq. 8 for every folded row whose block context changed, all branches in one launch."""
    check_tensor("q", q, 3, SUPPORTED_DTYPES)
    check_inner_contiguous("q", q)
    r, hq, d = q.shape
    check(q.stride(1) == d, "q must be contiguous over heads and head dim")
    for name, t in (("m", m), ("z", z)):
        check_tensor(name, t, 2, (torch.float32,))
        check(tuple(t.shape) == (r, hq) and t.is_contiguous(), f"{name} must be a contiguous [{r}, {hq}]")
    check_tensor("o", o, 3, (torch.float32,))
    check(tuple(o.shape) == (r, hq, d) and o.is_contiguous(), f"o must be a contiguous [{r}, {hq}, {d}]")
    check_tensor("pool_k", pool_k, 3, (q.dtype,))
    check_tensor("pool_v", pool_v, 3, (q.dtype,))
    check(pool_k.shape == pool_v.shape and pool_k.shape[0] == r and pool_k.shape[2] == d,
          f"pool_k/pool_v must be [{r}, Hkv, {d}]")
    check_inner_contiguous("pool_k", pool_k)
    check_inner_contiguous("pool_v", pool_v)
    hkv = pool_k.shape[1]
    check(hq % hkv == 0, f"Hq {hq} must be a multiple of Hkv {hkv}")
    check_tensor("table", table, 2, (torch.int32, torch.int64))
    k, n = table.shape
    check_tensor("src", src, 2, (torch.int32, torch.int64))
    check_tensor("recompute", recompute, 2, (torch.bool,))
    check(tuple(src.shape) == (k, n) and tuple(recompute.shape) == (k, n), f"src/recompute must be [{k}, {n}]")
    check_tensor("parents", parents, 1, (torch.int32, torch.int64))
    check(parents.shape[0] == k, f"parents must be [{k}], got {tuple(parents.shape)}")
    check(0.0 < guard <= 1.0, f"guard must be in (0, 1], got {guard}")
    check_device(q, m, z, o, pool_k, pool_v, table, src, recompute, parents)
    dev = q.device
    mo = torch.empty(k * n, hq, dtype=torch.float32, device=dev)
    zo = torch.empty(k * n, hq, dtype=torch.float32, device=dev)
    oo = torch.empty(k * n, hq, d, dtype=torch.float32, device=dev)
    flag = torch.zeros(k * n, dtype=torch.int8, device=dev)
    g = hq // hkv
    launch(
        _correct_folded_kernel, correction_config(k, n, g, d),
        q, m, z, o, pool_k, pool_v, table.contiguous(), src.contiguous(), recompute.to(torch.int8).contiguous(),
        parents.to(torch.int64).contiguous(), mo, zo, oo, flag,
        n, hkv, float(scale), float(guard),
        q.stride(0), pool_k.stride(0), pool_k.stride(1), pool_v.stride(0), pool_v.stride(1),
        HQ=hq, G=g, G_P=pow2(g), D=d, D_P=pow2(d, 16), N_P=pow2(n, 16), NATIVE=native_dot(q.dtype),
    )
    return FoldCorrection(m=mo, z=zo, o=oo, flag=flag)
