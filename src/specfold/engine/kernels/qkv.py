"""Kernel 3 (SPEC §5): fused RMSNorm + packed QKV GEMM + RoPE (+ Llama-4 query scale) for recomputed rows.

Dims: ``M`` rows of the hidden-state table (``K·N``), ``E`` hidden size, ``R`` recomputed rows (the packed list),
``N`` block positions (row ``rows[r]`` sits at position ``rows[r] % N``), ``Hq``/``Hkv`` heads, ``D`` head dim.

Program ``(row block, head)`` normalises its rows (fp32 sum of squares, then the model-dtype rounding of
:func:`specfold.model.transformer.rms_norm`), multiplies by that head's ``D`` rows of the packed weight
``[(Hq + 2·Hkv)·D, E]`` as two half-head accumulators — so ``rotate_half`` is a swap of accumulators, no shuffle —
adds the bias, applies the per-head q/k RMSNorm of Qwen3-layer models (qk-norm, SDAR: over the head's ``D``
entries, both accumulators, after the model-dtype rounding of the GEMM output, before RoPE), rotates Q and K heads
with the position's cos/sin (plain RoPE and YaRN are both just tables), scales Q by the Llama-4 factor, and scatters
the result to pool slot ``r`` of ``q``, ``k`` or ``v``.
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


@triton.jit
def _qkv_rope_kernel(
    h_ptr, rows_ptr, cnt_ptr, nw_ptr, w_ptr, b_ptr, cos_ptr, sin_ptr, qs_ptr, qn_ptr, kn_ptr, q_ptr, k_ptr, v_ptr,
    R, N, E, eps, stride_h, stride_w, stride_cos,
    HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, HALF_P: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_QSCALE: tl.constexpr, HAS_COUNT: tl.constexpr, HAS_QKNORM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, NATIVE: tl.constexpr, FIX: tl.constexpr,
):
    dtype = h_ptr.dtype.element_ty
    HALF: tl.constexpr = D // 2
    pid_m = tl.program_id(0)
    head = tl.program_id(1)
    if HAS_COUNT:  # the grid covers the upper bound; blocks past the device-side count exit before any load
        R = tl.minimum(tl.load(cnt_ptr), R)
    if pid_m * BLOCK_M >= R:
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mm = offs_m < R
    rows = tl.load(rows_ptr + offs_m, mask=mm, other=0).to(tl.int64)
    hrow = h_ptr + rows[:, None] * stride_h

    ss = tl.zeros([BLOCK_M], dtype=tl.float32)
    for e0 in range(0, E, BLOCK_K):
        offs_k = e0 + tl.arange(0, BLOCK_K)
        x = tl.load(hrow + offs_k[None, :], mask=mm[:, None] & (offs_k[None, :] < E), other=0.0).to(tl.float32)
        ss += tl.sum(x * x, axis=1)
    rstd = 1.0 / tl.sqrt(ss / E + eps)

    offs_j = tl.arange(0, HALF_P)
    mj = offs_j < HALF
    w1 = w_ptr + (head * D + offs_j)[None, :].to(tl.int64) * stride_w  # [1, HALF_P] first half of the head
    w2 = w1 + HALF * stride_w
    acc1 = tl.zeros([BLOCK_M, HALF_P], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_M, HALF_P], dtype=tl.float32)
    for e0 in range(0, E, BLOCK_K):
        offs_k = e0 + tl.arange(0, BLOCK_K)
        mk = offs_k < E
        x = tl.load(hrow + offs_k[None, :], mask=mm[:, None] & mk[None, :], other=0.0).to(tl.float32)
        g = tl.load(nw_ptr + offs_k, mask=mk, other=0.0).to(tl.float32)
        xn = cast(x * rstd[:, None], dtype, FIX).to(tl.float32)  # rms_norm rounds before the weight, then again
        xn = cast(xn * g[None, :], dtype, FIX)
        wm = mk[:, None] & mj[None, :]
        acc1 += dot(xn, tl.load(w1 + offs_k[:, None], mask=wm, other=0.0), NATIVE)
        acc2 += dot(xn, tl.load(w2 + offs_k[:, None], mask=wm, other=0.0), NATIVE)
    if HAS_BIAS:
        acc1 += tl.load(b_ptr + head * D + offs_j, mask=mj, other=0.0).to(tl.float32)[None, :]
        acc2 += tl.load(b_ptr + head * D + HALF + offs_j, mask=mj, other=0.0).to(tl.float32)[None, :]

    pos = rows % N
    out_m = mm[:, None] & mj[None, :]
    if head < HQ + HKV:  # RoPE on Q and K heads: [x1, x2] -> [x1·c1 − x2·s1, x2·c2 + x1·s2]
        if HAS_QKNORM:  # Layer.qkv: the GEMM output in the model dtype, rms_norm over the head's D, then RoPE
            if head < HQ:
                nw_h = qn_ptr
            else:
                nw_h = kn_ptr
            acc1 = cast(acc1, dtype, FIX).to(tl.float32)  # padded columns stay 0 (masked weights and bias)
            acc2 = cast(acc2, dtype, FIX).to(tl.float32)
            hstd = 1.0 / tl.sqrt((tl.sum(acc1 * acc1, axis=1) + tl.sum(acc2 * acc2, axis=1)) / D + eps)
            g1 = tl.load(nw_h + offs_j, mask=mj, other=0.0).to(tl.float32)
            g2 = tl.load(nw_h + HALF + offs_j, mask=mj, other=0.0).to(tl.float32)
            acc1 = cast(cast(acc1 * hstd[:, None], dtype, FIX).to(tl.float32) * g1[None, :], dtype, FIX)
            acc2 = cast(cast(acc2 * hstd[:, None], dtype, FIX).to(tl.float32) * g2[None, :], dtype, FIX)
            acc1 = acc1.to(tl.float32)
            acc2 = acc2.to(tl.float32)
        cs = cos_ptr + pos[:, None] * stride_cos + offs_j[None, :]
        sn = sin_ptr + pos[:, None] * stride_cos + offs_j[None, :]
        c1 = tl.load(cs, mask=out_m, other=0.0).to(tl.float32)
        c2 = tl.load(cs + HALF, mask=out_m, other=0.0).to(tl.float32)
        s1 = tl.load(sn, mask=out_m, other=0.0).to(tl.float32)
        s2 = tl.load(sn + HALF, mask=out_m, other=0.0).to(tl.float32)
        o1 = acc1 * c1 - acc2 * s1
        o2 = acc2 * c2 + acc1 * s2
        if head < HQ:
            if HAS_QSCALE:
                qs = tl.load(qs_ptr + pos, mask=mm, other=1.0).to(tl.float32)
                o1 = o1 * qs[:, None]
                o2 = o2 * qs[:, None]
            dst = q_ptr + offs_m[:, None].to(tl.int64) * (HQ * D) + head * D + offs_j[None, :]
        else:
            dst = k_ptr + offs_m[:, None].to(tl.int64) * (HKV * D) + (head - HQ) * D + offs_j[None, :]
    else:
        o1 = acc1
        o2 = acc2
        dst = v_ptr + offs_m[:, None].to(tl.int64) * (HKV * D) + (head - HQ - HKV) * D + offs_j[None, :]
    tl.store(dst, cast(o1, dtype, FIX), mask=out_m)
    tl.store(dst + HALF, cast(o2, dtype, FIX), mask=out_m)


def qkv_config(r: int, e: int, heads: int) -> LaunchConfig:
    """Grid ``(⌈R / BLOCK_M⌉, Hq + 2·Hkv)``: ``BLOCK_M`` rows × one head per program, ``BLOCK_K`` hidden entries per
    step of the GEMM."""
    # NOTE: up to 64 rows × one head per program: the head's weight tile is reused across the rows.
    block_m = min(pow2(r, 16), 64)
    block_k = min(pow2(e, 16), 64)
    return LaunchConfig(grid=(triton.cdiv(r, block_m), heads), tiles={"BLOCK_M": block_m, "BLOCK_K": block_k})


def qkv_rope(
    h: torch.Tensor,  # [M, E] layer input (model dtype)
    rows: torch.Tensor,  # [R] int: flat (branch·N + position) rows to compute, in pool order
    norm_weight: torch.Tensor,  # [E]
    eps: float,
    w_qkv: torch.Tensor,  # [(Hq + 2·Hkv)·D, E]
    b_qkv: torch.Tensor | None,  # [(Hq + 2·Hkv)·D]
    cos: torch.Tensor,  # [N, D] table of the block positions (model dtype)
    sin: torch.Tensor,  # [N, D]
    qscale: torch.Tensor | None,  # [N] Llama-4 query scale, or None
    num_heads: int,
    num_kv_heads: int,
    count: torch.Tensor | None = None,  # [1] int32 on the device: only rows[:count] are computed (sync-free)
    q_norm: torch.Tensor | None = None,  # [D] per-head RMSNorm weight on q (qk-norm: Qwen3 layers, SDAR), or None
    k_norm: torch.Tensor | None = None,  # [D] on k; given together with q_norm
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """RMSNorm → QKV GEMM (→ per-head q/k RMSNorm) → RoPE (→ query scale) on the listed rows. Returns pools
    ``q [R, Hq, D]``, ``k, v [R, Hkv, D]`` (model dtype); pool row ``r`` belongs to ``rows[r]``. With ``count`` the
    launch covers all ``R`` rows (an upper bound) and pool rows from ``count`` on are left uninitialised, at no
    arithmetic."""
    check_tensor("h", h, 2, SUPPORTED_DTYPES)
    check_inner_contiguous("h", h)
    m, e = h.shape
    check_tensor("rows", rows, 1, (torch.int32, torch.int64))
    check_tensor("w_qkv", w_qkv, 2, (h.dtype,))
    check_inner_contiguous("w_qkv", w_qkv)
    hq, hkv = num_heads, num_kv_heads
    check(hq % hkv == 0, f"num_heads {hq} must be a multiple of num_kv_heads {hkv}")
    check(w_qkv.shape[0] % (hq + 2 * hkv) == 0 and w_qkv.shape[1] == e,
          f"w_qkv must be [(Hq + 2·Hkv)·D, {e}], got {tuple(w_qkv.shape)}")
    d = w_qkv.shape[0] // (hq + 2 * hkv)
    check(d % 2 == 0, f"head dim must be even for RoPE, got {d}")
    check_tensor("norm_weight", norm_weight, 1)
    check(norm_weight.shape[0] == e, f"norm_weight must be [{e}], got {tuple(norm_weight.shape)}")
    if b_qkv is not None:
        check_tensor("b_qkv", b_qkv, 1)
        check(b_qkv.shape[0] == w_qkv.shape[0], f"b_qkv must be [{w_qkv.shape[0]}], got {tuple(b_qkv.shape)}")
    check_tensor("cos", cos, 2)
    n = cos.shape[0]
    check(tuple(cos.shape) == (n, d) and tuple(sin.shape) == (n, d), f"cos/sin must be [N, {d}]")
    check(cos.stride() == sin.stride() and cos.stride(1) == 1, "cos and sin must share strides, contiguous in D")
    if qscale is not None:
        check(tuple(qscale.shape) == (n,), f"qscale must be [{n}], got {tuple(qscale.shape)}")
    if count is not None:
        check_tensor("count", count, 1, (torch.int32,))
        check(count.shape[0] == 1, f"count must be [1], got {tuple(count.shape)}")
    check((q_norm is None) == (k_norm is None), "q_norm and k_norm come together (qk-norm) or not at all")
    for name, t in (("q_norm", q_norm), ("k_norm", k_norm)):
        if t is not None:
            check_tensor(name, t, 1)
            check(t.shape[0] == d, f"{name} must be [{d}] (the head dim), got {tuple(t.shape)}")
    check_device(h, rows, norm_weight, w_qkv, b_qkv, cos, sin, qscale, count, q_norm, k_norm)
    r = rows.shape[0]
    q = torch.empty(r, hq, d, dtype=h.dtype, device=h.device)
    k = torch.empty(r, hkv, d, dtype=h.dtype, device=h.device)
    v = torch.empty(r, hkv, d, dtype=h.dtype, device=h.device)
    if r == 0:
        return q, k, v
    launch(
        _qkv_rope_kernel, qkv_config(r, e, hq + 2 * hkv),
        h, rows.contiguous(), count if count is not None else rows, norm_weight.contiguous(), w_qkv,
        b_qkv if b_qkv is not None else w_qkv,
        cos, sin, qscale.contiguous() if qscale is not None else cos,
        q_norm.contiguous() if q_norm is not None else cos, k_norm.contiguous() if k_norm is not None else cos,
        q, k, v, r, n, e, float(eps), h.stride(0), w_qkv.stride(0), cos.stride(0),
        HQ=hq, HKV=hkv, D=d, HALF_P=pow2(d // 2, 16), HAS_BIAS=b_qkv is not None, HAS_QSCALE=qscale is not None,
        HAS_COUNT=count is not None, HAS_QKNORM=q_norm is not None, NATIVE=native_dot(h.dtype),
        FIX=fix_rounding(h.dtype),
    )
    return q, k, v
