"""Spiffy-style speculative decoding is lossless: token-for-token the vanilla trajectory (SPEC §3)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specfold.api import decode_config_for, prepare_method, record_counts
from specfold.config import DecodeConfig, MethodConfig
from specfold.decoding.calibration import graph_from_counts
from specfold.decoding.decoder import decode
from specfold.decoding.draft_graph import DraftGraph
from specfold.decoding.speculative import GraphDrafter
from specfold.engine.dense import DenseVerifier
from specfold.model.loading import load_model
from tests.decoding.mock_model import scripted_model


class Steps:
    def __init__(self):
        self.states = []

    def block_start(self, state, gen_start):
        self.states.append(state.tolist())

    def step(self, logits, next_state):
        self.states.append(next_state.tolist())


def run_vanilla(model, prompt, cfg):
    obs = Steps()
    return decode(model, prompt, cfg, observer=obs), obs.states


def run_spec(model, prompt, cfg, graph):
    obs = Steps()
    drafter = GraphDrafter(graph, model.mask_id, cfg.small_block_size, model.stop_id)
    return decode(model, prompt, cfg, verifier=DenseVerifier(model.net), drafter=drafter, observer=obs), obs.states


def run_pair(model, prompt, cfg, graph):
    (vanilla, sv), (spec, ss) = run_vanilla(model, prompt, cfg), run_spec(model, prompt, cfg, graph)
    return vanilla, spec, sv, ss


def check_lossless(vanilla, spec, states_v, states_s):
    assert spec.token_ids == vanilla.token_ids
    assert states_s == states_v  # the same trajectory, state by state
    assert sum(spec.steps_per_block) == sum(vanilla.steps_per_block)
    # every rule application is either the first of a verification pass or an accepted draft
    assert spec.accepted_drafts == sum(spec.steps_per_block) - spec.nfe_denoise
    assert spec.nfe_cache == vanilla.nfe_cache


def test_chain_of_right_drafts_is_accepted_hop_by_hop():
    # State-independent logits: one position per step (all below tau), so "(1,1) then (2,1) then (3,1)" is right.
    model = scripted_model("fast_dllm_v2", {}, default_conf=0.3)
    cfg = DecodeConfig(max_new_tokens=16, block_size=8, small_block_size=4)
    graph = DraftGraph.from_strings(["(1,1)", "(1,1)|(2,1)", "(1,1)|(2,1)|(3,1)"])
    vanilla, spec, sv, ss = run_pair(model, [1, 2, 3, 4, 5, 6, 7, 8], cfg, graph)
    check_lossless(vanilla, spec, sv, ss)
    # per block (seed + 7 masks): pass 1 (no drafting logits yet), pass 2 covers steps 2-5 (3 accepted),
    # pass 3 covers steps 6-7 (1 accepted; a full block is never drafted)
    assert vanilla.nfe_denoise == 14
    assert spec.nfe_denoise == 6 and spec.accepted_drafts == 8


def test_wrong_drafts_are_rejected_and_change_nothing():
    # Two positions pass tau each step, so single-position drafts are never right; vocab rank 2 never either.
    conf = {p: (0.95 if p % 2 else 0.3) for p in range(64)}
    model = scripted_model("fast_dllm_v2", conf)
    cfg = DecodeConfig(max_new_tokens=16, block_size=8, small_block_size=4)
    graph = DraftGraph.from_strings(["(1,2)", "(2,1)", "(1,2)|(3,1)"])
    vanilla, spec, sv, ss = run_pair(model, [1, 2, 3, 4, 5, 6, 7, 8], cfg, graph)
    check_lossless(vanilla, spec, sv, ss)
    assert spec.accepted_drafts == 0 and spec.nfe_denoise == vanilla.nfe_denoise


def test_nld_protocol_drafts_over_the_whole_block():
    model = scripted_model("nld", {}, default_conf=0.3)
    cfg = DecodeConfig(max_new_tokens=16, block_size=8, small_block_size=None)
    graph = DraftGraph.from_strings(["(1,1)", "(1,1)|(2,1)", "(2,1)"])
    vanilla, spec, sv, ss = run_pair(model, [1, 2, 3], cfg, graph)
    check_lossless(vanilla, spec, sv, ss)
    assert spec.accepted_drafts > 0


@pytest.mark.parametrize("family", ["fd", "nld"])
def test_random_checkpoints_calibrated_graphs_all_budgets_and_depths(family, fd_ckpt, nld_ckpt):
    model = load_model(fd_ckpt if family == "fd" else nld_ckpt, dtype="fp32")
    cfg = decode_config_for(model, max_new_tokens=40)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 290, (n,), generator=g).tolist() for n in (5, 32, 37)]
    counts = record_counts(model, prompts, cfg, max_depth=4)
    assert sum(counts.values()) > 50
    vanillas = [run_vanilla(model, ids, cfg) for ids in prompts]  # one vanilla trajectory per prompt, for every graph
    checked = set()
    for budget, depth in [(1, None), (3, None), (7, None), (7, 1), (7, 2), (7, 3), (7, 4)]:
        graph = graph_from_counts(counts, budget, depth)
        # NOTE: a decode reads only the graph's nodes, their parents and its policy: a cap at or above the graph's
        # depth selects a graph already decoded, whose decodes would repeat those checked
        if (graph.nodes, graph.parents, graph.policy) in checked:
            continue
        checked.add((graph.nodes, graph.parents, graph.policy))
        accepted = 0
        for ids, (vanilla, sv) in zip(prompts, vanillas, strict=True):
            spec, ss = run_spec(model, ids, cfg, graph)
            check_lossless(vanilla, spec, sv, ss)
            accepted += spec.accepted_drafts
        assert accepted > 0  # drafts really were accepted, so the equality above is not vacuous


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.data(),
    conf=st.lists(st.sampled_from([0.2, 0.5, 0.92, 0.97]), min_size=40, max_size=40),
)
def test_property_random_valid_graphs_are_lossless(data, conf):
    formulas: list[str] = []
    for _ in range(data.draw(st.integers(1, 6))):
        parent = data.draw(st.sampled_from([""] + formulas))
        used = {int(p.split(",")[0].strip("()")) for step in parent.split("|") if step for p in step.split("+")}
        free = [r for r in range(1, 7) if r not in used]
        if not free:  # the parent already fills every rank: nothing left to add below it
            continue
        pairs = data.draw(st.lists(st.sampled_from(free), min_size=1, max_size=2, unique=True))
        step = "+".join(f"({r},{data.draw(st.integers(1, 2))})" for r in sorted(pairs))
        cand = f"{parent}|{step}" if parent else step
        if cand not in formulas:
            formulas.append(cand)
    graph = DraftGraph.from_strings(formulas)
    model = scripted_model("fast_dllm_v2", dict(enumerate(conf)))
    cfg = DecodeConfig(max_new_tokens=24, block_size=8, small_block_size=data.draw(st.sampled_from([4, 8])))
    check_lossless(*run_pair(model, [1, 2, 3, 4, 5], cfg, graph))


def test_prepare_method_rejects_bad_options(fd_ckpt):
    model = load_model(fd_ckpt)
    with pytest.raises(ValueError, match="unknown method"):
        prepare_method(model, MethodConfig(method="medusa"))
    with pytest.raises(ValueError, match="no draft graph"):
        prepare_method(model, MethodConfig(method="spiffy"))
    with pytest.raises(ValueError, match="not vanilla"):
        prepare_method(model, MethodConfig(method="vanilla", budget=3))
