"""Eq. 8 alone, in fp64, against attention computed directly over each branch's own block K/V."""

from __future__ import annotations

import torch

from specfold.engine.attention_rows import attend_rows
from specfold.engine.correction import correct_rows
from specfold.engine.gate import resolve_sources
from specfold.model.attention import attend

K, N, HQ, HKV, D, P = 5, 11, 6, 2, 8, 7
CHAIN = torch.tensor([-1, 0, 1, 2, 3])  # depths 0..4
SCALE = D**-0.5


def _setup(rec: torch.Tensor, gen: torch.Generator):
    """Pools for the recomputed rows, each branch's block table, and the folded rows' Eq. 8 inputs."""
    dt = torch.float64
    src = resolve_sources(rec, CHAIN)
    flat = rec.reshape(-1)
    rows = flat.nonzero().squeeze(1)
    table = ((torch.cumsum(flat, 0) - 1).view(K, N)).gather(0, src)
    r = rows.numel()
    q = torch.randn(r, HQ, D, generator=gen, dtype=dt)
    pool_k = torch.randn(r, HKV, D, generator=gen, dtype=dt)
    pool_v = torch.randn(r, HKV, D, generator=gen, dtype=dt)
    pk = torch.randn(HKV, P, D, generator=gen, dtype=dt)
    pv = torch.randn(HKV, P, D, generator=gen, dtype=dt)
    return src, rows, table, q, pool_k, pool_v, pk, pv


def _direct(q_row, branch, table, pool_k, pool_v, pk, pv):
    """Plain attention of one query over the prefix and the branch's own block (model.attention.attend)."""
    st = attend(q_row[None, None], pk, pv, pool_k[table[branch]][None], pool_v[table[branch]][None], None, SCALE)
    return st.m[0, 0], st.z[0, 0], st.o[0, 0]


def _check(rec: torch.Tensor, gen: torch.Generator, guard: float = 0.5, tweak=None, atol: float = 1e-12):
    src, rows, table, q, pool_k, pool_v, pk, pv = _setup(rec, gen)
    if tweak is not None:
        tweak(q, pool_k, src, table)
    state = attend_rows(q, rows, pk, pv, pool_k[table], pool_v[table], SCALE)
    fold = (~rec).reshape(-1).nonzero().squeeze(1)
    fi, fn = fold // N, fold % N
    a = src.reshape(-1)[fold]
    s_slot = table[a, fn]
    branch_rows, source_rows = table[fi], table[a]
    delta = branch_rows != source_rows
    fix = correct_rows(q[s_slot], state.m[s_slot], state.z[s_slot], state.o[s_slot], pool_k, pool_v,
                       branch_rows, source_rows, delta, SCALE, guard)
    for j in range(fold.numel()):
        m, z, o = _direct(q[s_slot[j]], int(fi[j]), table, pool_k, pool_v, pk, pv)
        assert torch.allclose(fix.o[j], o, rtol=0, atol=atol), (j, (fix.o[j] - o).abs().max())
        # Same normaliser up to the different running max: Z' e^{m'} = Z e^{m}.
        assert torch.allclose(fix.z[j] * torch.exp(fix.m[j] - m), z, rtol=atol, atol=0)
        assert (fix.m[j] >= m - 1e-12).all()  # m' may keep a removed key's larger max
    depth_of_hop = torch.tensor([0, 1, 2, 3, 4])
    return fix, depth_of_hop[fi] - depth_of_hop[a], delta


def test_correction_matches_direct_attention_at_chain_depths_1_to_4() -> None:
    gen = torch.Generator().manual_seed(5)
    seen = set()
    for _ in range(6):
        rec = torch.rand(K, N, generator=gen) < 0.35
        rec[0] = True
        rec[1:, 0] = False  # position 0 of branch 4 sources from the main row: a chain of 4 folds
        rec[1:4, 1] = False
        rec[4, 1] = False
        rec[3, 1] = True  # position 1: branch 4 folds onto branch 3 (hop 1)
        _, hops, _ = _check(rec, gen)  # guard-flagged rows included: fp64 keeps them right here
        seen |= set(hops.tolist())
    assert {1, 2, 3, 4} <= seen


def test_guard_flags_a_row_whose_removed_mass_dominates() -> None:
    gen = torch.Generator().manual_seed(6)
    rec = torch.zeros(K, N, dtype=torch.bool)
    rec[0] = True
    rec[1, 3] = True  # branch 1 replaces position 3; every other row of branch 1 folds onto the main row

    def tweak(q, pool_k, src, table):
        # The main row's key at position 3 dominates every query of the main branch (score ≈ 11 against ≈ N(0, 2)
        # for the others): branch 1 replaces it, so folding onto the main row removes most of the source's mass.
        q_dir = torch.randn(D, generator=gen, dtype=q.dtype)
        pool_k[table[0, 3]] = 2.0 * q_dir
        q[:] = 2.0 * q_dir

    # In fp64 the cancellation (≈ e^11 / 20 amplification) still leaves the result right to 1e-10; the flag tells
    # the engine to recompute such rows directly (end to end: test_folded_verifier's guard test).
    fix, _, delta = _check(rec, gen, tweak=tweak, atol=1e-10)
    changed = delta.any(dim=1)  # rows of branches 2-4 at position 3 hold branch 1's K/V like their source
    assert changed.sum() > 0 and torch.equal(fix.flagged, changed)
    fix_loose, _, _ = _check(rec, torch.Generator().manual_seed(6), guard=1.0, tweak=lambda *a: None)
    assert not fix_loose.flagged.any()
