"""The training layout: what the noisy rows see is what an active block sees at inference, and the slim layout
drops only rows that no loss depends on."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from specfold.model.families import config_from_dict
from specfold.model.random_checkpoint import save_checkpoint
from specfold.model.transformer import DLLM
from specfold.train.trainer import (
    TrainConfig,
    init_weights,
    make_batch,
    model_config_dict,
    training_logits,
    warm_start,
)

BLOCK, MASK, PAD, VOCAB = 8, 1, 0, 40


@pytest.fixture(scope="module")
def net() -> DLLM:
    cfg = TrainConfig(out_dir="-", tokenizer_dir="-", block_size=BLOCK, hidden_size=48, num_layers=2, num_heads=4,
                      num_kv_heads=2, intermediate_size=64)
    model = DLLM(config_from_dict(model_config_dict(cfg, VOCAB)))
    init_weights(model, seed=3)
    with torch.no_grad():  # the trainer's init leaves the residual branches tiny; make every row matter
        for p in model.parameters():
            p.mul_(8.0 if p.dim() == 2 else 1.0)
    return model.eval()


def _seqs(starts_lengths: list[tuple[int, int]], seed: int = 0) -> list[tuple[list[int], int]]:
    gen = random.Random(seed)
    return [([gen.randrange(2, VOCAB) for _ in range(n)], start) for start, n in starts_lengths]


def _logits(net: DLLM, batch) -> torch.Tensor:
    layout = batch.layout
    with torch.no_grad():
        return training_logits(net, batch.tokens, layout.positions(), layout.mask(batch.tokens.device))


# (response start, length) per sequence: responses starting in block 1 or 2, at and off a block boundary
CASES = {
    "all-in-block-1": [(10, 20), (12, 24), (9, 17)],
    "boundary": [(16, 28), (17, 30)],
    "mixed": [(4, 12), (18, 32), (11, 26)],
}


@pytest.mark.parametrize("causal", [False, True], ids=["3-copies", "with-causal-copy"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_slim_layout_keeps_every_loss_row_and_its_logits(net, case, causal):
    seqs = _seqs(CASES[case])
    full = make_batch(seqs, BLOCK, MASK, PAD, random.Random(1), slim=False, causal=causal)
    slim = make_batch(seqs, BLOCK, MASK, PAD, random.Random(1), causal=causal)
    keep = slim.layout.rows()
    assert keep.numel() < full.tokens.shape[1]  # something is dropped in every case
    assert torch.equal(slim.tokens, full.tokens[:, keep])
    assert torch.equal(slim.targets, full.targets[:, keep])
    dropped = torch.ones(full.tokens.shape[1], dtype=torch.bool)
    dropped[keep] = False
    assert (full.targets[:, dropped] == -100).all()  # no loss row is lost

    lf, ls = _logits(net, full), _logits(net, slim)
    torch.testing.assert_close(ls, lf[:, keep], rtol=0, atol=1e-5)
    loss_full = F.cross_entropy(lf.reshape(-1, VOCAB), full.targets.reshape(-1), ignore_index=-100)
    loss_slim = F.cross_entropy(ls.reshape(-1, VOCAB), slim.targets.reshape(-1), ignore_index=-100)
    torch.testing.assert_close(loss_slim, loss_full, rtol=1e-6, atol=0)


def test_noisy_rows_match_an_active_block_over_the_prefix_cache(net):
    """Training's noisy block b equals the inference forward of that block over a cache of clean blocks < b
    (written block-causally); its clean rows equal the block-causal prefill."""
    seqs = _seqs([(5, 24), (13, 22)], seed=4)
    batch = make_batch(seqs, BLOCK, MASK, PAD, random.Random(2), slim=False)
    logits = _logits(net, batch)
    length = batch.layout.length
    for row, tokens in enumerate(batch.tokens):
        noisy_a, noisy_b, clean = tokens[:length], tokens[length : 2 * length], tokens[2 * length :]
        assert torch.equal(torch.where(noisy_a == MASK, noisy_b, noisy_a), clean)  # complementary copies
        assert not ((noisy_a == MASK) & (noisy_b == MASK)).any()
        with torch.no_grad():
            prefill = net(clean[None], None, mask="block_causal")[0]
        torch.testing.assert_close(logits[row, 2 * length :], prefill, rtol=0, atol=1e-5)
        for b in range(length // BLOCK):
            cache = net.new_cache(length)
            with torch.no_grad():
                if b:
                    net(clean[None, : b * BLOCK], cache, mask="block_causal", write_cache=True)
                for copy, noisy in enumerate((noisy_a, noisy_b)):
                    active = net(noisy[None, b * BLOCK : (b + 1) * BLOCK], cache)[0]
                    got = logits[row, copy * length + b * BLOCK : copy * length + (b + 1) * BLOCK]
                    torch.testing.assert_close(got, active, rtol=0, atol=1e-5)


def test_causal_rows_are_an_autoregressive_forward_over_the_prefix_cache(net):
    """The causal copy's block b equals a causal forward of clean block b over a cache of clean blocks < b, and
    row ``p - 1`` carries the loss of every maskable position ``p``: each response token is also predicted from
    exactly its left context."""
    seqs = _seqs([(5, 24), (13, 22)], seed=5)
    batch = make_batch(seqs, BLOCK, MASK, PAD, random.Random(3), slim=False, causal=True)
    logits = _logits(net, batch)
    length = batch.layout.length
    for row, (ids, resp_start) in enumerate(seqs):
        clean = batch.tokens[row, 2 * length : 3 * length]
        assert torch.equal(batch.tokens[row, 3 * length :], clean)
        targets = batch.targets[row, 3 * length :]
        resp = [p for p in range(resp_start, length) if p % BLOCK and p < -(-len(ids) // BLOCK) * BLOCK]
        assert (targets != -100).nonzero().flatten().tolist() == [p - 1 for p in resp]
        assert torch.equal(targets[[p - 1 for p in resp]], clean[resp])
        for b in range(length // BLOCK):
            cache = net.new_cache(length)
            with torch.no_grad():
                if b:
                    net(clean[None, : b * BLOCK], cache, mask="block_causal", write_cache=True)
                ar = net(clean[None, b * BLOCK : (b + 1) * BLOCK], cache, mask="causal")[0]
            got = logits[row, 3 * length + b * BLOCK : 3 * length + (b + 1) * BLOCK]
            torch.testing.assert_close(got, ar, rtol=0, atol=1e-5)


def test_warm_start_takes_every_weight_of_the_checkpoint(net, tmp_path):
    cfg = TrainConfig(out_dir="-", tokenizer_dir="-", block_size=BLOCK, hidden_size=48, num_layers=2, num_heads=4,
                      num_kv_heads=2, intermediate_size=64)
    cfg_dict = model_config_dict(cfg, VOCAB)
    save_checkpoint(net, tmp_path / "ckpt", cfg_dict)
    fresh = DLLM(config_from_dict(cfg_dict))
    init_weights(fresh, seed=9)
    warm_start(fresh, cfg_dict, tmp_path / "ckpt")
    want, got = net.state_dict(), fresh.state_dict()
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)  # fp32 checkpoint: a bit-exact copy

    wider = model_config_dict(TrainConfig(out_dir="-", tokenizer_dir="-", block_size=BLOCK, hidden_size=48,
                                          num_layers=3, num_heads=4, num_kv_heads=2, intermediate_size=64), VOCAB)
    with pytest.raises(ValueError, match="num_layers: checkpoint 2 vs run 3"):
        warm_start(DLLM(config_from_dict(wider)), wider, tmp_path / "ckpt")
