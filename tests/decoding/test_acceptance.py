"""The acceptance model: offline replay of recorded vanilla trajectories equals what a real speculative decode
accepts (exactly, fp64), on random checkpoints of both families and on the embedded model; paths and their file."""

from __future__ import annotations

import pytest
import torch

from specfold.api import decode_config_for, encode_prompt, prepare_method, record_traces
from specfold.config import DecodeConfig, MethodConfig
from specfold.decoding.acceptance import (
    Acceptance,
    BlockPaths,
    CalibrationPaths,
    calibration_paths,
    replay,
    replay_paths,
)
from specfold.decoding.calibration import OBJECTIVES, graph_from_paths
from specfold.decoding.decoder import decode
from specfold.decoding.draft_graph import DraftGraph, parse_formula
from specfold.decoding.speculative import GraphDrafter
from specfold.engine.dense import DenseVerifier
from specfold.eval.tasks.synthetic import TASKS, load_split
from specfold.model.loading import load_model
from tests.decoding.mock_model import scripted_model

pytestmark = pytest.mark.usefixtures("one_thread")


def decode_counts(model, ids, cfg, graph):
    drafter = GraphDrafter(graph, model.mask_id, cfg.small_block_size, model.stop_id)
    res = decode(model, ids, cfg, verifier=DenseVerifier(model.net), drafter=drafter)
    return res.nfe_denoise, res.accepted_drafts, sum(res.steps_per_block)


def assert_offline_equals_online(model, prompts, cfg, graphs):
    traces = record_traces(model, prompts, cfg)
    accepted = 0
    for graph in graphs:
        for ids, blocks in zip(prompts, traces, strict=True):
            passes, acc, steps = decode_counts(model, ids, cfg, graph)
            offline = replay(blocks, graph)
            assert (offline.passes, offline.accepted, offline.steps) == (passes, acc, steps), graph.strings()
            assert offline.passes + offline.accepted == offline.steps
            accepted += acc
    assert accepted > 0  # drafts really were accepted: the equality is not vacuous
    return traces


def test_scripted_chain_replays_to_the_known_schedule():
    # test_speculative's chain: per block pass 1 (no drafting logits), pass 2 covers steps 2-5, pass 3 steps 6-7
    model = scripted_model("fast_dllm_v2", {}, default_conf=0.3)
    cfg = DecodeConfig(max_new_tokens=16, block_size=8, small_block_size=4)
    graph = DraftGraph.from_strings(["(1,1)", "(1,1)|(2,1)", "(1,1)|(2,1)|(3,1)"])
    traces = record_traces(model, [[1, 2, 3, 4, 5, 6, 7, 8]], cfg)
    assert replay(traces[0], graph) == Acceptance(blocks=2, steps=14, passes=6, accepted=8)
    paths = calibration_paths(traces, 8, 8)
    assert replay_paths(paths.blocks, graph.nodes[1:]) == Acceptance(blocks=2, steps=14, passes=6, accepted=8)
    assert_offline_equals_online(model, [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3]], cfg, [graph])


@pytest.mark.parametrize("family", ["fd", "nld"])
def test_offline_equals_online_on_random_checkpoints_fp64(family, fd_ckpt, nld_ckpt):
    model = load_model(fd_ckpt if family == "fd" else nld_ckpt, dtype="fp64")
    cfg = decode_config_for(model, max_new_tokens=24)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 290, (n,), generator=g).tolist() for n in (5, 32, 37)]
    paths = calibration_paths(record_traces(model, prompts, cfg), 4, 8)
    plan = zip(OBJECTIVES, (7, 3, 7), (None, None, 2), strict=True)
    graphs = [graph_from_paths(paths, b, d, objective=o, folds=0) for o, b, d in plan]
    graphs.append(DraftGraph.from_strings(["(1,1)", "(2,1)", "(1,1)+(2,1)", "(1,1)|(2,1)", "(1,2)"]))
    assert_offline_equals_online(model, prompts, cfg, graphs)


def test_offline_equals_online_on_the_embedded_model_fp64():
    model = load_model(dtype="fp64")
    cfg = decode_config_for(model, 48)
    # two calibration prompts per domain (NOTE: for time: fp64 decodes of the 8 M model, one per prompt and graph)
    prompts = [encode_prompt(model, s.prompt) for t in TASKS for s in load_split(t, "calib", limit=2)]
    shipped = DraftGraph.load(model.path / "draft_graph.json")
    spiffy = prepare_method(model, MethodConfig(method="spiffy", budget=5), cfg).graph
    other = DraftGraph.from_strings(["(1,1)", "(2,1)", "(1,1)+(2,1)", "(1,1)|(2,1)", "(1,1)|(2,1)|(3,1)"])
    assert_offline_equals_online(model, prompts, cfg, [shipped, spiffy, other])


def test_state_semantics_accepts_a_differently_grouped_node():
    # One position per step (conf 0.3 everywhere): the path at step 1 is (1,1)|(2,1); the depth-1 node
    # (1,1)+(2,1) reaches the same state as its second step, so the decoder accepts it after (1,1).
    model = scripted_model("fast_dllm_v2", {}, default_conf=0.3)
    cfg = DecodeConfig(max_new_tokens=8, block_size=8, small_block_size=4)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    traces = record_traces(model, [prompt], cfg)
    graph = DraftGraph.from_strings(["(1,1)", "(1,1)+(2,1)"])
    paths = calibration_paths(traces, 8, 8)
    by_state, by_formula = replay(traces[0], graph), replay_paths(paths.blocks, graph.nodes[1:])
    assert by_state.accepted > by_formula.accepted
    passes, acc, _ = decode_counts(model, prompt, cfg, graph)
    assert (by_state.passes, by_state.accepted) == (passes, acc)


def test_paths_file_roundtrip_and_errors(tmp_path):
    (a, b) = parse_formula("(1,1)|(2,1)+(3,2)")  # two steps
    paths = CalibrationPaths(
        prompts=((BlockPaths(4, ((), (a, b), (), ())), BlockPaths(1, ((),))), (BlockPaths(0, ()),)),
        max_depth=4,
        max_vocab_rank=8,
        provenance={"samples": 2},
    )
    paths.to_json(tmp_path / "p.json")
    back = CalibrationPaths.load(tmp_path / "p.json")
    assert back == paths and back.counts() == {(a,): 1, (a, b): 1}
    (tmp_path / "bad.json").write_text('{"format": "specfold.draft_graph"}')
    with pytest.raises(ValueError, match="not a calibration-paths file"):
        CalibrationPaths.load(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="runs past the block's last non-terminal state"):
        BlockPaths(2, ((), (a, b)))
    with pytest.raises(ValueError, match="block of 2 steps has 1 paths"):
        BlockPaths(2, ((),))
