"""Gate (Eq. 4/5) and source resolution against direct per-row computations."""

from __future__ import annotations

import math

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
