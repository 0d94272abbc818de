"""The per-layer cost rule (engine/cost.py): its choices follow the formulas, and every choice it can make keeps the
pass exact where folding is exact (δ = 0) and equal to the dense verifier where it falls back."""

from __future__ import annotations

import pytest
import torch
from tests.engine.branch_pass import PARENTS, branch_pass

from specfold.engine.cost import OPS_CORRECT, OPS_DIRECT, OPS_FFN, LayerCost, measure_machine
from specfold.engine.dense import DenseVerifier
from specfold.engine.folded import FoldedVerifier
from specfold.engine.layer_types import FoldConfig
from specfold.model.loading import load_checkpoint


def _cost(net, op_macs: float) -> LayerCost:
    c = net.cfg
    return LayerCost.of(c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size, op_macs)


def test_attention_plan_follows_the_formulas() -> None:
    cost = LayerCost.of(1536, 12, 2, 128, 8960, op_macs=0.0)  # free bookkeeping: fold whenever rows are saved
    m, n = 256, 32
    assert cost.attention_plan(m, n, 512, r=m, c=0) == "dense"  # nothing folds: dense is first of equals
    assert cost.attention_plan(m, n, 512, r=100, c=120) == "correct"  # long prefix: Eq. 8 saves attention rows
    assert cost.attention_plan(m, n, 0, r=100, c=150) == "direct"  # no prefix: Eq. 8's C·R work is all cost
    # Bookkeeping dearer than what folding saves: dense.
    saved = (m - 250) * (cost.qkv + cost.attn_per_key * (512 + n))
    pricey = LayerCost.of(1536, 12, 2, 128, 8960, op_macs=2 * saved / min(OPS_DIRECT, OPS_CORRECT))
    assert pricey.attention_plan(m, n, 512, r=250, c=6) == "dense"
    assert pricey.attention_plan(m, n, 512, r=250, c=6, options=("correct",)) == "correct"
    assert cost.ffn_folds(m, m - 1) and not LayerCost.of(1536, 12, 2, 128, 8960, cost.ffn / OPS_FFN).ffn_folds(m, m - 1)


def test_measured_machine_is_cached_and_positive() -> None:
    a = measure_machine("cpu", torch.float32)
    assert a is measure_machine("cpu", torch.float32)
    assert a.seconds_per_op > 0 and a.macs_per_second > 0


@pytest.mark.parametrize("family", ["fd", "nld"])
def test_dense_fallback_equals_dense_verifier(family, fd_ckpt, nld_ckpt) -> None:
    """A cost rule under which folding never pays runs every layer densely: the dense verifier's logits, bit for
    bit, at any δ, and the statistics say so."""
    net, cache, states = branch_pass(fd_ckpt if family == "fd" else nld_ckpt, torch.float32)
    dense = DenseVerifier(net).verify(cache, states, PARENTS).logits
    res = FoldedVerifier(net, 0.3, cost=_cost(net, op_macs=1e18)).verify(cache, states, PARENTS)
    assert torch.equal(res.logits, dense)
    assert res.stats.dense_layers == res.stats.layers == net.cfg.num_layers
    assert res.stats.folded_triples == res.stats.ffn_folded_triples == 0


@pytest.mark.parametrize("family", ["fd", "nld"])
def test_cost_rule_choices_are_exact_at_delta_zero(family, fd_ckpt, nld_ckpt) -> None:
    """Free bookkeeping (every layer folds, attention auto) and the measured rule both equal dense at δ = 0."""
    net, cache, states = branch_pass(fd_ckpt if family == "fd" else nld_ckpt, torch.float64)
    dense = DenseVerifier(net).verify(cache, states, PARENTS).logits
    free = FoldedVerifier(net, 0.0, cost=_cost(net, op_macs=0.0)).verify(cache, states, PARENTS)
    assert free.stats.dense_layers == 0 and free.stats.folded_triples > 0
    assert (free.logits - dense).abs().max().item() < 1e-9
    measured = FoldedVerifier(net, 0.0).verify(cache, states, PARENTS)
    assert (measured.logits - dense).abs().max().item() < 1e-9


def test_fold_config_rejects_bad_settings(fd_ckpt) -> None:
    for bad, msg in [({"delta": 1.5}, "delta"), ({"delta": float("nan")}, "delta"), ({"delta": -0.1}, "delta"),
                     ({"ffn": "x"}, "ffn"), ({"attention": "x"}, "attention"), ({"backend": "cuda"}, "backend"),
                     ({"guard": 0.0}, "guard"), ({"backend": "triton", "attention": "direct"}, "triton")]:
        with pytest.raises(ValueError, match=msg):
            FoldConfig(**bad)
    _, _, net = load_checkpoint(fd_ckpt)
    with pytest.raises(ValueError, match="delta"):
        FoldedVerifier(net, 2.0)
