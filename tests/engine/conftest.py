"""Kernel-test setup: the device for kernel inputs and the tolerance rules (Triton's interpreter on CPU is switched
on in tests/conftest.py, before any kernel module is imported).

Tolerances (see ``assert_matches``): fp32 storage is compared to an fp64 reference with a stated ``rtol``/``atol``;
bf16 storage follows the FlashAttention rule — the kernel's error against the fp64 reference may be at most 2×
the error of the same math done by the torch reference in bf16, plus a small absolute floor.
"""

from __future__ import annotations

import pytest
import torch

FP32_TOL = {"rtol": 2e-5, "atol": 2e-5}
LOWP_FACTOR = 2.0  # FlashAttention: kernel error ≤ 2 × error of the same math in torch at low precision
LOWP_FLOOR = 1e-5


@pytest.fixture
def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _first_bad(out: torch.Tensor, ref: torch.Tensor, bound: torch.Tensor) -> str:
    err = (out - ref).abs()
    bad = (err > bound).nonzero()
    if bad.numel() == 0:
        return ""
    idx = tuple(bad[0].tolist())
    return f"first mismatch at {idx}: got {out[idx].item()}, want {ref[idx].item()} ({bad.shape[0]} bad)"


def assert_matches(
    out: torch.Tensor,  # kernel result (any dtype)
    ref64: torch.Tensor,  # fp64 reference of the same math on the same (upcast) inputs
    ctrl: torch.Tensor | None = None,  # torch reference run in the kernel's storage dtype (for bf16/fp16)
    tol: dict[str, float] | None = None,
) -> None:
    """fp32: ``|out − ref| ≤ atol + rtol·|ref|`` elementwise. Low precision (``ctrl`` given): ``max|out − ref| ≤
    2·max|ctrl − ref| + floor``. Prints the first mismatching index."""
    out, ref64 = out.double(), ref64.double()
    assert out.shape == ref64.shape, (out.shape, ref64.shape)
    assert torch.isfinite(out).all() == torch.isfinite(ref64).all()
    if ctrl is None:
        t = tol or FP32_TOL
        bound = t["atol"] + t["rtol"] * ref64.abs()
        assert ((out - ref64).abs() <= bound).all(), _first_bad(out, ref64, bound)
        return
    err_k = (out - ref64).abs().max().item()
    err_c = (ctrl.double() - ref64).abs().max().item()
    limit = LOWP_FACTOR * err_c + LOWP_FLOOR
    bound = torch.full_like(ref64, limit)
    assert err_k <= limit, f"kernel error {err_k:.3g} > 2 × torch-lowp error {err_c:.3g}; " + _first_bad(
        out, ref64, bound
    )


@pytest.fixture
def matches():
    """:func:`assert_matches` for test modules (tests/engine is not a package, so they take it as a fixture)."""
    return assert_matches
