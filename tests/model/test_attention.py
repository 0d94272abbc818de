"""attend_ragged (the batched passes' fused-SDPA attention) against attend, one branch at a time (fp64)."""

from __future__ import annotations

import pytest
import torch

from specfold.model import attention
from specfold.model.attention import attend, attend_ragged, block_bias


@pytest.mark.parametrize("kind", ["bidirectional", "causal"])
@pytest.mark.parametrize("budget", [None, 1])  # 1: every request in its own SDPA group
def test_ragged_equals_each_request_over_its_own_prefix(kind, budget, monkeypatch):
    if budget is not None:
        monkeypatch.setattr(attention, "SCORE_BUDGET", budget)
    r, k, t, hq, hkv, d, p = 3, 2, 8, 4, 2, 16, 13
    g = torch.Generator().manual_seed(0)
    q, bk, bv = (torch.randn(r * k, t, h, d, generator=g, dtype=torch.float64) for h in (hq, hkv, hkv))
    pk, pv = (torch.randn(r, hkv, p, d, generator=g, dtype=torch.float64) for _ in range(2))
    lengths = torch.tensor([13, 0, 5])  # full, empty and partial prefixes
    request = torch.tensor([0, 0, 1, 2, 2, 2])  # ragged: 2, 1 and 3 branches
    bias = block_bias(kind, t, t, torch.float64)
    got = attend_ragged(q, pk, pv, lengths, request, bk, bv, bias, 0.3)
    assert got.dtype == q.dtype and got.shape == q.shape
    for b, i in enumerate(request.tolist()):
        n = int(lengths[i])
        pre = (pk[i, :, :n], pv[i, :, :n]) if n else (None, None)
        want = attend(q[b][None], *pre, bk[b][None], bv[b][None], bias, 0.3).o[0]
        torch.testing.assert_close(got[b], want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", ["bidirectional", "block_causal"])
@pytest.mark.parametrize("prefix", [0, 11])
@pytest.mark.parametrize("budget", [None, 1])  # 1: every branch in its own SDPA group
def test_fused_equals_attend(kind, prefix, budget, monkeypatch):
    """The dense forward's fused attention is attend's output, fp64 to rounding and fp32 within 2e-6."""
    if budget is not None:
        monkeypatch.setattr(attention, "SCORE_BUDGET", budget)
    b, t, hq, hkv, d = 3, 8, 4, 2, 16
    g = torch.Generator().manual_seed(1)
    q, bk, bv = (torch.randn(b, t, h, d, generator=g, dtype=torch.float64) for h in (hq, hkv, hkv))
    pk, pv = (torch.randn(hkv, prefix, d, generator=g, dtype=torch.float64) for _ in range(2))
    pre = (pk, pv) if prefix else (None, None)
    bias = block_bias(kind, t, 4, torch.float64)
    want = attend(q, *pre, bk, bv, bias, 0.3).o
    got = attention.attend_fused(q, *pre, bk, bv, bias, 0.3)
    assert got.dtype == q.dtype and got.shape == q.shape
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    f32 = [x if x is None else x.float() for x in (q, *pre, bk, bv, bias)]
    got32 = attention.attend_fused(*f32, 0.3)
    torch.testing.assert_close(got32, want.float(), rtol=0, atol=2e-6)
