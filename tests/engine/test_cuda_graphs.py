"""CUDA-graph replay of the triton pass (:mod:`specfold.engine.cuda_graphs`) equals the eager pass (``-m gpu``).

On CPU only the argument checks run; the replay test needs CUDA (``pytest -m gpu tests/engine/test_cuda_graphs.py``,
run by ``scripts/gpu_check.sh``)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from specfold.engine.folded import FoldedVerifier  # noqa: E402
from specfold.model.loading import load_checkpoint  # noqa: E402

ALWAYS = {"attention": "correct", "cost": None, "dense_fallback": False, "delta": 0.1}
STATS = ("folded_triples", "corrected_rows", "ffn_folded_triples", "guard_fallbacks")


def test_graphed_verifier_needs_triton_on_cuda(fd_ckpt) -> None:
    from specfold.engine.cuda_graphs import GraphedVerifier

    _, _, net = load_checkpoint(fd_ckpt, dtype=torch.float32)
    with pytest.raises(ValueError, match="triton backend"):
        GraphedVerifier(FoldedVerifier(net, backend="torch", **ALWAYS))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA device"):
            GraphedVerifier(FoldedVerifier(net, backend="triton", **ALWAYS))


def _states(cfg, parents: torch.Tensor, n: int, gen: torch.Generator) -> torch.Tensor:
    states = torch.full((len(parents), n), cfg.mask_token_id, dtype=torch.long)
    states[0, :5] = torch.randint(0, 299, (5,), generator=gen)
    for i in range(1, len(parents)):
        states[i] = states[parents[i]]
        states[i, torch.randint(5, n, (2,), generator=gen)] = torch.randint(0, 299, (2,), generator=gen)
    return states


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("family", ["fd", "nld"])
def test_graph_replay_equals_eager(family, fd_ckpt, nld_ckpt) -> None:
    from specfold.engine.cuda_graphs import GraphedVerifier

    _, cfg, net = load_checkpoint(fd_ckpt if family == "fd" else nld_ckpt, dtype=torch.float32)
    net = net.cuda()
    eager = FoldedVerifier(net, backend="triton", **ALWAYS)
    graphed = GraphedVerifier(eager, bucket=32)
    gen = torch.Generator().manual_seed(0)
    cache = net.new_cache(128)
    net(torch.randint(0, 299, (13,), generator=gen)[None].cuda(), cache, mask="causal", write_cache=True)
    parents = torch.tensor([-1, 0, 1, 2, 0, 4, 1, 0], device="cuda")
    n = 32
    for step in range(3):  # new states each step; the prefix grows inside one bucket (13 → 15 → 17 ≤ 32)
        states = _states(cfg, parents.cpu(), n, gen).cuda()
        want = eager.verify(cache, states, parents)
        got = graphed.verify(cache, states, parents)
        for key in STATS:
            assert getattr(got.stats, key) == getattr(want.stats, key), (step, key)
        assert want.stats.corrected_rows > 0
        assert (got.logits - want.logits).abs().max().item() <= 1e-4, step
        cache.k[:, :, cache.length:cache.length + 2] = torch.randn_like(cache.k[:, :, :2])
        cache.v[:, :, cache.length:cache.length + 2] = torch.randn_like(cache.v[:, :, :2])
        cache.commit(2)
    assert graphed.graphs == 1  # replayed, never recaptured
    fewer = parents[:5]  # another branch count: a second graph
    states = _states(cfg, fewer.cpu(), n, gen).cuda()
    got, want = graphed.verify(cache, states, fewer), eager.verify(cache, states, fewer)
    assert (got.logits - want.logits).abs().max().item() <= 1e-4
    assert graphed.graphs == 2
    with pytest.raises(ValueError, match="parents must be"):
        graphed.verify(cache, states, torch.tensor([-1, 0, 4, 0, 1], device="cuda"))
