"""Full decodes with ``FoldedVerifier(backend="triton")`` at δ = 0: token for token the vanilla trajectory, for every
family (SDAR: qk-norm in the QKV kernel, its quota rule, blocks of 8) — the default tier's version of
tests/test_embedded.py's slow Triton identity test (the embedded model's 8 layers cost about 40 s in the interpreter
even at B = 1, 2 passes: every program of its FFN and QKV GEMMs loops over the hidden size; this 1-layer, width-32
random model costs a few seconds).

The draft graph is calibrated on the decoded prompt itself, so drafts are accepted (an accepted draft's logits come
from its folded rows) and the pass folds rows (at least every unchanged position of a draft at layer 0)."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("triton")

from specfold.api import record_counts  # noqa: E402
from specfold.config import DecodeConfig  # noqa: E402
from specfold.decoding.calibration import candidates, graph_from_counts  # noqa: E402
from specfold.decoding.decoder import decode  # noqa: E402
from specfold.decoding.speculative import GraphDrafter  # noqa: E402
from specfold.engine.folded import FoldedVerifier  # noqa: E402
from specfold.model.loading import load_model  # noqa: E402
from specfold.model.random_checkpoint import write_random_checkpoint  # noqa: E402

SHAPE = {"vocab_size": 64, "hidden_size": 32, "num_heads": 2, "num_kv_heads": 1, "num_layers": 1,
         "intermediate_size": 48, "mask_token_id": 63, "eos_token_id": 62}
FAMILIES = ["fast_dllm_v2", "nld", "sdar"]


def _model(tmp_path, family, device):
    ckpt = write_random_checkpoint(tmp_path / family, family, seed=3, **SHAPE)
    if family == "sdar":  # block-causal prefill in blocks of the decode's block: the checkpoint's block is 8 too
        raw = json.loads((ckpt / "config.json").read_text())
        (ckpt / "config.json").write_text(json.dumps({**raw, "block_size": 8}))
    model = load_model(ckpt, dtype="fp32", device=device)
    assert model.config.qk_norm == (family == "sdar")
    return model


@pytest.mark.parametrize("family", FAMILIES)
def test_triton_decode_at_delta_zero_is_token_identical(family, tmp_path, device):
    model = _model(tmp_path, family, device)
    small = 4 if family == "fast_dllm_v2" else None
    cfg = DecodeConfig(max_new_tokens=8, block_size=8, small_block_size=small)
    prompt = torch.randint(0, 60, (5,), generator=torch.Generator().manual_seed(7)).tolist()
    counts = record_counts(model, [prompt], cfg, max_depth=3)
    # This random model's trajectory may hold fewer than 3 distinct formulas (it depends on the CPU's kernels): take
    # every one it has, up to 3.
    graph = graph_from_counts(counts, min(3, len(candidates(counts))))
    drafter = GraphDrafter(graph, model.mask_id, small, model.stop_id, device=device)
    vanilla = decode(model, prompt, cfg)
    # Both backends fold wherever the gate says (the torch engine's cost rule would run this tiny model densely).
    always = {"attention": "correct", "cost": None, "dense_fallback": False}
    runs = {backend: decode(model, prompt, cfg, verifier=FoldedVerifier(model.net, 0.0, backend=backend, **always),
                            drafter=drafter) for backend in ("torch", "triton")}
    for backend, res in runs.items():
        assert res.token_ids == vanilla.token_ids, backend
        assert sum(res.steps_per_block) == sum(vanilla.steps_per_block), backend
    got, ref = runs["triton"], runs["torch"]
    assert got.accepted_drafts > 0 and got.nfe_denoise < vanilla.nfe_denoise  # drafts were verified and accepted
    assert got.engine_stats.folded_triples > 0 and got.engine_stats.corrected_rows > 0
    for key in ("draft_triples", "folded_triples", "corrected_rows", "guard_fallbacks"):  # the torch engine's gates
        assert getattr(got.engine_stats, key) == getattr(ref.engine_stats, key), key


@pytest.mark.parametrize("family", ["fast_dllm_v2", "nld", pytest.param("sdar", marks=pytest.mark.slow)])  # 34 s
def test_triton_batch_decode_at_delta_zero_is_vanilla_and_equals_torch(family, tmp_path, device):
    """decode_batch with the triton backend: three prompts of different lengths (one not block-aligned, one longer
    than a block) through a batch of two with refill — every request's tokens are vanilla's, and its per-request
    fold statistics are the torch engine's."""
    from specfold.decoding.core import BatchMethod
    from specfold.decoding.decoder import decode_batch

    model = _model(tmp_path, family, device)
    small = 4 if family == "fast_dllm_v2" else None
    cfg = DecodeConfig(max_new_tokens=8, block_size=8, small_block_size=small)
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 60, (t,), generator=gen).tolist() for t in (5, 8, 11)]
    counts = record_counts(model, prompts, cfg, max_depth=3)
    graph = graph_from_counts(counts, min(3, len(candidates(counts))))
    drafter = GraphDrafter(graph, model.mask_id, small, model.stop_id, device=device)
    vanilla = [decode(model, p, cfg).token_ids for p in prompts]
    always = {"attention": "correct", "cost": None, "dense_fallback": False}
    runs = {backend: decode_batch(model, prompts, cfg, BatchMethod(
        FoldedVerifier(model.net, 0.0, backend=backend, **always), drafter), max_batch=2)
        for backend in ("torch", "triton")}
    for backend, res in runs.items():
        assert [r.token_ids for r in res] == vanilla, backend
    got, ref = runs["triton"], runs["torch"]
    assert sum(r.accepted_drafts for r in got) > 0 and sum(r.engine_stats.folded_triples for r in got) > 0
    assert [r.nfe for r in got] == [r.nfe for r in ref]
    for key in ("draft_triples", "folded_triples", "corrected_rows", "guard_fallbacks"):
        assert [getattr(r.engine_stats, key) for r in got] == [getattr(r.engine_stats, key) for r in ref], key
