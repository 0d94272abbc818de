"""``FoldedVerifier(backend="triton")`` equals the torch backend on random checkpoints of both families.

fp32 models: gate decisions (per layer) and fold statistics exactly, logits within 1e-3 absolute (observed ~2e-5:
the kernels reassociate sums). The compaction order differs from the torch engine's (atomics), which must not
matter downstream.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from specfold.engine.folded import FoldedVerifier  # noqa: E402
from specfold.model.loading import load_checkpoint  # noqa: E402

PARENTS = torch.tensor([-1, 0, 1, 2, 3, 0, 5, 1])
N, PROMPT = 32, 13
LOGIT_ATOL = 1e-3
STATS = ("folded_triples", "corrected_rows", "ffn_folded_triples", "guard_fallbacks")


def _setup(ckpt, device: str, seed: int = 0):
    _, cfg, net = load_checkpoint(ckpt, dtype=torch.float32)
    net = net.to(device)
    gen = torch.Generator().manual_seed(seed)
    cache = net.new_cache(64)
    net(torch.randint(0, 299, (PROMPT,), generator=gen)[None].to(device), cache, mask="causal", write_cache=True)
    states = torch.full((len(PARENTS), N), cfg.mask_token_id, dtype=torch.long)
    states[0, :10] = torch.randint(0, 299, (10,), generator=gen)
    for i in range(1, len(PARENTS)):
        states[i] = states[PARENTS[i]]
        pos = torch.randint(8, N, (2,), generator=gen)
        states[i, pos] = torch.randint(0, 299, (2,), generator=gen)
    states[6] = states[5]
    return net, cache, states.to(device)


def _compare(net, cache, states, **kw) -> dict[str, float]:
    par = PARENTS.to(states.device)
    always = {"attention": "correct", "cost": None, "dense_fallback": False}  # Eq. 8 wherever the gate folds
    want, tw = FoldedVerifier(net, backend="torch", **always, **kw).run(cache, states, par, trace=True)
    got, tg = FoldedVerifier(net, backend="triton", **always, **kw).run(cache, states, par, trace=True)
    for lw, lg in zip(tw.layers, tg.layers, strict=True):
        assert torch.equal(lw.recompute, lg.recompute)
        assert torch.equal(lw.src, lg.src)
        assert torch.equal(lw.ffn_recompute, lg.ffn_recompute)
    for key in STATS:
        assert getattr(got.stats, key) == getattr(want.stats, key), key
    err = (got.logits - want.logits).abs().max().item()
    assert err <= LOGIT_ATOL, err
    return got.stats


@pytest.mark.parametrize("family", ["fd", "nld"])
@pytest.mark.parametrize("delta", [0.0, 0.1])
def test_triton_backend_equals_torch(family, delta, fd_ckpt, nld_ckpt, device) -> None:
    net, cache, states = _setup(fd_ckpt if family == "fd" else nld_ckpt, device)
    stats = _compare(net, cache, states, delta=delta)
    assert stats.folded_triples > 0 and stats.corrected_rows > 0  # every kernel really ran


def test_triton_backend_paper_ffn_and_guard(fd_ckpt, device) -> None:
    net, cache, states = _setup(fd_ckpt, device, seed=1)
    _compare(net, cache, states, delta=0.1, ffn="paper")
    stats = _compare(net, cache, states, delta=0.0, guard=1e-9)  # every corrected row goes to direct attention
    assert stats.guard_fallbacks == stats.corrected_rows > 0


def test_triton_backend_rejects_fp64(fd_ckpt) -> None:
    _, _, net = load_checkpoint(fd_ckpt, dtype=torch.float64)
    with pytest.raises(ValueError, match="fp32/bf16/fp16"):
        FoldedVerifier(net, 0.1, backend="triton")
