"""Kernel 4 (SPEC §5): streaming attention for listed block rows, keeping ``(m, Z, O)`` per row and head.

Dims: ``K`` branches, ``N`` block positions, ``P`` prefix length, ``Hq``/``Hkv`` heads (GQA group ``G``), ``D``
head dim, ``Rq`` query pool rows, ``Rk`` key/value pool rows, ``Ro`` output rows.

Which rows: per branch ``i`` a list of positions ``lists[i, :counts[i]]`` (from the gate's atomic compaction, any
order). Row (i, n) takes its query from pool row ``qrow[i, n]`` and writes its state to output row
``orow[i, n]``; its keys are the shared prefix and branch ``i``'s block, gathered from the K/V pool through
``table[i, :]`` (no per-branch K/V copy). The prefix is read through its strides: ``[Hkv, P, D]``, or the
``[K, Hkv, P, D]`` zero-copy broadcast view of :meth:`~specfold.model.cache.PrefixCache.expanded` (stride 0 over
branches) — never materialised per branch.

Program ``(branch, row block, kv head)``: the ``BLOCK_M`` rows × ``G`` query heads of that kv head share every
key tile, so a tile is ``[BLOCK_M·G, D]`` queries against ``BLOCK_N`` keys. The FlashAttention inner loop carries
``(acc, l_i, m_i)``; the final ``m = m_i``, ``Z = l_i``, ``O = acc / l_i`` are stored in fp32 — the state the
Eq. 8 correction starts from. P·V runs on P cast to the value dtype, as the torch reference does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specfold.engine.kernels._common import (
    SUPPORTED_DTYPES,
    LaunchConfig,
    cast,
    check,
    check_device,
    check_inner_contiguous,
    check_tensor,
    dot,
    fix_rounding,
    launch,
    native_dot,
    pow2,
)
from specfold.model.attention import AttnState


@triton.jit
def _attend_tile(q, m_i, l_i, acc, k_ptrs, v_ptrs, key_mask, d_mask, scale, NATIVE: tl.constexpr, FIX: tl.constexpr):
    """One key tile of the streaming softmax. ``k_ptrs [D_P, BLOCK_N]``, ``v_ptrs [BLOCK_N, D_P]``; ``d_mask [D_P]``:
    the head dim's real columns (a head dim that is not a power of two must not read its neighbour's, or past the
    pool: 0 × NaN is NaN)."""
    kt = tl.load(k_ptrs, mask=key_mask[None, :] & d_mask[:, None], other=0.0)
    s = dot(q, kt, NATIVE) * scale
    s = tl.where(key_mask[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # padding rows see no key; keep them NaN-free
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v = tl.load(v_ptrs, mask=key_mask[:, None] & d_mask[None, :], other=0.0)
    acc = acc * alpha[:, None] + dot(cast(p, v.dtype, FIX), v, NATIVE)
    return m_new, l_i, acc


@triton.jit
def _attend_rows_kernel(
    q_ptr, qrow_ptr, list_ptr, cnt_ptr, orow_ptr, table_ptr, plen_ptr,
    pk_ptr, pv_ptr, kp_ptr, vp_ptr,
    m_ptr, z_ptr, o_ptr,
    N, P, KPR, PLEN_STRIDE, scale,
    stride_qr, stride_qh,
    stride_pkb, stride_pkh, stride_pkp, stride_pvb, stride_pvh, stride_pvp,
    stride_kr, stride_kh, stride_vr, stride_vh,
    HQ: tl.constexpr, G: tl.constexpr, G_P: tl.constexpr, D: tl.constexpr, D_P: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_PREFIX: tl.constexpr, HAS_PLEN: tl.constexpr,
    NATIVE: tl.constexpr, FIX: tl.constexpr,
):
    i = tl.program_id(0)
    mb = tl.program_id(1)
    hk = tl.program_id(2)
    cnt = tl.load(cnt_ptr + i)
    if mb * BLOCK_M >= cnt:
        return
    idx = tl.arange(0, BLOCK_M * G_P)
    j = mb * BLOCK_M + idx // G_P
    g = idx % G_P
    valid = (j < cnt) & (g < G)
    pos = tl.load(list_ptr + i * N + j, mask=valid, other=0)
    qr = tl.load(qrow_ptr + i * N + pos, mask=valid, other=0).to(tl.int64)
    head = hk * G + g
    offs_d = tl.arange(0, D_P)
    md = offs_d < D
    q = tl.load(q_ptr + qr[:, None] * stride_qr + head[:, None] * stride_qh + offs_d[None, :],
                mask=valid[:, None] & md[None, :], other=0.0)

    m_i = tl.full([BLOCK_M * G_P], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M * G_P], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M * G_P, D_P], dtype=tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    if HAS_PREFIX:
        req = i // KPR  # the request whose prefix branch i reads
        if HAS_PLEN:  # a device-side prefix length inside a longer view (per request; a CUDA-graph bucket)
            P = tl.minimum(tl.load(plen_ptr + req * PLEN_STRIDE), P)
        pk = pk_ptr + req.to(tl.int64) * stride_pkb + hk * stride_pkh
        pv = pv_ptr + req.to(tl.int64) * stride_pvb + hk * stride_pvh
        for p0 in range(0, P, BLOCK_N):
            kp = p0 + offs_n
            km = kp < P
            m_i, l_i, acc = _attend_tile(
                q, m_i, l_i, acc,
                pk + kp[None, :].to(tl.int64) * stride_pkp + offs_d[:, None],
                pv + kp[:, None].to(tl.int64) * stride_pvp + offs_d[None, :],
                km, md, scale, NATIVE, FIX,
            )
    for p0 in range(0, N, BLOCK_N):  # the branch's own block, gathered from the pool through its table row
        kp = p0 + offs_n
        km = kp < N
        kr = tl.load(table_ptr + i * N + kp, mask=km, other=0).to(tl.int64)
        m_i, l_i, acc = _attend_tile(
            q, m_i, l_i, acc,
            kp_ptr + kr[None, :] * stride_kr + hk * stride_kh + offs_d[:, None],
            vp_ptr + kr[:, None] * stride_vr + hk * stride_vh + offs_d[None, :],
            km, md, scale, NATIVE, FIX,
        )

    orow = tl.load(orow_ptr + i * N + pos, mask=valid, other=0).to(tl.int64)
    tl.store(m_ptr + orow * HQ + head, m_i, mask=valid)
    tl.store(z_ptr + orow * HQ + head, l_i, mask=valid)
    o = acc / tl.where(valid, l_i, 1.0)[:, None]
    tl.store(o_ptr + (orow * HQ + head)[:, None] * D + offs_d[None, :], o, mask=valid[:, None] & md[None, :])


def attention_config(k: int, n: int, kv_heads: int, group: int, d: int, dtype: torch.dtype) -> LaunchConfig:
    """Grid ``(K, ⌈N / BLOCK_M⌉, Hkv)``: ``BLOCK_M`` rows × the ``G`` group heads per program, keys in tiles of
    ``BLOCK_N``."""
    g_p = pow2(group)
    # NOTE: rows × group heads form the MMA's M dim (≥ 16); keys stream in tiles of 64 (32 for D > 64 to bound
    # registers). The block part is at most N keys, so the prefix dominates for P ≫ N. M = 64 (32 for fp32 tiles,
    # whose dots are FMA loops with register operands) keeps the [M, D] fp32 accumulator and the query tile in
    # registers at D = 128 with 4 warps: M = 128 spilled (`specfold bench kernels --compile-only`).
    rows = 64 if dtype in (torch.bfloat16, torch.float16) else 32
    block_m = max(pow2(16 // g_p), min(pow2(n), rows // g_p))
    block_n = 64 if d <= 64 else 32
    return LaunchConfig(grid=(k, triton.cdiv(n, block_m), kv_heads), tiles={"BLOCK_M": block_m, "BLOCK_N": block_n})


def attend_rows(
    q: torch.Tensor,  # [Rq, Hq, D] RoPE'd, query-scaled query pool
    qrow: torch.Tensor,  # [K, N] int: query pool row of (branch, position)
    lists: torch.Tensor,  # [K, N] int: positions to compute per branch; first counts[i] valid, any order
    counts: torch.Tensor,  # [K] int
    prefix_k: torch.Tensor | None,  # [Hkv, P, D], [S, Hkv, P, D] (S requests of K/S branches); None when P = 0
    prefix_v: torch.Tensor | None,  # same layout as prefix_k
    pool_k: torch.Tensor,  # [Rk, Hkv, D] block key pool
    pool_v: torch.Tensor,  # [Rk, Hkv, D]
    table: torch.Tensor,  # [K, N] int: pool row branch i holds at each position (its block K/V)
    scale: float,
    orow: torch.Tensor,  # [K, N] int: output row of (branch, position)
    out_rows: int,
    prefix_len: torch.Tensor | None = None,  # [S] int32 on the device: live keys of each request's prefix view
) -> AttnState:
    """Streaming attention of the listed rows. Returns ``m, z [out_rows, Hq]`` and ``o [out_rows, Hq, D]`` in fp32;
    output rows that no listed row names are left uninitialised. Programs whose row block lies past their branch's
    count exit at once, so a launch over lists with zero counts costs no arithmetic. ``prefix_len`` (at most the
    view's ``P``) lets one launch — one CUDA graph — serve every prefix length up to ``P``, and requests of
    different prefix lengths share one padded ``[S, Hkv, P, D]`` view (branch ``i`` reads request ``i // (K/S)``;
    ``S = K`` is the zero-copy broadcast of one prefix)."""
    check_tensor("q", q, 3, SUPPORTED_DTYPES)
    check_inner_contiguous("q", q)
    _, hq, d = q.shape
    check_tensor("pool_k", pool_k, 3, (q.dtype,))
    check_tensor("pool_v", pool_v, 3, (q.dtype,))
    check(pool_k.shape == pool_v.shape and pool_k.shape[2] == d, f"pool_k/pool_v must be [Rk, Hkv, {d}]")
    check_inner_contiguous("pool_k", pool_k)
    check_inner_contiguous("pool_v", pool_v)
    hkv = pool_k.shape[1]
    check(hq % hkv == 0, f"Hq {hq} must be a multiple of Hkv {hkv}")
    check_tensor("table", table, 2, (torch.int32, torch.int64))
    k, n = table.shape
    for name, t in (("qrow", qrow), ("lists", lists), ("orow", orow)):
        check_tensor(name, t, 2, (torch.int32, torch.int64))
        check(tuple(t.shape) == (k, n), f"{name} must be [{k}, {n}], got {tuple(t.shape)}")
    check_tensor("counts", counts, 1, (torch.int32, torch.int64))
    check(counts.shape[0] == k, f"counts must be [{k}], got {tuple(counts.shape)}")
    has_prefix = prefix_k is not None and prefix_k.shape[-2] > 0
    if has_prefix:
        check(prefix_v is not None and prefix_k.shape == prefix_v.shape, "prefix_k and prefix_v must match")
        check(prefix_k.dim() in (3, 4), f"prefix must be [Hkv, P, D] or [K, Hkv, P, D], got {tuple(prefix_k.shape)}")
        check(tuple(prefix_k.shape[-3:-2]) == (hkv,) and prefix_k.shape[-1] == d,
              f"prefix must have {hkv} kv heads and head dim {d}, got {tuple(prefix_k.shape)}")
        check(prefix_k.dim() == 3 or (prefix_k.shape[0] > 0 and k % prefix_k.shape[0] == 0),
              f"a 4-dim prefix needs a number of requests that divides the {k} branches, got {prefix_k.shape[0]}")
        check_inner_contiguous("prefix_k", prefix_k)
        check_inner_contiguous("prefix_v", prefix_v)
        check(prefix_k.dtype == q.dtype and prefix_v.dtype == q.dtype, "prefix must have the query dtype")
    reqs = prefix_k.shape[0] if has_prefix and prefix_k.dim() == 4 else 1
    if prefix_len is not None:
        check_tensor("prefix_len", prefix_len, 1, (torch.int32,))
        check(prefix_len.shape[0] in (1, reqs), f"prefix_len must be [1] or [{reqs}], got {tuple(prefix_len.shape)}")
    check_device(q, qrow, lists, counts, pool_k, pool_v, table, orow, prefix_k if has_prefix else None, prefix_len)

    def strides(t: torch.Tensor | None) -> tuple[int, int, int]:
        if t is None:
            return 0, 0, 0
        return (0, *t.stride()[:2]) if t.dim() == 3 else tuple(t.stride()[:3])

    dev = q.device
    m = torch.empty(out_rows, hq, dtype=torch.float32, device=dev)
    z = torch.empty(out_rows, hq, dtype=torch.float32, device=dev)
    o = torch.empty(out_rows, hq, d, dtype=torch.float32, device=dev)
    g = hq // hkv
    pk, pv = (prefix_k, prefix_v) if has_prefix else (q, q)
    plen = prefix_k.shape[-2] if has_prefix else 0
    launch(
        _attend_rows_kernel, attention_config(k, n, hkv, g, d, q.dtype),
        q, qrow.contiguous(), lists.contiguous(), counts.contiguous(), orow.contiguous(), table.contiguous(),
        prefix_len if prefix_len is not None else counts, pk, pv, pool_k, pool_v, m, z, o,
        n, plen, k // reqs, 0 if prefix_len is None or prefix_len.shape[0] == 1 else 1, float(scale), q.stride(0),
        q.stride(1),
        *strides(prefix_k if has_prefix else None), *strides(prefix_v if has_prefix else None),
        pool_k.stride(0), pool_k.stride(1), pool_v.stride(0), pool_v.stride(1),
        HQ=hq, G=g, G_P=pow2(g), D=d, D_P=pow2(d, 16),
        HAS_PREFIX=has_prefix, HAS_PLEN=prefix_len is not None, NATIVE=native_dot(q.dtype), FIX=fix_rounding(q.dtype),
    )
    return AttnState(m=m, z=z, o=o)
