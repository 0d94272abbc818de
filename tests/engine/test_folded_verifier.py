"""FoldedVerifier end to end: identity with dense verification at δ = 0, the SPEC §4 semantics at δ > 0 against an
independent per-branch loop, exact inheritance of table entries, and statistics."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tests.engine.branch_pass import PARENTS, N, branch_pass

from specfold.engine.dense import DenseVerifier
from specfold.engine.folded import FoldedVerifier
from specfold.model.attention import attend
from specfold.model.loading import load_checkpoint

# The folding mechanics under test: fold wherever the gate says, without the cost rule's dense fallback.
ALWAYS = {"cost": None, "dense_fallback": False}


def _reference(net, cache, states, parents, delta: float, ffn: str):
    """SPEC §4 branch by branch in topological order, attention of *every* row computed directly over its branch's
    own (partly inherited) block K/V — no Eq. 8, no packing. The FFN is reused on the layer's folded set
    (``paper``) or gated on its own input H' (``residual``). Returns logits and recompute masks."""
    k, n = states.shape
    cos, sin, qs = net.rope_tables(cache.length, n)
    h = F.embedding(states, net.embed)  # [K, N, E]
    masks = []
    for layer_idx, layer in enumerate(net.layers):
        rec = torch.ones(k, n, dtype=torch.bool)
        for i in range(1, k):
            p = int(parents[i])
            rho = (h[i].double() - h[p].double()).norm(dim=-1) / h[p].double().norm(dim=-1)
            rec[i] = ~(rho <= delta)
        qs_, ks_, vs_ = [], [], []
        for i in range(k):
            q, kk, v = layer.qkv(h[i], cos, sin, qs)
            if i:
                p, m = int(parents[i]), rec[i][:, None, None]
                q, kk, v = torch.where(m, q, qs_[p]), torch.where(m, kk, ks_[p]), torch.where(m, v, vs_[p])
            qs_.append(q), ks_.append(kk), vs_.append(v)
        pk, pv = cache.layer(layer_idx)
        o = attend(torch.stack(qs_), pk, pv, torch.stack(ks_), torch.stack(vs_), None, net.scale).o
        h1 = h + layer.attn_out(o.to(h.dtype).reshape(k * n, *o.shape[2:])).view(k, n, -1)
        fs = []
        for i in range(k):
            f = layer.ffn(h1[i])
            if i:
                p = int(parents[i])
                frec = rec[i]
                if ffn == "residual":
                    frec = ~((h1[i].double() - h1[p].double()).norm(dim=-1) / h1[p].double().norm(dim=-1) <= delta)
                f = torch.where(frec[:, None], f, fs[p])
            fs.append(f)
        h = h1 + torch.stack(fs)
        masks.append(rec)
    return net.position_logits(net.logits(h)), masks


@pytest.mark.parametrize("family", ["fd", "nld"])
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-9), (torch.float32, 1e-4)])
def test_delta_zero_equals_dense(family, dtype, tol, fd_ckpt, nld_ckpt) -> None:
    net, cache, states = branch_pass(fd_ckpt if family == "fd" else nld_ckpt, dtype)
    dense = DenseVerifier(net).verify(cache, states, PARENTS).logits
    res = FoldedVerifier(net, 0.0, **ALWAYS).verify(cache, states, PARENTS)  # default ffn="residual"
    assert res.stats.fold_ratio() > 0.2 and res.stats.corrected_rows > 0  # Eq. 8 really ran
    err = (res.logits - dense).abs().max().item()
    assert err <= tol, err


def test_guard_fallback_is_exact(fd_ckpt) -> None:
    net, cache, states = branch_pass(fd_ckpt, torch.float64)
    dense = DenseVerifier(net).verify(cache, states, PARENTS).logits
    res = FoldedVerifier(net, 0.0, guard=1e-9, **ALWAYS).verify(cache, states, PARENTS)
    assert res.stats.guard_fallbacks > 0
    assert (res.logits - dense).abs().max().item() <= 1e-9


def test_paper_ffn_reuse_is_not_exact_at_delta_zero(fd_ckpt) -> None:
    # why "residual" is the default: SPEC §4 step 6 reuses F on rows whose post-attention input changed
    net, cache, states = branch_pass(fd_ckpt, torch.float64)
    dense = DenseVerifier(net).verify(cache, states, PARENTS).logits
    res = FoldedVerifier(net, 0.0, ffn="paper", **ALWAYS).verify(cache, states, PARENTS)
    assert (res.logits - dense).abs().max().item() > 1e-3


@pytest.mark.parametrize("family", ["fd", "nld"])
@pytest.mark.parametrize("delta", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("ffn", ["residual", "paper"])
def test_matches_spec_semantics(family, delta, ffn, fd_ckpt, nld_ckpt) -> None:
    net, cache, states = branch_pass(fd_ckpt if family == "fd" else nld_ckpt, torch.float64, seed=1)
    ref_logits, ref_masks = _reference(net, cache, states, PARENTS, delta, ffn)
    res, tr = FoldedVerifier(net, delta, ffn=ffn, **ALWAYS).run(cache, states, PARENTS, trace=True)
    for layer, want in zip(tr.layers, ref_masks, strict=True):
        assert torch.equal(layer.recompute, want)
    assert (res.logits - ref_logits).abs().max().item() <= 1e-9
    if delta > 0:
        assert res.stats.fold_ratio() > 0.3


@pytest.mark.parametrize("delta", [0.1, 0.3])
def test_gate_and_inherited_entries(delta, nld_ckpt) -> None:
    net, cache, states = branch_pass(nld_ckpt, torch.float64, seed=2)
    _, tr = FoldedVerifier(net, delta, **ALWAYS).run(cache, states, PARENTS, trace=True)
    for lt in tr.layers:
        h = lt.h
        par = PARENTS.clamp(min=0)
        rho = (h - h[par]).norm(dim=-1) / h[par].norm(dim=-1)
        want = rho > delta
        want[0] = True
        assert torch.equal(lt.recompute, want)
        for i in range(1, len(PARENTS)):
            p = int(PARENTS[i])
            for n in (~lt.recompute[i]).nonzero().squeeze(1).tolist():
                a = int(lt.src[i, n])
                assert lt.recompute[a, n] and a != i
                for table in (lt.q, lt.k, lt.v):  # the parent's entry, which is the source's
                    assert torch.equal(table[i, n], table[p, n]) and torch.equal(table[i, n], table[a, n])
        # the FFN's own gate (default ffn="residual") on its input H' against the parent's
        h1 = lt.h1
        rho1 = (h1 - h1[par]).norm(dim=-1) / h1[par].norm(dim=-1)
        want1 = rho1 > delta
        want1[0] = True
        assert torch.equal(lt.ffn_recompute, want1)
        for i in range(1, len(PARENTS)):
            for n in (~lt.ffn_recompute[i]).nonzero().squeeze(1).tolist():
                assert torch.equal(lt.f[i, n], lt.f[int(PARENTS[i]), n])


def test_statistics(fd_ckpt) -> None:
    """Every count of the stats against the pass's own per-layer tables (trace): folded and recomputed rows per
    layer and per graph depth, rows whose block context changed (Δ ≠ ∅, Eq. 8), guard fallbacks, FFN reuse; in
    the typed fields and in the flat keys records carry."""
    net, cache, states = branch_pass(fd_ckpt, torch.float64)
    res, tr = FoldedVerifier(net, 0.2, **ALWAYS).run(cache, states, PARENTS, trace=True)
    stats = res.stats
    s = stats.to_dict()
    layers, k = net.cfg.num_layers, len(PARENTS)
    depth = [0] * k
    for i in range(1, k):
        depth[i] = depth[int(PARENTS[i])] + 1
    want = {"folded_triples": 0, "corrected_rows": 0, "guard_fallbacks": 0, "ffn_folded_triples": 0}
    by_depth = {d: 0 for d in set(depth[1:])}
    for i, lt in enumerate(tr.layers):
        folded = ~lt.recompute  # [K, N]
        assert not folded[0].any()
        assert s[f"folded_l{i}"] == folded.sum().item()
        assert s[f"recomputed_rows_l{i}"] == lt.recompute.sum().item() == k * N - folded.sum().item()
        for b in range(1, k):
            by_depth[depth[b]] += folded[b].sum().item()
        # Δ ≠ ∅: some position of the row's branch holds another source than the same position of its source's
        changed = [(lt.src[b] != lt.src[int(lt.src[b, n])]).any().item() for b, n in folded.nonzero().tolist()]
        want["folded_triples"] += folded.sum().item()
        want["corrected_rows"] += sum(changed)
        want["guard_fallbacks"] += lt.flagged.numel()
        want["ffn_folded_triples"] += (~lt.ffn_recompute).sum().item()
    assert {key: s[key] for key in want} == want
    assert s["draft_triples"] == (k - 1) * N * layers
    for d, n_folded in by_depth.items():
        assert s[f"folded_d{d}"] == n_folded
        assert s[f"draft_d{d}"] == sum(depth[b] == d for b in range(1, k)) * N * layers
    assert 0 < s["folded_triples"] < s["draft_triples"] and 0 < s["corrected_rows"] < s["folded_triples"]
    assert stats.fold_ratio() == s["folded_triples"] / s["draft_triples"]
    assert stats.folded_by_layer == tuple((~lt.recompute).sum().item() for lt in tr.layers)
    assert stats.recomputed_by_layer == tuple(lt.recompute.sum().item() for lt in tr.layers)
    assert stats.folded_by_depth == (0, *(by_depth[d] for d in range(1, max(depth) + 1)))
    assert {key: getattr(stats, key) for key in want} == want
    assert (stats.layers, stats.rows) == (layers, k * N)


def test_rejects_unknown_backend(fd_ckpt) -> None:
    _, _, net = load_checkpoint(fd_ckpt, dtype=torch.float64)
    with pytest.raises(ValueError, match="backend"):
        FoldedVerifier(net, 0.1, backend="cuda-graph")


@pytest.mark.parametrize("family", ["fd", "nld"])
@pytest.mark.parametrize("delta", [0.0, 0.1])
def test_direct_attention_mode_matches_the_correction(family, delta, fd_ckpt, nld_ckpt) -> None:
    # attention="direct" computes every row's attention over its branch's own K/V: the quantity Eq. 8 corrects to
    net, cache, states = branch_pass(fd_ckpt if family == "fd" else nld_ckpt, torch.float64, seed=3)
    corrected = FoldedVerifier(net, delta, **ALWAYS).verify(cache, states, PARENTS)
    direct = FoldedVerifier(net, delta, attention="direct", **ALWAYS).verify(cache, states, PARENTS)
    assert direct.stats.folded_triples == corrected.stats.folded_triples > 0
    assert (direct.logits - corrected.logits).abs().max().item() <= 1e-9
    if delta == 0.0:
        dense = DenseVerifier(net).verify(cache, states, PARENTS).logits
        assert (direct.logits - dense).abs().max().item() <= 1e-9


@pytest.mark.parametrize("ratio", [0.3, 0.6, 0.9])
def test_imposed_fold_ratio_governs_every_layer(ratio, fd_ckpt) -> None:
    """``imposed_fold`` (the GPU check's fixed fold ratios): each layer folds exactly its imposed non-root rows,
    the same pattern on every call, and the realised ratio is the imposed one up to sampling."""
    net, cache, states = branch_pass(fd_ckpt, torch.float64)
    v = FoldedVerifier(net, 0.0, ffn="paper", attention="correct", imposed_fold=ratio, **ALWAYS)
    res, tr = v.run(cache, states, PARENTS, trace=True)
    imposed = v._imposed(len(PARENTS), N)  # [L, K, N]
    for i, lt in enumerate(tr.layers):
        want = imposed[i].clone()
        want[0] = False  # a root never folds
        assert torch.equal(~lt.recompute, want)
    assert abs(res.stats.fold_ratio() - ratio) < 0.1
    again = v.verify(cache, states, PARENTS)
    assert torch.equal(again.logits, res.logits) and again.stats == res.stats


def test_imposed_fold_zero_is_dense_and_bad_ratios_are_refused(fd_ckpt) -> None:
    net, cache, states = branch_pass(fd_ckpt, torch.float64)
    dense = DenseVerifier(net).verify(cache, states, PARENTS).logits
    res = FoldedVerifier(net, 0.0, ffn="paper", attention="correct", imposed_fold=0.0, **ALWAYS).verify(
        cache, states, PARENTS)
    assert res.stats.folded_triples == 0 and (res.logits - dense).abs().max().item() <= 1e-9
    with pytest.raises(ValueError, match="imposed_fold must be a fraction in"):
        FoldedVerifier(net, 0.0, imposed_fold=1.5)
