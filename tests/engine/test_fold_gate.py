"""Gate (Eq. 4/5) and source resolution against direct per-row computations."""

from __future__ import annotations

import math

import pytest
import torch

from specfold.engine.gate import branch_depths, fold_mask, relative_residual, resolve_sources

PARENTS = torch.tensor([-1, 0, 1, 2, 3, 0, 5, 1])


def test_relative_residual_matches_definition() -> None:
    h = torch.randn(8, 5, 7, dtype=torch.float64)
    h[3] = h[2] + 1e-3 * torch.randn(5, 7, dtype=torch.float64)
    rho = relative_residual(h, PARENTS)
    assert rho.shape == (8, 5) and rho.dtype == torch.float64  # fp64 model -> fp64 gate
    assert torch.isinf(rho[0]).all()
    for i in range(1, 8):
        p = int(PARENTS[i])
        for n in range(5):
            want = (h[i, n] - h[p, n]).norm() / h[p, n].norm()
            assert math.isclose(rho[i, n].item(), want.item(), rel_tol=1e-12)


def test_zero_norm_parent_folds_only_on_exact_match() -> None:
    h = torch.randn(3, 4, 6)
    h[1, 0] = 0.0  # parent row of branch 2 at position 0 and 1 is zero
    h[1, 1] = 0.0
    h[2, 0] = 0.0  # exact match -> folds
    h[2, 1] = 1e-30  # any difference -> recompute
    rho = relative_residual(h, torch.tensor([-1, 0, 1]))
    assert rho[2, 0].item() == 0.0 and math.isinf(rho[2, 1].item())
    folded = fold_mask(rho, 0.5)
    assert bool(folded[2, 0]) and not bool(folded[2, 1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_gate_without_identity_pass_decides_alike_above_zero(dtype) -> None:
    """exact_zero=False (the gate of a pass at δ > 0) folds exactly the rows the full gate folds, for any δ > 0:
    identical rows (also under a zero-norm parent) get the smallest normal ρ instead of 0."""
    gen = torch.Generator().manual_seed(5)
    h = torch.randn(8, 6, 16, generator=gen, dtype=torch.float64)
    for i in range(1, 8):
        p = int(PARENTS[i])
        size = torch.tensor([0.0, 1e-3, 0.05, 1.0])[torch.randint(0, 4, (6,), generator=gen)][:, None]
        h[i] = h[p] + size * torch.randn(6, 16, generator=gen, dtype=torch.float64)
    h[1, 2] = 0.0
    h[2, 2] = 0.0  # an identical child of a zero-norm parent row
    h = h.to(dtype)
    full, fast = relative_residual(h, PARENTS), relative_residual(h, PARENTS, exact_zero=False)
    assert bool((full == 0).any())
    assert torch.equal(fast[full == 0], torch.full_like(fast[full == 0], torch.finfo(fast.dtype).tiny))
    for delta in (1e-6, 0.01, 0.1, 0.5):
        assert torch.equal(fold_mask(full, delta), fold_mask(fast, delta))


def test_fold_mask_threshold_and_main_row() -> None:
    rho = torch.tensor([[0.0, 0.0], [0.1, 0.1000001], [0.0, 2.0]])
    got = fold_mask(rho, 0.1)
    assert torch.equal(got, torch.tensor([[False, False], [True, False], [True, False]]))


def test_resolve_sources_matches_chain_walk() -> None:
    gen = torch.Generator().manual_seed(3)
    for _ in range(20):
        rec = torch.rand(8, 9, generator=gen) < 0.4
        rec[0] = True
        src = resolve_sources(rec, PARENTS)
        for i in range(8):
            for n in range(9):
                a = i
                while not rec[a, n]:
                    a = int(PARENTS[a])
                assert src[i, n].item() == a


def test_branch_depths() -> None:
    assert branch_depths(PARENTS.tolist()) == [0, 1, 2, 3, 4, 1, 2, 2]
