"""Kernels 1 and 2 (gate + compaction, source resolution) against their references; discrete outputs exactly,
compaction lists as sets (their order comes from atomics)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from specfold.engine.kernels.gate import gate_compact  # noqa: E402
from specfold.engine.kernels.resolve import resolve_sources  # noqa: E402
from specfold.engine.reference import gate_compact_ref, resolve_sources_ref  # noqa: E402

PARENTS = [-1, 0, 1, 2, 3, 0, 5, 1]  # 7 drafts: a chain of depth 4 plus side branches
N = 32


def _hidden(e: int, dtype: torch.dtype, device: str, seed: int = 0) -> torch.Tensor:
    """Drafts = parent + noise of a per-row size (0, 1e-3, 0.05 or 1): ρ spans both sides of δ = 0.1, with exact
    copies; plus a zero-norm parent row that one child copies (ρ = 0) and another does not (ρ = inf)."""
    gen = torch.Generator().manual_seed(seed)
    k = len(PARENTS)
    h = torch.randn(k, N, e, generator=gen)
    sizes = torch.tensor([0.0, 1e-3, 0.05, 1.0])
    for i in range(1, k):
        noise = sizes[torch.randint(0, 4, (N,), generator=gen)][:, None]
        h[i] = h[PARENTS[i]] + noise * torch.randn(N, e, generator=gen)
    h[1, 5] = 0.0
    h[2, 5] = 0.0  # parent 1 is zero and equal: folds at any δ
    h[7, 5] = 1.0  # parent 1 is zero, child not: ρ = inf
    return h.to(dtype=dtype, device=device)


def _check_gate(got, want, k: int, n: int, rtol: float = 1e-5) -> None:
    assert torch.equal(got.recompute.cpu(), want.recompute.cpu())
    assert torch.equal(got.hop.cpu(), want.hop.cpu())
    fin = torch.isfinite(want.rho)
    assert torch.equal(torch.isfinite(got.rho), fin)
    # the kernel accumulates ρ in fp64, the torch gate in fp32 (fp64 for fp64 models): compare at fp32 precision
    # (the caller's rtol: bf16 gates round their norms to 8 bits)
    torch.testing.assert_close(got.rho[fin].to(want.rho.dtype), want.rho[fin], rtol=rtol, atol=0)
    r = int(want.count.item())
    assert int(got.count.item()) == r
    assert torch.equal(got.branch_counts.cpu(), want.branch_counts.cpu())
    rows = got.rows[:r].long().cpu()
    assert sorted(rows.tolist()) == sorted(want.rows[:r].tolist())  # a set: order comes from atomics
    assert (got.rows[r:] == -1).all()
    slot = got.slot.long().cpu()
    rec = got.recompute.cpu()
    assert (slot[~rec] == -1).all()
    assert sorted(slot[rec].tolist()) == list(range(r))
    flat = torch.arange(k * n).view(k, n)
    assert torch.equal(rows[slot[rec]], flat[rec])  # slot and list agree
    for i in range(k):
        c = int(want.branch_counts[i])
        assert sorted(got.branch_lists[i, :c].tolist()) == want.branch_lists[i, :c].tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("e", [96, 123])
@pytest.mark.parametrize("delta", [0.0, 0.1])
def test_gate_compact_matches_reference(dtype, e, delta, device) -> None:
    h = _hidden(e, dtype, device)
    par = torch.tensor(PARENTS, device=device)
    want = gate_compact_ref(h.cpu(), par.cpu(), delta)
    got = gate_compact(h, par, delta)
    _check_gate(got, want, len(PARENTS), N, rtol=1e-2 if dtype == torch.bfloat16 else 1e-5)
    if delta == 0.0:  # at δ = 0 exactly the bit-identical rows fold
        same = (h[1:] == h[par[1:]]).all(dim=-1).cpu()
        assert torch.equal(~got.recompute[1:].cpu(), same)
    else:
        assert 0 < int((~got.recompute).sum()) < (len(PARENTS) - 1) * N


@pytest.mark.parametrize("positions_per_program", [1, 8])
def test_gate_one_program_per_position_and_imposed_fold(positions_per_program, device) -> None:
    h = _hidden(40, torch.float32, device, seed=3)
    par = torch.tensor(PARENTS, device=device)
    fold = torch.rand(len(PARENTS), N, generator=torch.Generator().manual_seed(4)) < 0.6
    want = gate_compact_ref(h.cpu(), par.cpu(), 0.1, fold=fold)
    got = gate_compact(h, par, 0.1, fold=fold.to(device), positions_per_program=positions_per_program)
    _check_gate(got, want, len(PARENTS), N)


@pytest.mark.parametrize("density", [0.2, 0.5, 0.9])
@pytest.mark.parametrize("n", [32, 7])
def test_resolve_sources_matches_reference(density, n, device) -> None:
    gen = torch.Generator().manual_seed(int(density * 10) + n)
    k = len(PARENTS)
    rec = torch.rand(k, n, generator=gen) < density
    rec[0] = True
    par = torch.tensor(PARENTS)
    slot = torch.where(rec, (torch.cumsum(rec.reshape(-1), 0) - 1).view(k, n), -1).to(torch.int32)
    want_src, want_table = resolve_sources_ref(rec, par, slot)
    src, table = resolve_sources(rec.to(device), par.to(device), slot.to(device))
    assert torch.equal(src.cpu(), want_src)
    assert torch.equal(table.cpu(), want_table)


def test_launcher_rejects_bad_shapes(device) -> None:
    h = torch.zeros(3, 4, 8, device=device)
    with pytest.raises(ValueError, match="parents"):
        gate_compact(h, torch.tensor([-1, 0], device=device), 0.1)
    with pytest.raises(ValueError, match="fold"):
        gate_compact(h, torch.tensor([-1, 0, 1], device=device), 0.1, fold=torch.zeros(3, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="h must have 3 dims"):
        gate_compact(h[0], torch.tensor([-1, 0, 1], device=device), 0.1)
