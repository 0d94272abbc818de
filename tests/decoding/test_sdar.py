"""SDAR decoding equals an independent transcription of its reference ``block_diffusion_generate`` (JetAstra/SDAR
``generate.py``), greedy: every pass recomputes the whole sequence (no cache) through transformers'
``Qwen3ForCausalLM`` with a block-causal float mask (blocks of the decode's block length from the first prompt
token), takes the argmax and its softmax probability in the model's dtype, and unmasks by the per-step quota
(``low_confidence_dynamic`` / ``_static``). Spiffy and SpecFold at δ = 0 give the vanilla tokens; a batch gives the
batch-1 tokens. Schedules under which the reference rewrites decoded positions are refused.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch

from specfold.api import decode_config_for, prepare_method, record_counts
from specfold.config import MethodConfig
from specfold.decoding.calibration import candidates, graph_from_counts
from specfold.decoding.core import QuotaShort
from specfold.decoding.decoder import decode, decode_batch
from specfold.engine.folded import FoldedVerifier
from specfold.model.loading import load_model
from specfold.model.random_checkpoint import write_random_checkpoint
from tests.model.test_sdar import block_causal_mask, qwen3_reference

pytestmark = pytest.mark.usefixtures("one_thread")

DYNAMIC, STATIC = "low_confidence_dynamic", "low_confidence_static"


@pytest.fixture(scope="module")
def sdar_dir(tmp_path_factory):
    ckpt = write_random_checkpoint(tmp_path_factory.mktemp("sdar"), "sdar", seed=11, generation_eos=[297, 298])
    raw = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**raw, "block_size": 8}))  # blocks of 4 and 8 tile it
    return ckpt


def load(sdar_dir, dtype):
    return load_model(sdar_dir, dtype=dtype)


@pytest.fixture(scope="module")
def hf(sdar_dir):
    """The transformers reference per dtype (its RMSNorm kept in fp64 for fp64 weights)."""
    with pytest.MonkeyPatch.context() as mp:
        dtypes = (("fp64", torch.float64), ("fp32", torch.float32))
        yield {name: qwen3_reference(sdar_dir, dt, mp) for name, dt in dtypes}


def reference_generate(net, prompt, mask_id, gen_length, block, steps, strategy, threshold, stop_ids):
    """The reference decoder, greedy, every pass a full recompute. Upstream raises when a block still holds masks
    after ``steps`` passes (the argmax was the mask id); here such a block ends as it is, as ours documents."""
    length = len(prompt)
    num_blocks = (length + gen_length + block - 1) // block
    x = torch.full((num_blocks * block,), mask_id, dtype=torch.long)
    x[:length] = torch.tensor(prompt)
    quotas = [block // steps + (s < block % steps) for s in range(steps)]
    for nb in range(length // block, num_blocks):
        cur = x[nb * block : (nb + 1) * block].clone()
        for step in range(steps + 1):
            mask_index = cur == mask_id
            if not mask_index.any() or step == steps:
                break
            seq = torch.cat([x[: nb * block], cur])
            dtype = next(net.parameters()).dtype
            with torch.no_grad():
                logits = net(input_ids=seq[None], attention_mask=block_causal_mask(seq.numel(), block, dtype),
                             position_ids=torch.arange(seq.numel())[None]).logits[0, nb * block :]
            probs = torch.softmax(logits, dim=-1)  # the model's dtype
            x0_p, x0 = probs.max(dim=-1)
            conf = torch.where(mask_index, x0_p, torch.full_like(x0_p, -math.inf))
            quota = quotas[step]
            # top-k with ties to the lowest position (upstream's torch.topk leaves tie order open)
            ranked = sorted(range(block), key=lambda p: (-conf[p].item(), p))[:quota]
            top = torch.zeros(block, dtype=torch.bool)
            top[ranked] = True
            transfer = top
            if strategy == DYNAMIC:
                high = conf > threshold
                if int(high.sum()) >= quota:
                    transfer = high
            assert bool(mask_index[transfer].all()), "the reference would rewrite a decoded position"
            cur[transfer] = x0[transfer]
        x[nb * block : (nb + 1) * block] = cur
        gen = x[length : (nb + 1) * block].tolist()
        # a stop id with no mask before it (the same as upstream's "any stop id" once a block has no masks left)
        firsts = [i for i, t in enumerate(gen) if t in stop_ids and mask_id not in gen[:i]]
        if firsts:
            return gen[: firsts[0] + 1][:gen_length]
    return x[length : length + gen_length].tolist()


def prompts_for(vocab, count, seed=5):
    g = torch.Generator().manual_seed(seed)
    lengths = [4, 5, 7, 8, 9, 12, 13, 16, 3, 6, 10, 11, 15, 17, 20, 24, 1, 2, 14, 23, 8, 16]
    return [torch.randint(0, vocab - 3, (lengths[i % len(lengths)],), generator=g).tolist() for i in range(count)]


def with_stops(model, prompts, cfg):
    """The model with two stop ids that its decodes of these prompts do produce (so stopping is exercised)."""
    seen = [decode(model, p, cfg).token_ids for p in prompts[:4]]
    stops = (seen[0][2], seen[1][5])
    return replace(model, stop_id=stops[0], stop_ids=stops)


@pytest.mark.parametrize("dtype", ["fp64", "fp32"])
@pytest.mark.parametrize("block", [4, 8])
def test_vanilla_equals_reference(sdar_dir, hf, dtype, block):
    model = load(sdar_dir, dtype)
    prompts = prompts_for(model.config.vocab_size, 22)
    base = decode_config_for(model, max_new_tokens=19, block_size=block)
    assert base.small_block_size is None and base.block_size == block
    model = with_stops(model, prompts, base)
    stopped = above_quota = 0
    cases = [(DYNAMIC, None, 0.9), (DYNAMIC, None, 0.2), (STATIC, None, 0.9), (DYNAMIC, 2 * block, 0.2)]
    for strategy, steps, tau in cases:
        cfg = replace(base, strategy=strategy, steps=steps, threshold=tau)
        s = steps or block
        for p in prompts:
            got = decode(model, p, cfg)
            want = reference_generate(hf[dtype], p, model.mask_id, cfg.max_new_tokens, block, s, strategy, tau,
                                      model.stop_ids)
            assert got.token_ids == want, (strategy, steps, tau, p)
            stopped += got.stopped
            above_quota += strategy == DYNAMIC and sum(got.steps_per_block) < len(got.steps_per_block) * s
    # static with half the steps: aligned prompts only (a prompt tail would make the reference rewrite it)
    cfg = replace(base, strategy=STATIC, steps=block // 2)
    for p in [q[: len(q) // block * block] for q in prompts if len(q) >= block]:
        got = decode(model, p, cfg)
        assert got.token_ids == reference_generate(hf[dtype], p, model.mask_id, cfg.max_new_tokens, block,
                                                   block // 2, STATIC, 0.9, model.stop_ids)
        assert all(s <= block // 2 for s in got.steps_per_block)
    assert stopped >= 4  # both stop ids end decodes
    assert above_quota > 0  # the dynamic rule's "all above the threshold" branch was taken


def test_quota_schedules_that_rewrite_are_refused(sdar_dir):
    model = load(sdar_dir, "fp64")
    cfg = decode_config_for(model, max_new_tokens=8, block_size=8)
    with pytest.raises(ValueError, match="low_confidence_dynamic"):
        decode(model, [1, 2, 3, 4, 5, 6, 7, 8], replace(cfg, steps=4))
    with pytest.raises(ValueError, match="prompt tail"):  # 5 tail tokens, quotas 2,2,2,2: the 3 masks run short
        decode(model, list(range(1, 14)), replace(cfg, steps=4, strategy=STATIC))
    decode(model, list(range(1, 17)), replace(cfg, steps=4, strategy=STATIC))  # aligned: fine
    with pytest.raises(ValueError, match="quota rules"):  # a family without a quota rule refuses the options
        fd = load_model(write_random_checkpoint(sdar_dir.parent / "fd", "fast_dllm_v2", mask_token_id=300))
        decode(fd, [1, 2, 3], replace(decode_config_for(fd, max_new_tokens=8), steps=4))
    assert issubclass(QuotaShort, ValueError)


@pytest.mark.parametrize("dtype", ["fp64", "fp32"])
def test_spiffy_and_specfold_equal_vanilla_and_batch_equals_batch1(sdar_dir, dtype):
    model = load(sdar_dir, dtype)
    prompts = prompts_for(model.config.vocab_size, 20, seed=9)
    cfg = decode_config_for(model, max_new_tokens=24, block_size=8, threshold=0.9)
    counts = record_counts(model, prompts[:8], cfg, max_depth=3)
    graph = graph_from_counts(counts, 7, None)
    vanilla = [decode(model, p, cfg) for p in prompts]
    accepted = 0
    for spec in (MethodConfig(method="spiffy", graph=graph), MethodConfig(method="specfold", graph=graph, delta=0.0)):
        method = prepare_method(model, spec, cfg)
        single = [decode(model, p, cfg, verifier=method.verifier, drafter=method.drafter) for p in prompts]
        assert [r.token_ids for r in single] == [r.token_ids for r in vanilla]
        assert [sum(r.steps_per_block) for r in single] == [sum(r.steps_per_block) for r in vanilla]
        accepted += sum(r.accepted_drafts for r in single)
        batched = decode_batch(model, prompts, cfg, method, max_batch=4)
        assert [r.token_ids for r in batched] == [r.token_ids for r in vanilla]
    assert accepted > 0  # drafts were accepted: the equality is not vacuous
    batched = decode_batch(model, prompts, cfg, None, max_batch=4)
    assert [r.token_ids for r in batched] == [r.token_ids for r in vanilla]


@pytest.fixture(scope="module")
def sdar64_dir(tmp_path_factory):
    """A 1-layer SDAR checkpoint whose config block is 64 (16, 32 and 64 tile it)."""
    ckpt = write_random_checkpoint(tmp_path_factory.mktemp("sdar64"), "sdar", seed=12, generation_eos=[297, 298],
                                   hidden_size=32, num_heads=2, num_kv_heads=1, num_layers=1, intermediate_size=48)
    raw = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**raw, "block_size": 64}))
    return ckpt


@pytest.mark.parametrize("block", [16, 32, 64])
def test_large_blocks_spiffy_and_specfold_equal_vanilla(sdar64_dir, block):
    """Blocks of 16 to 64 (SDAR's released sizes beyond the 4 and 8 above): spiffy and specfold at δ = 0 give the
    vanilla tokens and passes per block, for prompts shorter and longer than a block (stopping is exercised above:
    this tiny model's decodes repeat a few tokens, so a stop id taken from them would end every decode at once)."""
    model = load(sdar64_dir, "fp32")
    prompts = prompts_for(model.config.vocab_size, 3, seed=block)
    prompts[-1] = prompts[-1] * (block // len(prompts[-1]) + 1)  # longer than a block: a prefilled block + a tail
    cfg = decode_config_for(model, max_new_tokens=20, block_size=block, threshold=0.9)
    vanilla = [decode(model, p, cfg) for p in prompts]
    assert max(max(r.steps_per_block) for r in vanilla) > 8  # blocks of more than 8 passes were decoded
    counts = record_counts(model, prompts, cfg, max_depth=3)
    graph = graph_from_counts(counts, min(7, len(candidates(counts))), None)  # a random model: few formulas
    spiffy = prepare_method(model, MethodConfig(method="spiffy", graph=graph), cfg)
    # specfold folding every pass wherever the gate says (the cost rule would run this tiny model densely)
    folded = FoldedVerifier(model.net, 0.0, attention="correct", cost=None, dense_fallback=False)
    for name, verifier in (("spiffy", spiffy.verifier), ("specfold", folded)):
        got = [decode(model, p, cfg, verifier=verifier, drafter=spiffy.drafter) for p in prompts]
        assert [r.token_ids for r in got] == [r.token_ids for r in vanilla], name
        assert [r.steps_per_block for r in got] == [r.steps_per_block for r in vanilla], name
        assert sum(r.accepted_drafts for r in got) > 0  # drafts were accepted: the equality is not vacuous
    assert sum(r.engine_stats.folded_triples for r in got) > 0
