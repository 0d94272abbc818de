"""Kernel 6 (SPEC §5): fused FFN — RMSNorm + packed gate/up GEMM + SiLU·mul + down — for recomputed rows only.

Dims: ``M`` rows of the hidden-state table (``K·N``), ``E`` hidden size, ``F`` FFN size, ``R`` listed rows.

Two launches: ``_ffn_gate_up_kernel`` (program = row block × ``F`` block) normalises the listed rows, runs the
gate and up halves of the packed ``[2F, E]`` weight as two accumulators and writes ``silu(gate) · up`` in the model
dtype; :func:`linear_rows` (program = row block × ``E`` block) multiplies by ``W_down`` and scatters each row to
its own (branch, position) row ``rows[r]`` of the FFN table ``out [M, E]``. :func:`linear_rows` is also the folded
layer's o_proj. Every launch takes an optional device-side row count: the grid is sized at the upper bound and
blocks past the count return before any load (no host sync, no arithmetic on skipped rows).
NOTE: the down GEMM is not fused into the first launch: that would need the full ``[BLOCK_M, F]`` activation per
program or split-``F`` atomics (fp32 and order-dependent); the ``[R, F]`` intermediate is cheaper.
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
def _ffn_gate_up_kernel(
    h_ptr, rows_ptr, cnt_ptr, nw_ptr, w_ptr, act_ptr,
    R, E, F, eps, stride_h, stride_w,
    HAS_COUNT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_K: tl.constexpr,
    NATIVE: tl.constexpr, FIX: tl.constexpr,
):
    dtype = h_ptr.dtype.element_ty
    if HAS_COUNT:  # upper-bound grid: blocks past the device-side count exit before any load
        R = tl.minimum(tl.load(cnt_ptr), R)
    if tl.program_id(0) * BLOCK_M >= R:
        return
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    mm = offs_m < R
    rows = tl.load(rows_ptr + offs_m, mask=mm, other=0).to(tl.int64)
    hrow = h_ptr + rows[:, None] * stride_h
    ss = tl.zeros([BLOCK_M], dtype=tl.float32)
    for e0 in range(0, E, BLOCK_K):
        offs_k = e0 + tl.arange(0, BLOCK_K)
        x = tl.load(hrow + offs_k[None, :], mask=mm[:, None] & (offs_k[None, :] < E), other=0.0).to(tl.float32)
        ss += tl.sum(x * x, axis=1)
    rstd = 1.0 / tl.sqrt(ss / E + eps)

    offs_f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    mf = offs_f < F
    wg = w_ptr + offs_f[None, :].to(tl.int64) * stride_w  # gate rows [0, F), up rows [F, 2F)
    wu = wg + F * stride_w
    acc_g = tl.zeros([BLOCK_M, BLOCK_F], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_F], dtype=tl.float32)
    for e0 in range(0, E, BLOCK_K):
        offs_k = e0 + tl.arange(0, BLOCK_K)
        mk = offs_k < E
        x = tl.load(hrow + offs_k[None, :], mask=mm[:, None] & mk[None, :], other=0.0).to(tl.float32)
        g = tl.load(nw_ptr + offs_k, mask=mk, other=0.0).to(tl.float32)
        # as transformer.rms_norm: round the normalised row, then its product with the weight
        xn = cast(cast(x * rstd[:, None], dtype, FIX).to(tl.float32) * g[None, :], dtype, FIX)
        wm = mk[:, None] & mf[None, :]
        acc_g += dot(xn, tl.load(wg + offs_k[:, None], mask=wm, other=0.0), NATIVE)
        acc_u += dot(xn, tl.load(wu + offs_k[:, None], mask=wm, other=0.0), NATIVE)
    act = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
    tl.store(act_ptr + offs_m[:, None].to(tl.int64) * F + offs_f[None, :], cast(act, dtype, FIX),
             mask=mm[:, None] & mf[None, :])


@triton.jit
def _linear_rows_kernel(
    x_ptr, rows_ptr, cnt_ptr, w_ptr, out_ptr,
    R, E, F, stride_x, stride_w, stride_o,
    GATHER: tl.constexpr, HAS_COUNT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr, NATIVE: tl.constexpr, FIX: tl.constexpr,
):
    if HAS_COUNT:
        R = tl.minimum(tl.load(cnt_ptr), R)
    if tl.program_id(0) * BLOCK_M >= R:
        return
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    mm = offs_m < R
    rows = tl.load(rows_ptr + offs_m, mask=mm, other=0).to(tl.int64)
    xrow = rows if GATHER else offs_m.to(tl.int64)
    offs_e = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)
    me = offs_e < E
    acc = tl.zeros([BLOCK_M, BLOCK_E], dtype=tl.float32)
    for f0 in range(0, F, BLOCK_K):
        offs_k = f0 + tl.arange(0, BLOCK_K)
        mk = offs_k < F
        a = tl.load(x_ptr + xrow[:, None] * stride_x + offs_k[None, :], mask=mm[:, None] & mk[None, :], other=0.0)
        w = tl.load(w_ptr + offs_e[None, :].to(tl.int64) * stride_w + offs_k[:, None], mask=mk[:, None] & me[None, :],
                    other=0.0)
        acc += dot(a, w, NATIVE)
    tl.store(out_ptr + rows[:, None] * stride_o + offs_e[None, :], cast(acc, out_ptr.dtype.element_ty, FIX),
             mask=mm[:, None] & me[None, :])


def linear_config(r: int, e: int, f: int) -> LaunchConfig:
    """:func:`linear_rows`: grid ``(⌈R / BLOCK_M⌉, ⌈E / BLOCK_E⌉)``, ``BLOCK_K`` input features per GEMM step."""
    block_m = min(pow2(r, 16), 64)
    block_e = min(pow2(e, 16), 64)
    return LaunchConfig(grid=(triton.cdiv(r, block_m), triton.cdiv(e, block_e)),
                        tiles={"BLOCK_M": block_m, "BLOCK_E": block_e, "BLOCK_K": min(pow2(f, 16), 64)})


def gate_up_config(r: int, e: int, f: int) -> LaunchConfig:
    """The gate/up launch of :func:`ffn_rows`: grid ``(⌈R / BLOCK_M⌉, ⌈F / BLOCK_F⌉)``, ``BLOCK_K`` hidden entries
    per GEMM step (two accumulators: gate and up)."""
    block_m = min(pow2(r, 16), 64)
    block_f = min(pow2(f, 16), 64)
    return LaunchConfig(grid=(triton.cdiv(r, block_m), triton.cdiv(f, block_f)),
                        tiles={"BLOCK_M": block_m, "BLOCK_F": block_f, "BLOCK_K": min(pow2(e, 16), 64)})


def linear_rows(
    x: torch.Tensor,  # [R, F] rows to project (model dtype); with gather: [M, F], row rows[r] is projected
    rows: torch.Tensor,  # [R] int: output row of each projected row (distinct)
    w: torch.Tensor,  # [E, F]
    out: torch.Tensor,  # [M, E]; rows[r] is written, every other row is left as it is
    count: torch.Tensor | None = None,  # [1] int32 on the device: only rows[:count] are projected (sync-free)
    gather: bool = False,
) -> torch.Tensor:
    """``out[rows[r]] = x[r] @ wᵀ`` (``x[rows[r]]`` with ``gather``) for the listed rows; returns ``out``. The FFN's
    down projection and the folded layer's o_proj (recomputed + corrected rows only). With ``count`` the grid covers
    all ``R`` rows and blocks past the count exit at once."""
    check_tensor("x", x, 2, SUPPORTED_DTYPES)
    check_inner_contiguous("x", x)
    check_tensor("rows", rows, 1, (torch.int32, torch.int64))
    check_tensor("w", w, 2, (x.dtype,))
    check_inner_contiguous("w", w)
    e, f = w.shape
    check(x.shape[1] == f, f"x must be [R, {f}], got {tuple(x.shape)}")
    check_tensor("out", out, 2, (x.dtype,))
    check(out.shape[1] == e, f"out must be [M, {e}], got {tuple(out.shape)}")
    check_inner_contiguous("out", out)
    r = rows.shape[0]
    check(gather or x.shape[0] == r, f"x must have {r} rows (one per listed row), got {x.shape[0]}")
    if count is not None:
        check_tensor("count", count, 1, (torch.int32,))
        check(count.shape[0] == 1, f"count must be [1], got {tuple(count.shape)}")
    check_device(x, rows, w, out, count)
    if r == 0:
        return out
    rows_c = rows.contiguous()
    launch(
        _linear_rows_kernel, linear_config(r, e, f),
        x, rows_c, count if count is not None else rows_c, w, out, r, e, f, x.stride(0), w.stride(0), out.stride(0),
        GATHER=gather, HAS_COUNT=count is not None, NATIVE=native_dot(x.dtype), FIX=fix_rounding(x.dtype),
    )
    return out


def ffn_rows(
    h: torch.Tensor,  # [M, E] post-attention residual (model dtype)
    rows: torch.Tensor,  # [R] int: flat rows to compute (any order, distinct)
    norm_weight: torch.Tensor,  # [E]
    eps: float,
    w_gate_up: torch.Tensor,  # [2F, E] gate rows then up rows
    w_down: torch.Tensor,  # [E, F]
    out: torch.Tensor,  # [M, E] FFN table; rows[r] is written, every other row is left as it is
    count: torch.Tensor | None = None,  # [1] int32 on the device: only rows[:count] are computed (sync-free)
) -> torch.Tensor:
    """RMSNorm → gate/up → SiLU·mul → down on the listed rows, scattered into ``out`` (returned). With ``count``
    both launches cover all ``R`` rows (an upper bound) and blocks past the count exit at once."""
    check_tensor("h", h, 2, SUPPORTED_DTYPES)
    check_inner_contiguous("h", h)
    mrows, e = h.shape
    check_tensor("rows", rows, 1, (torch.int32, torch.int64))
    check_tensor("norm_weight", norm_weight, 1)
    check(norm_weight.shape[0] == e, f"norm_weight must be [{e}], got {tuple(norm_weight.shape)}")
    check_tensor("w_gate_up", w_gate_up, 2, (h.dtype,))
    check(w_gate_up.shape[0] % 2 == 0 and w_gate_up.shape[1] == e, f"w_gate_up must be [2F, {e}]")
    f = w_gate_up.shape[0] // 2
    check_tensor("w_down", w_down, 2, (h.dtype,))
    check(tuple(w_down.shape) == (e, f), f"w_down must be [{e}, {f}], got {tuple(w_down.shape)}")
    check_inner_contiguous("w_gate_up", w_gate_up)
    check_inner_contiguous("w_down", w_down)
    check_tensor("out", out, 2, (h.dtype,))
    check(tuple(out.shape) == (mrows, e), f"out must be [{mrows}, {e}], got {tuple(out.shape)}")
    check_inner_contiguous("out", out)
    if count is not None:
        check_tensor("count", count, 1, (torch.int32,))
        check(count.shape[0] == 1, f"count must be [1], got {tuple(count.shape)}")
    check_device(h, rows, norm_weight, w_gate_up, w_down, out, count)
    r = rows.shape[0]
    if r == 0:
        return out
    act = torch.empty(r, f, dtype=h.dtype, device=h.device)
    rows_c = rows.contiguous()
    launch(
        _ffn_gate_up_kernel, gate_up_config(r, e, f),
        h, rows_c, count if count is not None else rows_c, norm_weight.contiguous(), w_gate_up, act, r, e, f,
        float(eps), h.stride(0), w_gate_up.stride(0), HAS_COUNT=count is not None, NATIVE=native_dot(h.dtype),
        FIX=fix_rounding(h.dtype),
    )
    linear_rows(act, rows_c, w_down, out, count)
    return out
