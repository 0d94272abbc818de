"""Kernel 4 (streaming row attention) and kernel 5 (Eq. 8 correction + guard) against their references.

Setup: 7 drafts (K = 8) with a depth-4 chain, block N = 32, prefix P = 37 read through a strided cache view,
GQA 6/2 and 4/1, head dim 64 and 128, fp32 and bf16 storage (fp32 state). Tolerances: fp32 vs an fp64 reference,
rtol = atol = 2e-5; bf16 (FlashAttention rule) error vs fp64 ≤ 2 × the torch-bf16 reference's error + 1e-5.
Discrete outputs exactly: which rows are corrected; guard flags on every row not within ±10 % of the threshold.

Cases: on a GPU, every (dtype, GQA, head dim); in the interpreter (minutes on a CPU), a pairwise cover of them —
each dtype with each GQA layout and each head dim, each GQA layout with each head dim — so every value and every
pair of values of the three factors is still checked.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from specfold.engine.kernels.attention import attend_rows  # noqa: E402
from specfold.engine.kernels.correction import correct_folded  # noqa: E402
from specfold.engine.reference import (  # noqa: E402
    GUARDED,
    attend_rows_ref,
    correct_folded_ref,
    gate_compact_ref,
    resolve_sources_ref,
)

PARENTS = torch.tensor([-1, 0, 1, 2, 3, 0, 5, 1])
K, N, P = 8, 32, 37


def _setup(hq: int, hkv: int, d: int, dtype: torch.dtype, fold_p: float = 0.6, seed: int = 0):
    """A random fold pattern, its plan (reference gate), pools, and a prefix that is a strided cache slice."""
    gen = torch.Generator().manual_seed(seed + d + hq)
    fold = torch.rand(K, N, generator=gen) < fold_p
    plan = gate_compact_ref(torch.randn(K, N, 4, generator=gen), PARENTS, 0.0, fold=fold)
    src, table = resolve_sources_ref(plan.recompute, PARENTS, plan.slot)
    r = int(plan.count)
    q = torch.randn(r, hq, d, generator=gen).to(dtype)
    pk = torch.randn(r, hkv, d, generator=gen).to(dtype)
    pv = torch.randn(r, hkv, d, generator=gen).to(dtype)
    cache_k = torch.randn(2, hkv, P + 11, d, generator=gen).to(dtype)  # [L, Hkv, capacity, D], as PrefixCache
    cache_v = torch.randn(2, hkv, P + 11, d, generator=gen).to(dtype)
    return plan, src, table, q, pk, pv, cache_k[1, :, :P], cache_v[1, :, :P]


def _listed(plan) -> torch.Tensor:
    """Flat (branch, position) of the listed rows."""
    return plan.rows[: int(plan.count)].long()


CASES = [(6, 2, 64), (4, 1, 64), (6, 2, 128), (4, 1, 128)]  # GQA 6/2 (group 3, padded to 4) and 4/1, D 64 and 128
# (dtype, hq, hkv, d): every combination on a GPU; in the interpreter the pairwise cover (each pair of factor values
# once). NOTE: for time — the interpreter runs each program of the grid in Python (~10-30 s a case on a loaded CPU).
PAIRWISE = [(torch.float32, 6, 2, 64), (torch.float32, 4, 1, 128), (torch.bfloat16, 6, 2, 128),
            (torch.bfloat16, 4, 1, 64)]
DTYPE_CASES = ([(dt, *c) for dt in (torch.float32, torch.bfloat16) for c in CASES] if torch.cuda.is_available()
               else PAIRWISE)


ATTN = [(*c, "view") for c in DTYPE_CASES]
ATTN += [(torch.float32, 6, 2, 64, "expanded"), (torch.float32, 4, 1, 64, "none")]  # other prefix layouts once


@pytest.mark.parametrize(("dtype", "hq", "hkv", "d", "prefix"), ATTN)
def test_attend_rows_matches_reference(dtype, hq, hkv, d, prefix, device, matches) -> None:
    plan, _, table, q, pk, pv, pre_k, pre_v = _setup(hq, hkv, d, dtype)
    scale = d**-0.5
    r = q.shape[0]

    def run(fn, args, pre):
        kk, vv = pre
        if prefix == "expanded":  # PrefixCache.expanded: stride 0 over branches
            kk, vv = kk.expand(K, *kk.shape), vv.expand(K, *vv.shape)
        elif prefix == "none":
            kk = vv = None
        q_, pk_, pv_, tab = args
        return fn(q_, tab, plan.branch_lists.to(tab.device), plan.branch_counts.to(tab.device), kk, vv, pk_, pv_,
                  tab, scale, tab, r)

    dev = lambda t: t.to(device)  # noqa: E731
    got = run(attend_rows, [dev(q), dev(pk), dev(pv), dev(table)], (dev(pre_k), dev(pre_v)))
    want = run(attend_rows_ref, [q.double(), pk.double(), pv.double(), table], (pre_k.double(), pre_v.double()))
    ctrl = run(attend_rows_ref, [q, pk, pv, table], (pre_k, pre_v))
    for name in ("m", "z", "o"):
        g, w, c = getattr(got, name).cpu(), getattr(want, name), getattr(ctrl, name)
        assert g.dtype == torch.float32
        matches(g, w, None if dtype == torch.float32 else c)


def _guard_margin(q, st, pk, pv, table, src, rec, scale, guard):
    """Rows whose guard decision is unambiguous: the fp64 reference flags them at guard·1.1 and at guard·0.9 alike."""
    lo = correct_folded_ref(q, st.m, st.z, st.o, pk, pv, table, src, rec, PARENTS, scale, guard * 0.9).flag
    hi = correct_folded_ref(q, st.m, st.z, st.o, pk, pv, table, src, rec, PARENTS, scale, min(1.0, guard * 1.1)).flag
    return lo == hi


CORR = [(*c, 0.5) for c in DTYPE_CASES]
CORR += [(torch.float32, 4, 1, 64, 1e-9)]  # every corrected row flagged


@pytest.mark.parametrize(("dtype", "hq", "hkv", "d", "guard"), CORR)
def test_correct_folded_matches_reference(dtype, hq, hkv, d, guard, device, matches) -> None:
    plan, src, table, q, pk, pv, pre_k, pre_v = _setup(hq, hkv, d, dtype, seed=1)
    scale = d**-0.5
    r = q.shape[0]
    rec = plan.recompute
    # the pool rows' state, from the (already tested) attention reference at fp64 — shared by all three runs
    st = attend_rows_ref(q.double(), table, plan.branch_lists, plan.branch_counts, pre_k.double(), pre_v.double(),
                         pk.double(), pv.double(), table, scale, table, r)
    st32 = [t.float() for t in (st.m, st.z, st.o)]
    dev = lambda t: t.to(device)  # noqa: E731
    got = correct_folded(dev(q), *map(dev, st32), dev(pk), dev(pv), dev(table), dev(src), dev(rec), dev(PARENTS),
                         scale, guard)
    want = correct_folded_ref(q.double(), st.m, st.z, st.o, pk.double(), pv.double(), table, src, rec, PARENTS,
                              scale, guard)
    ctrl = correct_folded_ref(q, *st32, pk, pv, table, src, rec, PARENTS, scale, guard)
    flag = got.flag.cpu()
    assert torch.equal(flag > 0, want.flag > 0)  # which rows are corrected: exact
    assert int((want.flag > 0).sum()) > 10
    sure = _guard_margin(q.double(), st, pk.double(), pv.double(), table, src, rec, scale, guard)
    assert torch.equal(flag[sure], want.flag[sure])
    if guard < 0.1:
        assert (flag[flag > 0] == GUARDED).all()
    rows = (want.flag > 0).nonzero().squeeze(1)
    for name in ("m", "z", "o"):
        g, w, c = getattr(got, name).cpu()[rows], getattr(want, name)[rows], getattr(ctrl, name)[rows]
        matches(g, w, None if dtype == torch.float32 else c, {"rtol": 1e-4, "atol": 1e-4})


def test_launchers_reject_bad_arguments(device) -> None:
    plan, src, table, q, pk, pv, pre_k, pre_v = _setup(6, 2, 64, torch.float32)
    dev = lambda t: t.to(device)  # noqa: E731
    lists, counts = dev(plan.branch_lists), dev(plan.branch_counts)
    with pytest.raises(ValueError, match="kv heads"):
        attend_rows(dev(q), dev(table), lists, counts, dev(pre_k[:1]), dev(pre_v[:1]), dev(pk), dev(pv), dev(table),
                    0.1, dev(table), 4)
    with pytest.raises(ValueError, match="multiple"):
        attend_rows(dev(q[:, :5]).contiguous(), dev(table), lists, counts, None, None, dev(pk), dev(pv), dev(table),
                    0.1, dev(table), 4)
    r = q.shape[0]
    m = torch.zeros(r, 6, device=device)
    with pytest.raises(ValueError, match="guard"):
        correct_folded(dev(q), m, m, torch.zeros(r, 6, 64, device=device), dev(pk), dev(pv), dev(table), dev(src),
                       dev(plan.recompute), dev(PARENTS), 0.1, 0.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attend_rows_reads_only_the_head_dim(dtype, device, matches) -> None:
    """A head dim that is not a power of two (20, padded to 32 in the tile) must not read past its head: the pool
    row after the last live one holds NaN, and 0 × NaN would reach the scores. (scripts/gpu_check.py's dry run
    found NaN logits from the unmasked K/V head-dim loads, in a layer whose pools were uninitialised past the
    live rows; here the neighbour is NaN on purpose.)"""
    plan, _, table, q, pk, pv, pre_k, pre_v = _setup(4, 2, 20, dtype)
    r = q.shape[0]
    nan_row = torch.full((1, *pk.shape[1:]), float("nan"), dtype=dtype)
    pk_nan, pv_nan = torch.cat([pk, nan_row]), torch.cat([pv, nan_row])  # row r is never in the table
    args = (plan.branch_lists, plan.branch_counts, pre_k, pre_v)
    got = attend_rows(q.to(device), table.to(device), *(a.to(device) for a in args), pk_nan.to(device),
                      pv_nan.to(device), table.to(device), 20**-0.5, table.to(device), r)
    want = attend_rows_ref(q.double(), table, *args[:2], pre_k.double(), pre_v.double(), pk.double(), pv.double(),
                           table, 20**-0.5, table, r)
    ctrl = attend_rows_ref(q, table, *args[:2], pre_k, pre_v, pk, pv, table, 20**-0.5, table, r)
    slots = table.reshape(-1)[plan.rows[: int(plan.count)].long()]
    for name in ("m", "z", "o"):
        g = getattr(got, name).cpu()[slots]
        assert not g.isnan().any(), name
        matches(g, getattr(want, name)[slots], None if dtype == torch.float32 else getattr(ctrl, name)[slots])
