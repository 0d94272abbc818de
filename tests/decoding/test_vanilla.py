"""Vanilla decoding control flow on scripted logits: exact state sequences (SPEC §2)."""

from __future__ import annotations

import torch

from specfold.config import DecodeConfig
from specfold.decoding.decoder import decode
from specfold.decoding.unmasking import eligible_mask, select_unmask, stop_reached
from tests.decoding.mock_model import MASK, STOP, scripted_model, target

M = MASK


class Recorder:
    def __init__(self):
        self.states: list[list[int]] = []

    def block_start(self, state, gen_start):
        self.states.append(state.tolist())

    def step(self, logits, next_state):
        self.states.append(next_state.tolist())


def run(model, prompt, **cfg):
    rec = Recorder()
    res = decode(model, prompt, DecodeConfig(**cfg), observer=rec)
    return res, rec.states


def test_rule_threshold_is_strict_and_ties_go_to_lowest_position():
    conf = torch.tensor([0.5, 0.9, 0.5, 0.2])
    eligible = torch.tensor([True, True, True, True])
    # exactly tau is not above tau; the single most confident is always taken
    assert select_unmask(conf, eligible, 0.9).tolist() == [False, True, False, False]
    # nothing above tau, a tie at the top: the lowest position wins
    assert select_unmask(torch.tensor([0.3, 0.5, 0.5, 0.1]), eligible, 0.9).tolist() == [False, True, False, False]
    # only eligible positions count, even if an ineligible one is more confident
    got = select_unmask(torch.tensor([0.99, 0.2, 0.95, 0.1]), torch.tensor([False, True, True, True]), 0.9)
    assert got.tolist() == [False, False, True, False]
    # conf exactly tau from exactly representable softmax values (two equal logits -> 0.5 each)
    logits = torch.zeros(2, 4, dtype=torch.float64)
    from specfold.decoding.unmasking import unmask_step

    state = torch.tensor([M, M])
    out = unmask_step(torch.nn.functional.pad(logits, (0, 60), value=-1e9), state, M, None, 0.5)
    assert out.tolist() == [0, M]  # neither is > 0.5; position 0 by tie, token 0 by tie


def test_eligibility_is_first_small_block_with_a_mask():
    state = torch.tensor([5, 5, 5, 5, 5, M, 5, M])
    assert eligible_mask(state, M, 4).tolist() == [False] * 5 + [True, False, True]
    assert eligible_mask(torch.tensor([5, M, 5, 5, M, M, 5, 5]), M, 4).tolist() == [False, True] + [False] * 6
    assert eligible_mask(torch.tensor([5, M, 5, M]), M, None).tolist() == [False, True, False, True]


def test_stop_needs_no_mask_before_it_and_ignores_the_prompt_tail():
    assert stop_reached(torch.tensor([STOP, 1, M, STOP]), 1, M, STOP) is None
    assert stop_reached(torch.tensor([STOP, 1, 2, STOP, M]), 1, M, STOP) == 3
    assert stop_reached(torch.tensor([1, 2, 3]), 0, M, None) is None


def test_fast_dllm_unaligned_prompt_small_blocks_and_threshold():
    # block 8, small block 4; prompt of 3 tokens stays fixed in the first block (positions 0..2)
    conf = {3: 0.2, 4: 0.95, 5: 0.5, 6: 0.5, 7: 0.97, 9: 0.95, 10: 0.89, 11: 0.1}
    # Positions 5 and 6 predict the same token, so their logit rows are identical and the 0.5/0.5 tie is exact: two
    # rows with the target at different indices need not softmax to the same last bit (the reduction order follows
    # the vector lanes; measured on AVX2: 0.5000000000000001 vs 0.5000000000000002).
    model = scripted_model("fast_dllm_v2", conf, targets={6: target(5)})
    res, states = run(model, [1, 2, 3], max_new_tokens=12, block_size=8, small_block_size=4)
    t = lambda p: target(5 if p == 6 else p)
    assert states[:5] == [
        [1, 2, 3, M, M, M, M, M],
        [1, 2, 3, t(3), M, M, M, M],  # only position 3 is eligible (small block 0)
        [1, 2, 3, t(3), t(4), M, M, t(7)],  # 0.95 and 0.97 > 0.9
        [1, 2, 3, t(3), t(4), t(5), M, t(7)],  # tie 0.5/0.5 -> lowest position
        [1, 2, 3, t(3), t(4), t(5), t(6), t(7)],
    ]
    # block 2 is seeded by the cache-writing forward's last row; 10 (0.89) is not taken with 9
    assert states[5] == [t(8), M, M, M, M, M, M, M]
    assert states[6] == [t(8), t(9), M, M, M, M, M, M]
    assert states[7] == [t(8), t(9), t(10), M, M, M, M, M]
    assert res.token_ids == [t(p) for p in range(3, 15)]
    assert res.prefill_forwards == 0  # nothing block-aligned to prefill
    assert res.steps_per_block == [4, 7]
    assert res.nfe_denoise == 11 and res.nfe_cache == 1 and res.nfe == 12
    assert res.generated_tokens == 12 and not res.stopped


def test_fast_dllm_aligned_prompt_is_prefilled_and_seeds_the_block():
    model = scripted_model("fast_dllm_v2", {p: 0.99 for p in range(8, 16)})
    res, states = run(model, list(range(8)), max_new_tokens=8, block_size=8, small_block_size=4)
    assert model.net.calls[0] == ("block_causal", 0, 8, True)
    assert states[0] == [target(8)] + [M] * 7
    assert states[1] == [target(8), target(9), target(10), target(11)] + [M] * 4
    assert res.prefill_forwards == 1 and res.nfe == 2 and res.nfe_cache == 0
    assert res.token_ids == [target(p) for p in range(8, 16)]


def test_stop_token_mid_block_ends_generation_and_truncates():
    conf = {9: 0.95, 10: 0.3, 11: 0.95}
    model = scripted_model("fast_dllm_v2", conf, targets={11: STOP}, default_conf=0.99)
    res, states = run(model, [1, 2, 3], max_new_tokens=64, block_size=8, small_block_size=4)
    # position 11 (stop) unmasked while 10 is still masked: not yet a stop
    assert states[-2] == [target(8), target(9), M, STOP, M, M, M, M]
    assert states[-1] == [target(8), target(9), target(10), STOP, M, M, M, M]
    assert res.token_ids == [target(p) for p in range(3, 11)] + [STOP]
    assert res.stopped


def test_nld_causal_prefill_seed_all_masks_eligible_and_causal_refresh():
    conf = {4: 0.5, 5: 0.95, 6: 0.4, 7: 0.93, 8: 0.6, 9: 0.1, 10: 0.1}
    model = scripted_model("nld", conf)
    res, states = run(model, [1, 2, 3], max_new_tokens=10, block_size=8, small_block_size=None)
    t = target
    assert model.net.calls[0] == ("causal", 0, 3, True)
    assert states[0] == [t(3)] + [M] * 7  # seed from the prefill's last row; block starts at position 3
    assert states[1] == [t(3), M, t(5), M, t(7), M, M, M]  # all masks eligible: 5 (0.95) and 7 (0.93)
    assert states[2] == [t(3), M, t(5), M, t(7), t(8), M, M]  # most confident: 8 (0.6)
    assert states[3] == [t(3), t(4), t(5), M, t(7), t(8), M, M]
    refresh = [c for c in model.net.calls if c[3]][1]
    assert refresh == ("causal", 3, 8, True)  # the finished block is refreshed causally at its positions
    assert res.token_ids == [t(p) for p in range(3, 13)]
    assert res.nfe_cache == 1 and res.prefill_forwards == 1
