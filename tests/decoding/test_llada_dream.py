"""LLaDA and Dream decoding (:mod:`specfold.decoding.sequence`) equal independent transcriptions of their references
(:mod:`tests.decoding.llada_dream_reference`: ML-GSAI ``generate()``, Fast-dLLM v1 LLaDA without a cache and with
the prefix / dual cache, Fast-dLLM v1 Dream with the prefix / dual cache) run through transformers'
``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` with the same weights, in fp64: tokens (cut after the first stop id)
and, where no stop cut the decode short, NFE. Spiffy and SpecFold at δ = 0 give the vanilla tokens under every
cache mode; a batch gives the batch-1 tokens; what the references do not define is refused in one line.

The tiny checkpoints' head is scaled up (peaked, varied confidences: the threshold keeps several positions per pass)
and the mask id's head row zeroed (its logit 0 is never the argmax, so no reference hangs or overruns).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from specfold.api import decode_config_for, prepare_method, record_counts
from specfold.config import MethodConfig
from specfold.decoding.calibration import graph_from_counts
from specfold.decoding.decoder import decode, decode_batch
from specfold.engine.folded import FoldedVerifier
from specfold.engine.stats import FoldStats
from specfold.model.loading import load_model
from specfold.model.random_checkpoint import write_random_checkpoint
from tests.decoding.llada_dream_reference import (
    cut_at_stop,
    fastdllm_dream_generate,
    fastdllm_llada_generate,
    hf_twin,
    mlgsai_generate,
)

pytestmark = pytest.mark.usefixtures("one_thread")

GEN, BLOCK = 16, 8
SHAPE = dict(vocab_size=97, hidden_size=32, num_heads=4, num_kv_heads=2, intermediate_size=64)


def tiny(tmp_path_factory, family: str, seed: int, scale: float = 3.0):
    ckpt = write_random_checkpoint(tmp_path_factory.mktemp(family), family, seed=seed, **SHAPE)
    model = load_model(ckpt, dtype="fp64")
    with torch.no_grad():
        head = model.net.head_weight()
        head.mul_(scale)
        head[model.mask_id] = 0.0
    return ckpt, model


@pytest.fixture(scope="module")
def llada(tmp_path_factory):
    ckpt, model = tiny(tmp_path_factory, "llada", seed=3)
    return ckpt, model, hf_twin(model.net)


@pytest.fixture(scope="module")
def dream(tmp_path_factory):
    ckpt, model = tiny(tmp_path_factory, "dream", seed=4)
    return ckpt, model, hf_twin(model.net)


def prompts_for(count: int, seed: int = 5) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = [1, 31, 2, 3, 5, 7, 8, 9, 12, 15, 16, 17, 20, 23, 24, 4, 11, 29, 30, 6, 13, 27]
    return [torch.randint(0, 90, (lengths[i % len(lengths)],), generator=g).tolist() for i in range(count)]


def with_stops(model, prompts, cfg):
    """The model with two stop ids that its decodes of these prompts do produce (so stopping is exercised)."""
    seen = [decode(model, p, cfg).token_ids for p in prompts[:3]]
    stops = (seen[0][3], seen[1][9])
    return replace(model, stop_id=stops[0], stop_ids=stops)


def check_against(model, hf, cfg, reference, prompts) -> tuple[int, int]:
    """Tokens equal the reference's (cut at the first stop id); NFE too where no stop cut either short. Returns
    (decodes a stop ended, passes that unmasked more than one position)."""
    stopped = parallel = 0
    for p in prompts:
        got = decode(model, p, cfg)
        want, nfe = reference(p)
        cut = cut_at_stop(want, model.stop_ids)
        assert got.token_ids == cut, (cfg, p)
        assert got.capped_blocks == 0
        if len(cut) == len(want) and not got.stopped:
            assert got.nfe == nfe, (cfg, p)
        stopped += got.stopped
        parallel += got.nfe < len(got.token_ids)
    return stopped, parallel


# (protocol, τ, steps): every protocol in the fast tier, the other settings slow
LLADA_FAST = [("mlgsai", None, 4), ("none", 0.5, None), ("prefix", 0.9, None), ("dual", 0.5, None), ("dual", None, 8)]
LLADA_SLOW = [("mlgsai", None, 32), ("none", 0.9, None), ("none", None, 8), ("prefix", 0.5, None),
              ("prefix", None, 8), ("dual", 0.9, None)]


@pytest.mark.parametrize("cases", [LLADA_FAST, pytest.param(LLADA_SLOW, marks=pytest.mark.slow)], ids=["fast", "slow"])
def test_llada_equals_references(llada, cases):
    """ML-GSAI steps 4 = 2 passes of quota 4 per block; 32 = 16 per block, 8 of them with a zero quota."""
    _, model, hf = llada
    prompts = prompts_for(20)
    mask = model.mask_id
    model = with_stops(model, prompts, decode_config_for(model, max_new_tokens=GEN, block_size=BLOCK, cache="none",
                                                         steps=GEN))
    stopped = parallel = 0
    for protocol, tau, steps in cases:
        cache = "none" if protocol == "mlgsai" else protocol
        cfg = decode_config_for(model, max_new_tokens=GEN, block_size=BLOCK, cache=cache, threshold=tau or 0.9,
                                steps=steps)

        def ref(p, protocol=protocol, tau=tau, steps=steps):
            if protocol == "mlgsai":
                return mlgsai_generate(hf, p, steps, GEN, BLOCK, mask)
            return fastdllm_llada_generate(hf, p, GEN, BLOCK, mask, protocol, tau, steps)

        s, par = check_against(model, hf, cfg, ref, prompts)
        stopped, parallel = stopped + s, parallel + par
    assert stopped >= 5 and parallel >= 5  # stops and multi-position passes were exercised


@pytest.mark.parametrize("cases", [[("prefix", 0.9), ("dual", 0.5)],
                                   pytest.param([("prefix", 0.5), ("dual", 0.9)], marks=pytest.mark.slow)],
                         ids=["fast", "slow"])
def test_dream_equals_references(dream, cases):
    _, model, hf = dream
    prompts = prompts_for(20, seed=6)
    model = with_stops(model, prompts, decode_config_for(model, max_new_tokens=GEN, block_size=BLOCK))
    stopped = parallel = 0
    for cache, tau in cases:
        cfg = decode_config_for(model, max_new_tokens=GEN, block_size=BLOCK, cache=cache, threshold=tau)

        def ref(p, cache=cache, tau=tau):
            return fastdllm_dream_generate(hf, p, GEN, BLOCK, model.mask_id, cache, tau)

        s, par = check_against(model, hf, cfg, ref, prompts)
        stopped, parallel = stopped + s, parallel + par
    assert stopped >= 2 and parallel >= 5


def test_what_the_references_do_not_define_is_refused(llada, dream, fd_ckpt):
    _, lm, _ = llada
    _, dm, _ = dream
    cases = [
        (lm, dict(max_new_tokens=20, block_size=8), "not a multiple of the block size"),
        (lm, dict(max_new_tokens=16, block_size=8, steps=3, cache="none"), "not a multiple of the 2 blocks"),
        (dm, dict(max_new_tokens=16, block_size=8, cache="none"), "blockless"),
        (dm, dict(max_new_tokens=16, block_size=8, steps=8, cache="dual"), "steps mode"),
        (lm, dict(max_new_tokens=16, block_size=8, strategy="low_confidence_static"), "--strategy"),
    ]
    for model, kw, match in cases:
        with pytest.raises(ValueError, match=match):
            decode_config_for(model, **kw)
        with pytest.raises(ValueError, match=match):  # and the decoder refuses a config built by hand
            decode(model, [1, 2, 3], replace(decode_config_for(model), **kw, small_block_size=None))
    with pytest.raises(ValueError, match="--cache applies to the fully bidirectional"):
        decode_config_for(load_model(fd_ckpt), max_new_tokens=8, cache="prefix")


# (family, cache, steps): the fast tier covers each cache mode once, the rest is slow
SPEC_FAST = [("llada", "prefix", None), ("llada", "none", 8), ("dream", "dual", None)]
SPEC_SLOW = [("llada", "none", None), ("llada", "dual", None), ("llada", "dual", 8), ("dream", "prefix", None)]


@pytest.mark.parametrize("family,cache,steps", SPEC_FAST + [pytest.param(*c, marks=pytest.mark.slow)
                                                           for c in SPEC_SLOW])
def test_spiffy_and_specfold_equal_vanilla_and_batch_equals_batch1(llada, dream, family, cache, steps):
    _, model, _ = llada if family == "llada" else dream
    prompts = prompts_for(6, seed=9)
    cfg = decode_config_for(model, max_new_tokens=GEN, block_size=BLOCK, cache=cache, threshold=0.99, steps=steps)
    graph = graph_from_counts(record_counts(model, prompts[:4], cfg, max_depth=3), 5, None)
    vanilla = [decode(model, p, cfg) for p in prompts]
    accepted = 0
    for spec in (MethodConfig(method="spiffy", graph=graph), MethodConfig(method="specfold", graph=graph, delta=0.0)):
        method = prepare_method(model, spec, cfg)
        if isinstance(method.verifier, FoldedVerifier):  # every pass folded (the cost rule may choose dense)
            method.verifier = FoldedVerifier(model.net, 0.0, cost=None, dense_fallback=False, attention="correct")
        single = [decode(model, p, cfg, verifier=method.verifier, drafter=method.drafter) for p in prompts]
        assert [r.token_ids for r in single] == [r.token_ids for r in vanilla], spec.method
        assert [r.nfe + r.accepted_drafts for r in single] == [r.nfe for r in vanilla]
        accepted += sum(r.accepted_drafts for r in single)
        batched = decode_batch(model, prompts, cfg, method, max_batch=3)
        assert [r.token_ids for r in batched] == [r.token_ids for r in vanilla]
        if spec.method == "specfold":
            block, context = sum((r.engine_stats for r in single), FoldStats()).window_fold_ratios()
            assert block is not None and 0.0 <= block <= 1.0
            if cache != "dual":  # rows around the block: identical in every branch, so they fold at δ = 0
                assert context is not None and context > block, (block, context)
    assert [r.token_ids for r in decode_batch(model, prompts, cfg, None, max_batch=3)] == \
        [r.token_ids for r in vanilla]
    assert accepted > 0  # drafts were accepted: the equalities are not vacuous


@pytest.mark.slow
def test_specfold_triton_backend_on_a_window(llada):
    """The Triton kernels run a window pass unchanged (interpreter here: ~30 s): vanilla's tokens at δ = 0 and the
    torch engine's fold statistics, block and context rows alike."""
    ckpt, _, _ = llada
    model = load_model(ckpt, dtype="fp32")
    with torch.no_grad():
        head = model.net.head_weight()
        head.mul_(3.0)
        head[model.mask_id] = 0.0
    prompts = prompts_for(3, seed=9)
    cfg = decode_config_for(model, max_new_tokens=GEN, block_size=BLOCK, cache="prefix", threshold=0.99)
    graph = graph_from_counts(record_counts(model, prompts, cfg, max_depth=3), 5, None)
    method = prepare_method(model, MethodConfig(method="spiffy", graph=graph), cfg)
    want = decode(model, prompts[0], cfg)
    got = {}
    for backend in ("torch", "triton"):
        verifier = FoldedVerifier(model.net, 0.0, cost=None, dense_fallback=False, attention="correct",
                                  backend=backend)
        got[backend] = decode(model, prompts[0], cfg, verifier=verifier, drafter=method.drafter)
        assert got[backend].token_ids == want.token_ids
    assert got["torch"].accepted_drafts > 0
    assert got["triton"].engine_stats.window_fold_ratios() == got["torch"].engine_stats.window_fold_ratios()
