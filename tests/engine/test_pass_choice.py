"""The per-pass rule (engine/cost.py PassCost, FoldedVerifier.pass_choice): before the first gate a pass runs
dense when folding cannot pay. Exercised both ways, forced and through the rule; a dense pass equals the dense
verifier bit for bit and says so in its statistics (``dense_passes``)."""

from __future__ import annotations

import pytest
import torch
from tests.engine.branch_pass import PARENTS, branch_pass

from specfold.engine.base import BatchBranches
from specfold.engine.cost import PassCost
from specfold.engine.dense import DenseVerifier
from specfold.engine.folded import FoldedVerifier
from specfold.engine.layer_types import FoldConfig
from specfold.engine.pass_measure import measure_pass
from specfold.model.cache import BatchCache


def test_rule_follows_its_formula() -> None:
    from specfold.engine.cost import LayerCost

    layer = LayerCost.of(1536, 12, 2, 128, 8960, op_macs=0.0)
    free, pricey = PassCost(layer, 1e-3, 0.0), PassCost(layer, 1e-3, 1.0)
    m, n = 256, 32
    assert free.remaining(m, n, 512, 0.0) == pytest.approx(1.0) and free.remaining(m, n, 512, 1.0) < 0.5
    assert free.folding_pays(m, n, 512, 0.1) and not free.folding_pays(m, n, 512, 0.0)  # nothing folded: dense
    assert not pricey.folding_pays(m, n, 512, 1.0)  # bookkeeping dearer than a whole dense layer
    mid = PassCost(layer, 1e-3, 2e-4)
    # more rows and a higher fold ratio both make folding pay; the break-even moves down as the pass widens
    assert not mid.folding_pays(64, n, 128, 0.5) and mid.folding_pays(1024, n, 128, 0.5)
    assert not mid.folding_pays(256, n, 128, 0.1) and mid.folding_pays(256, n, 128, 0.9)
    # a batched pass holds a main branch per request, none of which folds: 8 blocks of 6 requests keep far more rows
    # than 8 blocks of one request at the same fold ratio of their drafts, and may not pay where one request does
    assert free.remaining(m, n, 128, 1.0, roots=4) > free.remaining(m, n, 128, 1.0)
    assert free.remaining(m, n, 128, 1.0, roots=8) == pytest.approx(1.0)  # every block a main branch: nothing folds
    assert mid.folding_pays(256, n, 128, 0.5) and not mid.folding_pays(256, n, 128, 0.5, roots=6)


def test_measured_once_per_shape(fd_ckpt) -> None:
    net, _, _ = branch_pass(fd_ckpt, torch.float32)
    v = FoldedVerifier(net, 0.1)
    assert v.pass_cost is not None and v.pass_cost.dense_seconds > 0 and v.pass_cost.gate_seconds >= 0
    assert v.pass_cost.measure_seconds > v.pass_cost.dense_seconds  # what measuring cost, reported (several layers)
    again = measure_pass(net, v.cost)
    assert again == v.pass_cost  # cached: the same constants, the same reported cost, nothing measured again
    # no cost rule, a forced choice or an imposed fold ratio: nothing measured, nothing decided
    assert FoldedVerifier(net, 0.1, cost=None, dense_fallback=False).pass_cost is None
    assert FoldedVerifier(net, 0.1, pass_choice="fold").pass_cost is None
    with pytest.raises(ValueError, match="pass choice"):
        FoldConfig(pass_choice="maybe")


@pytest.mark.parametrize("family", ["fd", "nld"])
def test_dense_pass_equals_dense_verifier(family, fd_ckpt, nld_ckpt) -> None:
    net, cache, states = branch_pass(fd_ckpt if family == "fd" else nld_ckpt, torch.float32)
    dense = DenseVerifier(net).verify(cache, states, PARENTS).logits
    res = FoldedVerifier(net, 0.3, pass_choice="dense").verify(cache, states, PARENTS)
    assert torch.equal(res.logits, dense)
    layers = net.cfg.num_layers
    s = res.stats
    assert (s.dense_passes, s.dense_layers, s.layers, s.folded_triples) == (1, layers, layers, 0)
    assert s.draft_triples == (len(PARENTS) - 1) * states.shape[1] * layers and s.fold_ratio() == 0.0
    assert s.to_dict()["dense_passes"] == 1.0
    folded = FoldedVerifier(net, 0.3, pass_choice="fold").verify(cache, states, PARENTS)
    assert folded.stats.dense_passes == 0 and folded.stats.folded_triples > 0


def test_rule_decides_both_ways(fd_ckpt) -> None:
    """The same verifier under a rule that says folding pays (free bookkeeping) and one that says it cannot (the
    bookkeeping dearer than any layer): the first folds, the second is the dense verifier; at δ = 0 both equal
    dense. The running fold ratio moves only on folded passes."""
    net, cache, states = branch_pass(fd_ckpt, torch.float64)
    dense = DenseVerifier(net).verify(cache, states, PARENTS).logits
    v = FoldedVerifier(net, 0.0)
    layer = v.cost
    v.pass_cost = PassCost(layer, 1.0, 0.0)
    before = v.fold_estimate
    folds = v.verify(cache, states, PARENTS)
    assert folds.stats.dense_passes == 0 and folds.stats.folded_triples > 0
    assert (folds.logits - dense).abs().max().item() < 1e-9
    assert v.fold_estimate != before
    v.pass_cost = PassCost(layer, 1.0, 1e9)
    kept = v.fold_estimate
    dense_run = v.verify(cache, states, PARENTS)
    assert dense_run.stats.dense_passes == 1 and torch.equal(dense_run.logits, dense)
    assert v.fold_estimate == kept


def test_batched_dense_pass_equals_dense_verifier(fd_ckpt) -> None:
    from specfold.model.loading import load_model

    model = load_model(fd_ckpt, dtype="fp64")
    net, c, n = model.net, model.config, model.config.block_size
    g = torch.Generator().manual_seed(3)
    lengths, branches = [n, 2 * n], [3, 2]
    cache = BatchCache(c.num_layers, 2, c.num_kv_heads, c.head_dim, 4 * n, net.dtype)
    for s, t in enumerate(lengths):
        net.prefill(torch.randint(0, 200, (t,), generator=g), cache.slot(s), mask="block_causal")
    states = torch.randint(0, 200, (2, 3, n), generator=g)
    parents = torch.tensor([[-1, 0, 1], [-1, 0, 0]])
    batch = BatchBranches(cache, torch.arange(2), torch.tensor(lengths), states, parents, branches)
    want = DenseVerifier(net).verify_batch(batch)
    got = FoldedVerifier(net, 0.2, pass_choice="dense").verify_batch(batch)
    for r, kr in enumerate(branches):
        assert torch.equal(got.logits[r], want.logits[r])
        assert got.stats[r].dense_passes == 1 and got.stats[r].rows == kr * n
        assert got.stats[r].draft_triples == (kr - 1) * n * c.num_layers
