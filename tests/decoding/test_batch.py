"""Batched decoding: every request's tokens equal its batch-1 decode (fp64), whatever its batch neighbours."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from specfold.config import DecodeConfig
from specfold.decoding.core import BatchRequest, Decoder
from specfold.decoding.decoder import decode, decode_batch
from specfold.model.loading import load_model


def _cfg(model, **kw) -> DecodeConfig:
    n = model.config.block_size
    return DecodeConfig(block_size=n, small_block_size=n // 2, threshold=0.5, **kw)


def _prompts(model, lengths, seed=3):
    g = torch.Generator().manual_seed(seed)
    top = min(model.mask_id, model.stop_id) - 1
    return [torch.randint(0, top, (t,), generator=g).tolist() for t in lengths]


@pytest.fixture(params=["fd", "nld"])
def model(request, fd_ckpt, nld_ckpt):
    return load_model(fd_ckpt if request.param == "fd" else nld_ckpt, dtype="fp64")


def test_vanilla_batch_equals_batch_one_with_refill_fp64(model):
    n = model.config.block_size
    # aligned and unaligned prompts of different lengths; 7 prompts through a batch of 3 (continuous refill)
    prompts = _prompts(model, [n, 3, 2 * n + 1, n - 1, 5, 2 * n, 1])
    cfg = _cfg(model, max_new_tokens=3 * n)
    # a stop token that appears mid-generation in the first request: requests stop at different blocks
    first = decode(model, prompts[0], cfg).token_ids
    model = replace(model, stop_id=first[n + 2])
    want = [decode(model, p, cfg) for p in prompts]
    got = decode_batch(model, prompts, cfg, max_batch=3)
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    assert [r.nfe for r in got] == [r.nfe for r in want]
    assert [r.steps_per_block for r in got] == [r.steps_per_block for r in want]
    assert [r.stopped for r in got] == [r.stopped for r in want]
    assert len({len(r.steps_per_block) for r in want}) > 1  # they finished at different blocks


def test_events_stream_the_committed_prefix_and_end_with_the_result_fp64(model):
    n = model.config.block_size
    prompts = _prompts(model, [n + 2, 4, 2 * n])
    cfg = _cfg(model, max_new_tokens=2 * n)
    budgets = [n, 2 * n, n + 3]  # per-request max_new_tokens: they leave at different steps
    dec = Decoder(model, cfg, max_batch=2)
    for i, (p, b) in enumerate(zip(prompts, budgets, strict=True)):
        dec.submit(BatchRequest(i, p, max_new_tokens=b))
    streamed: dict[int, list[int]] = {i: [] for i in range(3)}
    results = {}
    while not dec.idle:
        for ev in dec.step():
            assert ev.request_id not in results
            streamed[ev.request_id].extend(ev.committed)
            if ev.result is not None:
                results[ev.request_id] = ev.result
    for i, (p, b) in enumerate(zip(prompts, budgets, strict=True)):
        want = decode(model, p, replace(cfg, max_new_tokens=b)).token_ids
        assert results[i].token_ids == want
        assert streamed[i] == want


def test_cancel_frees_the_slot_and_neighbours_are_unaffected_fp64(model):
    n = model.config.block_size
    prompts = _prompts(model, [n, 3, 7])
    cfg = _cfg(model, max_new_tokens=2 * n)
    dec = Decoder(model, cfg, max_batch=2)
    for i, p in enumerate(prompts):
        dec.submit(BatchRequest(i, p))
    dec.step()
    dec.cancel(0)
    results = {}
    while not dec.idle:
        for ev in dec.step():
            assert ev.request_id != 0
            if ev.result is not None:
                results[ev.request_id] = ev.result.token_ids
    assert results == {i: decode(model, prompts[i], cfg).token_ids for i in (1, 2)}


def test_submit_refuses_bad_prompts_with_clear_messages(fd_ckpt):
    model = load_model(fd_ckpt, dtype="fp64")
    dec = Decoder(model, _cfg(model, max_new_tokens=8))
    with pytest.raises(ValueError, match="empty prompt"):
        dec.submit(BatchRequest("a", []))
    with pytest.raises(ValueError, match="past the vocabulary"):
        dec.submit(BatchRequest("a", [model.config.vocab_size]))
    with pytest.raises(ValueError, match="mask token id"):
        dec.submit(BatchRequest("a", [1, model.mask_id]))
    with pytest.raises(ValueError, match="position limit"):
        dec.submit(BatchRequest("a", [1] * model.config.max_position_embeddings))
    assert dec.idle


def test_api_generate_with_several_prompts_returns_one_result_each_in_order(fd_ckpt):
    import specfold

    model = load_model(fd_ckpt, dtype="fp64")
    prompts = _prompts(model, [5, 2 * model.config.block_size, 1])
    kw = dict(max_new_tokens=16, threshold=0.5, batch_size=2)
    got = specfold.generate(model, prompts, **kw)
    assert isinstance(got, list) and len(got) == 3
    assert [r.token_ids for r in got] == [specfold.generate(model, p, **kw).token_ids for p in prompts]


# --- drafting methods: spiffy and specfold in the batch ------------------------------------------------------------

def _calibrated(model, prompts, cfg):
    from specfold.api import record_counts
    from specfold.decoding.calibration import candidates, graph_from_counts

    counts = record_counts(model, prompts, cfg, max_depth=4)
    return graph_from_counts(counts, min(7, len(candidates(counts))))


def _method(model, name, graph, cfg, delta):
    from specfold.decoding.core import BatchMethod
    from specfold.decoding.speculative import GraphDrafter
    from specfold.engine.dense import DenseVerifier
    from specfold.engine.folded import FoldedVerifier

    drafter = GraphDrafter(graph, model.mask_id, cfg.small_block_size, model.stop_id)
    if name == "spiffy":
        return BatchMethod(DenseVerifier(model.net), drafter)
    # δ > 0: no cost rule, so that every fold decision is the request's own (see decoding/core.py)
    settings = {} if delta == 0 else {"cost": None, "dense_fallback": False, "attention": "correct"}
    return BatchMethod(FoldedVerifier(model.net, delta, **settings), drafter)


@pytest.fixture(scope="module")
def drafting_setup():
    """``drafting_setup(model)``: the model with a stop id that ends requests at different blocks, the prompts, the
    config, the calibrated graph and vanilla's tokens — per checkpoint, computed once for the module (the three
    method cases share them; calibration decodes every prompt)."""
    memo = {}

    def get(model):
        if model.config.family not in memo:
            n = model.config.block_size
            prompts = _prompts(model, [n, 3, 2 * n + 1, n - 1, 5], seed=4)
            # threshold 0.9: drafts land
            cfg = DecodeConfig(block_size=n, small_block_size=n // 2, threshold=0.9, max_new_tokens=2 * n)
            first = decode(model, prompts[0], cfg).token_ids
            model = replace(model, stop_id=first[n + 1])  # requests stop at different blocks
            vanilla = [decode(model, p, cfg).token_ids for p in prompts]
            memo[model.config.family] = model, prompts, cfg, _calibrated(model, prompts, cfg), vanilla
        return memo[model.config.family]

    return get


@pytest.mark.parametrize(("name", "delta"), [("spiffy", 0.0), ("specfold", 0.0), ("specfold", 0.05)])
def test_drafting_methods_batch_equals_batch_one_with_refill_fp64(model, drafting_setup, name, delta):
    model, prompts, cfg, graph, vanilla = drafting_setup(model)
    method = _method(model, name, graph, cfg, delta)
    want = [decode(model, p, cfg, verifier=method.verifier, drafter=method.drafter) for p in prompts]
    got = decode_batch(model, prompts, cfg, method, max_batch=3)
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    assert [r.nfe for r in got] == [r.nfe for r in want]
    assert [r.accepted_drafts for r in got] == [r.accepted_drafts for r in want]
    assert sum(r.accepted_drafts for r in got) > 0  # drafts were verified and accepted inside the batch
    keys = ["rows"] + (["draft_triples"] if name == "specfold" else [])
    if delta > 0:  # no cost rule: what folds is the request's own decision (with it, the batch picks the mode)
        keys += ["folded_triples", "ffn_folded_triples", "corrected_rows", "guard_fallbacks"]
    for key in keys:  # per-request statistics: over its own rows, never its neighbours' or the padding
        assert [getattr(r.engine_stats, key) for r in got] == [getattr(r.engine_stats, key) for r in want], key
    if delta == 0:
        assert [r.token_ids for r in got] == vanilla
    if name == "specfold":
        assert sum(r.engine_stats.folded_triples for r in got) > 0


def test_folded_batch_pass_equals_each_request_alone_fp64(fd_ckpt):
    """One verify_batch over requests with different prefix lengths and branch counts (padding rows included)
    gives each request the logits of its own one-request pass, for the torch engine's correct and direct paths; a
    pass without drafts (one branch per request, run densely) gives a root the same logits and statistics."""
    from specfold.engine.base import BatchBranches
    from specfold.engine.folded import FoldedVerifier
    from specfold.model.cache import BatchCache

    model = load_model(fd_ckpt, dtype="fp64")
    net, c, n = model.net, model.config, model.config.block_size
    g = torch.Generator().manual_seed(11)
    lengths, branches = [n, 3 * n, 0], [3, 1, 4]
    cache = BatchCache(c.num_layers, 3, c.num_kv_heads, c.head_dim, 8 * n, net.dtype)
    for s, t in enumerate(lengths):
        if t:
            net.prefill(torch.randint(0, 200, (t,), generator=g), cache.slot(s), mask="block_causal")
    base = torch.randint(0, 200, (3, n), generator=g)
    states, parents = base[:, None].repeat(1, 4, 1), torch.zeros(3, 4, dtype=torch.long)
    parents[:, 0] = -1
    for r, kr in enumerate(branches):  # drafts: row j changes a few positions of its parent
        for j in range(1, kr):
            parents[r, j] = j - 1 if j % 2 else 0
            states[r, j] = states[r, parents[r, j]]
            states[r, j, torch.randint(0, n, (2,), generator=g)] = torch.randint(0, 200, (2,), generator=g)
    batch = BatchBranches(cache, torch.arange(3), torch.tensor(lengths), states, parents, branches)
    for attention in ("correct", "direct"):
        verifier = FoldedVerifier(net, 0.05, cost=None, dense_fallback=False, attention=attention)
        out = verifier.verify_batch(batch)
        for r, kr in enumerate(branches):
            alone = verifier.verify(cache.slot(r), states[r, :kr], parents[r, :kr])
            torch.testing.assert_close(out.logits[r], alone.logits, rtol=0, atol=1e-10)
            assert out.stats[r] == alone.stats, attention
        # no request with a draft: the pass runs densely and reports what the folded path reports for a root
        roots = BatchBranches(cache, torch.arange(3), torch.tensor(lengths), states[:, :1], parents[:, :1], [1, 1, 1])
        bare = verifier.verify_batch(roots)
        torch.testing.assert_close(bare.logits[1], out.logits[1], rtol=0, atol=1e-10)
        assert bare.stats[1] == out.stats[1]


@pytest.mark.parametrize(("method", "delta"), [("spiffy", None), ("specfold", 0.0)])
def test_api_generate_batches_drafting_methods(fd_ckpt, method, delta):
    """specfold.generate with a list and a drafting method: one result per prompt, in order, each its batch-1
    decode (and, lossless, vanilla's tokens), with drafts accepted inside the batch."""
    import specfold

    model = load_model(fd_ckpt, dtype="fp64")
    n = model.config.block_size
    prompts = _prompts(model, [5, 2 * n, 1, n + 3], seed=4)
    cfg = DecodeConfig(block_size=n, small_block_size=n // 2, threshold=0.9, max_new_tokens=2 * n)
    graph = _calibrated(model, prompts, cfg)
    kw = dict(max_new_tokens=2 * n, threshold=0.9, small_block_size=n // 2, graph=graph, method=method)
    if delta is not None:
        kw["delta"] = delta
    got = specfold.generate(model, prompts, batch_size=3, **kw)
    alone = [specfold.generate(model, p, **kw) for p in prompts]
    assert [r.token_ids for r in got] == [r.token_ids for r in alone]
    assert [r.accepted_drafts for r in got] == [r.accepted_drafts for r in alone] and sum(
        r.accepted_drafts for r in got) > 0
    vanilla = specfold.generate(model, prompts, max_new_tokens=2 * n, threshold=0.9, small_block_size=n // 2)
    assert [r.token_ids for r in got] == [r.token_ids for r in vanilla]
