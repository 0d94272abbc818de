"""Kernel 3 (RMSNorm + QKV GEMM (+ per-head q/k RMSNorm) + RoPE + query scale + scatter) and kernel 6 (fused FFN)
against their references.

Tolerances: fp32 storage vs an fp64 reference, rtol = atol = 2e-5 (conftest.FP32_TOL); bf16 storage: error vs
the fp64 reference ≤ 2 × the error of the torch reference run in bf16 (+1e-5).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from specfold.config import RopeConfig  # noqa: E402
from specfold.engine.kernels.ffn import ffn_rows  # noqa: E402
from specfold.engine.kernels.qkv import qkv_rope  # noqa: E402
from specfold.engine.reference import ffn_rows_ref, qkv_rope_ref  # noqa: E402
from specfold.model.rope import Rotary  # noqa: E402

K, N, PREFIX, R = 8, 32, 37, 37
EPS = 1e-6
ROPES = {  # fd: plain RoPE, q/k/v bias; nld: YaRN + Llama-4 query scale (original max 16 so both bite)
    "fd": (RopeConfig(theta=1e6), True),
    "nld": (RopeConfig(theta=1e6, kind="yarn", factor=4.0, original_max_position_embeddings=16, llama4_beta=0.1,
                       llama4_max_position=16), False),
}


def _rows(gen: torch.Generator) -> torch.Tensor:
    return torch.randperm(K * N, generator=gen)[:R].to(torch.int32)  # odd count, scattered over branches


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("hq", "hkv"), [(6, 2), (4, 1)])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("family", ["fd", "nld"])
def test_qkv_rope_matches_reference(dtype, hq, hkv, d, family, device, matches) -> None:
    rope, bias = ROPES[family]
    e = 200
    gen = torch.Generator().manual_seed(hq + d)
    h = torch.randn(K * N, e, generator=gen)
    w = torch.randn((hq + 2 * hkv) * d, e, generator=gen) * e**-0.5
    b = torch.randn((hq + 2 * hkv) * d, generator=gen) * 0.1 if bias else None
    nw = 1 + 0.1 * torch.randn(e, generator=gen)
    rows = _rows(gen)
    cos, sin, qs = Rotary(rope, d).tables(torch.arange(PREFIX, PREFIX + N), dtype)
    assert (qs is not None) == (family == "nld")

    def cast(t, dt):
        return None if t is None else t.to(dt)

    args = (h, nw, w, b)
    low = [cast(t, dtype) for t in args]  # the storage dtype; the fp64 reference sees the same values
    hi = [cast(t, torch.float64) for t in low]
    t64 = [cast(t, torch.float64) for t in (cos, sin, qs)]
    got = qkv_rope(*(cast(t, device) for t in (low[0], rows)), low[1].to(device), EPS, low[2].to(device),
                   cast(low[3], device), cos.to(device), sin.to(device), cast(qs, device), hq, hkv)
    want = qkv_rope_ref(hi[0], rows, hi[1], EPS, hi[2], hi[3], *t64, hq, hkv)
    ctrl = qkv_rope_ref(low[0], rows, low[1], EPS, low[2], low[3], cos, sin, qs, hq, hkv)
    for g, w64, c in zip(got, want, ctrl, strict=True):
        assert g.dtype == dtype
        matches(g.cpu(), w64, None if dtype == torch.float32 else c)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("hq", "hkv", "d"), [(6, 2, 64), (4, 1, 40)])  # 40: a half head (20) under its pow2 tile
def test_qkv_rope_qk_norm_matches_reference(dtype, hq, hkv, d, device, matches) -> None:
    """qk-norm (Qwen3 layers, SDAR): the per-head q/k RMSNorm between the GEMM and RoPE, no bias, plain RoPE."""
    e = 136
    gen = torch.Generator().manual_seed(hq + d + 1)
    h = torch.randn(K * N, e, generator=gen)
    w = torch.randn((hq + 2 * hkv) * d, e, generator=gen) * 3 * e**-0.5  # q/k rows of rms ≈ 3: the norm bites
    nw, qn, kn = (1 + 0.2 * torch.randn(x, generator=gen) for x in (e, d, d))
    rows = _rows(gen)
    cos, sin, _ = Rotary(ROPES["fd"][0], d).tables(torch.arange(PREFIX, PREFIX + N), dtype)
    low = [t.to(dtype) for t in (h, nw, w, qn, kn)]
    hi = [t.double() for t in low]
    c64, s64 = cos.double(), sin.double()
    got = qkv_rope(low[0].to(device), rows.to(device), low[1].to(device), EPS, low[2].to(device), None,
                   cos.to(device), sin.to(device), None, hq, hkv, q_norm=low[3].to(device), k_norm=low[4].to(device))
    want = qkv_rope_ref(hi[0], rows, hi[1], EPS, hi[2], None, c64, s64, None, hq, hkv, q_norm=hi[3], k_norm=hi[4])
    ctrl = qkv_rope_ref(low[0], rows, low[1], EPS, low[2], None, cos, sin, None, hq, hkv, q_norm=low[3],
                        k_norm=low[4])
    for g, w64, c in zip(got, want, ctrl, strict=True):
        matches(g.cpu(), w64, None if dtype == torch.float32 else c)
    plain = qkv_rope_ref(hi[0], rows, hi[1], EPS, hi[2], None, c64, s64, None, hq, hkv)
    assert (plain[0] - want[0]).abs().max() > 0.5 and (plain[1] - want[1]).abs().max() > 0.5  # qk-norm changes q, k
    assert torch.equal(plain[2], want[2])  # and leaves v alone
    with pytest.raises(ValueError, match="come together"):
        qkv_rope(low[0].to(device), rows.to(device), low[1].to(device), EPS, low[2].to(device), None,
                 cos.to(device), sin.to(device), None, hq, hkv, q_norm=low[3].to(device))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("e", "f"), [(96, 160), (200, 328)])
def test_ffn_rows_matches_reference(dtype, e, f, device, matches) -> None:
    gen = torch.Generator().manual_seed(e + f)
    h = torch.randn(K * N, e, generator=gen)
    nw = 1 + 0.1 * torch.randn(e, generator=gen)
    wgu = torch.randn(2 * f, e, generator=gen) * e**-0.5
    wd = torch.randn(e, f, generator=gen) * f**-0.5
    rows = _rows(gen)
    low = [t.to(dtype) for t in (h, nw, wgu, wd)]
    hi = [t.double() for t in low]
    sentinel = 7.0
    out = ffn_rows(low[0].to(device), rows.to(device), low[1].to(device), EPS, low[2].to(device), low[3].to(device),
                   torch.full((K * N, e), sentinel, dtype=dtype, device=device)).cpu()
    want = ffn_rows_ref(hi[0], rows, hi[1], EPS, hi[2], hi[3], torch.full((K * N, e), sentinel, dtype=torch.float64))
    ctrl = ffn_rows_ref(low[0], rows, low[1], EPS, low[2], low[3], torch.full((K * N, e), sentinel, dtype=dtype))
    untouched = torch.ones(K * N, dtype=torch.bool)
    untouched[rows.long()] = False
    assert (out[untouched] == sentinel).all()  # a scatter: other rows are left as they were
    r = rows.long()
    matches(out[r], want[r], None if dtype == torch.float32 else ctrl[r])


def test_launchers_reject_bad_arguments(device) -> None:
    h = torch.zeros(8, 16, device=device)
    w = torch.zeros(10 * 4, 16, device=device)
    cos = torch.zeros(4, 4, device=device)
    rows = torch.arange(3, device=device)
    with pytest.raises(ValueError, match="multiple"):
        qkv_rope(h, rows, h[0], EPS, w, None, cos, cos, None, 3, 2)
    with pytest.raises(ValueError, match="w_qkv must be"):
        qkv_rope(h, rows, h[0], EPS, w[:, :8], None, cos, cos, None, 6, 2)
    with pytest.raises(ValueError, match="w_down"):
        ffn_rows(h, rows, h[0], EPS, torch.zeros(8, 16, device=device), torch.zeros(16, 5, device=device), h)
    with pytest.raises(ValueError, match="must be one of"):
        ffn_rows(h.double(), rows, h[0], EPS, w.double(), w.double(), h.double())
