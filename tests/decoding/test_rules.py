"""Each family's unmasking rule equals a transcription of its reference decoder's rule, in bf16 and fp32, the two
rules are told apart, and no decode can run forever (a checkpoint whose argmax is the mask token terminates in every
method, batch-1 and batched).

The transcriptions below are written from the public reference code, not from ours:

* Fast-dLLM-v2 (NVlabs ``batch_sample`` at temperature 0): ``p = softmax(logits)`` in the logits' dtype,
  ``x1 = p.argmax(-1)``, ``x1_p = p.gather(x1)``; positions outside the current small block's masks get ``-inf``;
  ``unmask = x1_p > threshold``; ``unmask[x1_p.argmax()] = True``; ``unmask &= mask``; ``x[unmask] = x1[unmask]``.
* Nemotron-Labs-Diffusion (its ``generate()``): the same softmax in the model's dtype over the whole block's masks,
  the most confident masked position always, plus every masked one with ``x1_p >= threshold``.
"""

from __future__ import annotations

import pytest
import torch

from specfold.config import DecodeConfig
from specfold.decoding.core import BatchMethod
from specfold.decoding.decoder import decode, decode_batch
from specfold.decoding.draft_graph import DraftGraph
from specfold.decoding.speculative import GraphDrafter
from specfold.decoding.unmasking import unmask_step
from specfold.engine.dense import DenseVerifier
from specfold.engine.folded import FoldedVerifier
from specfold.model.families import FAMILIES
from specfold.model.loading import load_model
from specfold.model.random_checkpoint import write_random_checkpoint

M = 7  # mask id in the rule cases
THRESHOLD = 0.9


def fast_dllm_v2_reference(logits, x, small_block_size, threshold):
    """Transcription of the Fast-dLLM-v2 reference step (one sequence)."""
    x = x.clone()
    n = x.shape[0]
    mask_idx = x == M
    start = int(mask_idx.nonzero()[0, 0]) // small_block_size * small_block_size
    end = start + small_block_size
    p_1t = torch.softmax(logits[start:end], dim=-1)
    x_1 = p_1t.argmax(dim=-1)
    x1_p = torch.gather(p_1t, -1, x_1[:, None]).squeeze(-1)
    x1_p = torch.where(mask_idx[start:end], x1_p, -torch.inf)
    unmask_idx = x1_p > threshold
    unmask_idx[x1_p.argmax()] = True
    unmask_idx = unmask_idx & mask_idx[start:end]
    seg = x[start:end]
    seg[unmask_idx] = x_1[unmask_idx]
    x[start:end] = seg
    assert x.shape[0] == n
    return x


def nld_reference(logits, x, threshold):
    """Transcription of the Nemotron-Labs-Diffusion reference step (one block)."""
    x = x.clone()
    mask_index = x == M
    probs = torch.softmax(logits, dim=-1)
    x0 = probs.argmax(dim=-1)
    x0_p = torch.gather(probs, -1, x0[:, None]).squeeze(-1)
    confidence = torch.where(mask_index, x0_p, -torch.inf)
    transfer = confidence >= threshold
    transfer[confidence.argmax()] = True
    transfer &= mask_index
    x[transfer] = x0[transfer]
    return x


def _cases(dtype, count=400, n=16, v=8, seed=0):
    """Block states and logits whose top probabilities cluster around the threshold (so that the comparison and the
    dtype decide), with masks in every small block."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(count):
        x = torch.randint(0, M, (n,), generator=g)
        x[torch.rand(n, generator=g) < 0.6] = M
        x[int(torch.randint(0, n, (1,), generator=g))] = M
        top = torch.randint(0, v, (n,), generator=g)
        # p(top) = e^a / (e^a + (v-1)) around 0.9: a = log(0.9 (v-1) / 0.1) + noise
        a = torch.log(torch.tensor(0.9 * (v - 1) / 0.1)) + 0.03 * torch.randn(n, generator=g, dtype=torch.float64)
        logits = torch.zeros(n, v, dtype=torch.float64)
        logits[torch.arange(n), top] = a
        yield logits.to(dtype), x


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_each_family_rule_equals_its_reference_transcription(dtype):
    fd, nld = FAMILIES["fast_dllm_v2"].rule, FAMILIES["nld"].rule
    differ = 0
    for logits, x in _cases(dtype):
        got_fd = unmask_step(logits, x, M, 8, THRESHOLD, fd)
        got_nld = unmask_step(logits, x, M, None, THRESHOLD, nld)
        assert torch.equal(got_fd, fast_dllm_v2_reference(logits, x, 8, THRESHOLD))
        assert torch.equal(got_nld, nld_reference(logits, x, THRESHOLD))
        # the comparison alone (same window: the whole block) tells the two rules apart
        differ += int(not torch.equal(unmask_step(logits, x, M, None, THRESHOLD, fd), got_nld))
    if dtype == torch.bfloat16:
        # bf16 probabilities sit on a grid of 2^-8 near 0.9: p == 0.8984375 (the threshold rounded) is common
        assert differ > 0


def test_bf16_confidence_is_computed_in_bf16_not_fp32():
    """The references compare bf16 probabilities with the threshold rounded to bf16 (0.8984375): an fp32 softmax of
    the same bf16 logits decides differently near 0.9."""
    rule = FAMILIES["nld"].rule
    differ = 0
    for logits, x in _cases(torch.bfloat16):
        in_bf16 = unmask_step(logits, x, M, None, THRESHOLD, rule)
        in_fp32 = unmask_step(logits.float(), x, M, None, THRESHOLD, rule)
        assert torch.equal(in_bf16, nld_reference(logits, x, THRESHOLD))
        differ += int(not torch.equal(in_bf16, in_fp32))
    assert differ > 0


def test_the_mask_token_as_argmax_leaves_the_position_masked_as_the_references_do():
    logits = torch.zeros(4, 8)
    logits[:, M] = 5.0  # every position's argmax is the mask token
    x = torch.tensor([1, M, M, M])
    for name, ref in (("fast_dllm_v2", lambda: fast_dllm_v2_reference(logits, x, 4, THRESHOLD)),
                      ("nld", lambda: nld_reference(logits, x, THRESHOLD))):
        got = unmask_step(logits, x, M, 4 if name == "fast_dllm_v2" else None, THRESHOLD, FAMILIES[name].rule)
        assert torch.equal(got, ref()) and torch.equal(got, x)


@pytest.fixture(scope="module", params=["fast_dllm_v2", "nld"])
def stuck_model(request, tmp_path_factory):
    """A checkpoint whose every logit row is flat (final norm zeroed): the argmax is token 0, the mask token."""
    ckpt = write_random_checkpoint(tmp_path_factory.mktemp("stuck"), request.param, seed=5, mask_token_id=0,
                                   eos_token_id=299)
    model = load_model(ckpt, dtype="fp32")
    model.net.final_norm.zero_()
    return model


@pytest.mark.parametrize("method", ["vanilla", "spiffy", "specfold"])
def test_a_checkpoint_whose_argmax_is_the_mask_token_terminates(stuck_model, method):
    model, n = stuck_model, 8
    cfg = DecodeConfig(max_new_tokens=2 * n, block_size=n, small_block_size=4 if model.config.shifted_logits else None)
    drafter = None
    if method != "vanilla":
        graph = DraftGraph.from_strings(["(1,1)", "(1,1)+(2,1)"])
        drafter = GraphDrafter(graph, model.mask_id, cfg.small_block_size, model.stop_id)
    verifier = FoldedVerifier(model.net, 0.0) if method == "specfold" else DenseVerifier(model.net)
    prompts = [[5, 6, 7], list(range(1, n + 1))]
    one = [decode(model, p, cfg, verifier, drafter) for p in prompts]
    many = decode_batch(model, prompts, cfg, BatchMethod(verifier, drafter), max_batch=2)
    cap = FAMILIES[model.config.family].rule.max_steps(n)
    for res in one + many:
        # every block ran into the cap with masks left; each took at most `cap` passes
        assert res.capped_blocks == len(res.steps_per_block) >= 2
        assert all(steps == cap for steps in res.steps_per_block)
        assert res.generated_tokens == cfg.max_new_tokens and not res.stopped
        assert res.nfe_denoise <= cap * len(res.steps_per_block)
    assert [r.token_ids for r in one] == [r.token_ids for r in many]


def test_non_finite_logits_stop_the_decode_with_one_line(tmp_path):
    ckpt = write_random_checkpoint(tmp_path / "nan", "nld", seed=6, mask_token_id=300, eos_token_id=299)
    model = load_model(ckpt, dtype="fp32")
    model.net.layers[0].w_down.fill_(float("nan"))
    cfg = DecodeConfig(max_new_tokens=8, block_size=8, small_block_size=None)
    for run in (lambda: decode(model, [1, 2, 3], cfg), lambda: decode_batch(model, [[1, 2], [3, 4, 5]], cfg)):
        with pytest.raises(ValueError, match=r"non-finite logits from .*nan in float32 \(request 0\)"):
            run()
