"""Whole decodes with a chunked prefill are token-identical to decodes with the one-shot prefill (fp64), for
vanilla, spiffy and specfold (δ = 0), on random checkpoints of both families; bad prompts fail before any work."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from specfold.api import decode_config_for
from specfold.decoding.decoder import decode
from specfold.decoding.draft_graph import DraftGraph
from specfold.decoding.speculative import GraphDrafter
from specfold.engine.dense import DenseVerifier
from specfold.engine.folded import FoldedVerifier
from specfold.model.loading import load_model
from specfold.model.random_checkpoint import write_random_checkpoint
from specfold.model.transformer import DLLM, Prefill

GRAPH = ["(1,1)", "(1,1)|(2,1)", "(1,1)|(2,1)|(3,1)", "(2,1)", "(1,2)"]


def one_shot_prefill(self, tokens, cache, mask="causal", chunk=None):
    """Today's reference: the whole prompt in one cache-writing forward."""
    return Prefill(self(tokens[None], cache, mask=mask, write_cache=True)[0, -1], 1)


def run_methods(model, prompt, cfg):
    net = model.net
    drafter = GraphDrafter(DraftGraph.from_strings(GRAPH), model.mask_id, cfg.small_block_size, model.stop_id)
    folded = FoldedVerifier(net, 0.0, cost=None, dense_fallback=False, attention="correct")
    dense = DenseVerifier(net)
    runs = {"vanilla": (dense, None), "spiffy": (dense, drafter), "specfold": (folded, drafter)}
    return {name: decode(model, prompt, cfg, verifier=v, drafter=d) for name, (v, d) in runs.items()}


@pytest.mark.parametrize("family", ["fast_dllm_v2", "nld"])
def test_chunked_prefill_decodes_like_one_shot(family, tmp_path, monkeypatch):
    ckpt = write_random_checkpoint(tmp_path, family, seed=3, mask_token_id=300, eos_token_id=299, hidden_size=48,
                                   num_heads=6, num_kv_heads=2, intermediate_size=64)
    model = load_model(ckpt, dtype="fp64")
    cfg = replace(decode_config_for(model, max_new_tokens=40), prefill_chunk=64)  # two blocks: one refresh
    prompt = torch.randint(0, 290, (150,), generator=torch.Generator().manual_seed(11)).tolist()

    chunked = run_methods(model, prompt, cfg)
    with monkeypatch.context() as m:
        m.setattr(DLLM, "prefill", one_shot_prefill)
        ref = run_methods(model, prompt, cfg)

    # FD prefills the 128 aligned rows (2 chunks of 64; the tail of 22 opens the first block), NLD all 150 (3).
    assert chunked["vanilla"].prefill_forwards == (2 if family == "fast_dllm_v2" else 3)
    want = ref["vanilla"].token_ids
    assert len(want) == 40
    for name in ("vanilla", "spiffy", "specfold"):
        assert chunked[name].token_ids == ref[name].token_ids == want, name
    assert chunked["spiffy"].accepted_drafts > 0  # the speculative runs really reused drafts


def test_prompt_past_the_vocabulary_is_refused(fd_ckpt):
    model = load_model(fd_ckpt)
    cfg = decode_config_for(model, max_new_tokens=8)
    with pytest.raises(ValueError, match=r"token id 301, past the vocabulary \(301\)"):
        decode(model, [1, 2, 301], cfg)
