"""The embedded model: it ships with the package, loads with no argument, and every lossless method reproduces its
vanilla trajectory token for token on held-out prompts (fp32)."""

from __future__ import annotations

import pytest

from specfold.api import decode_config_for, encode_prompt, prepare_method
from specfold.config import MethodConfig
from specfold.decoding.decoder import decode
from specfold.engine.folded import FoldedVerifier
from specfold.eval.tasks.synthetic import TASKS, load_split
from specfold.model.embedded import EMBEDDED_DIR
from specfold.model.loading import load_model

N_PROMPTS = 51  # >= 50 held-out prompts, 17 per domain
MAX_NEW = 48


@pytest.fixture(scope="module")
def model():
    return load_model(dtype="fp32")


@pytest.fixture(scope="module")
def prompts(model):
    per_task = N_PROMPTS // len(TASKS)
    samples = [s for t in TASKS for s in load_split(t, "test", limit=per_task)]
    return [encode_prompt(model, s.prompt) for s in samples]


@pytest.fixture(scope="module")
def vanilla(model, prompts):
    cfg = decode_config_for(model, MAX_NEW)
    return [decode(model, ids, cfg).token_ids for ids in prompts]


def test_ships_in_the_package_and_loads_with_no_argument(model):
    assert model.path == EMBEDDED_DIR
    assert (EMBEDDED_DIR / "model.safetensors").stat().st_size <= 30 * 2**20
    cfg = model.config
    assert cfg.family == "fast_dllm_v2" and cfg.model_type == "Fast_dLLM_Qwen" and cfg.block_size == 32
    assert cfg.num_layers >= 6 and cfg.num_heads != cfg.num_kv_heads
    assert 8e6 <= sum(p.numel() for p in model.net.parameters()) <= 16e6
    assert model.mask_id == model.tokenizer.convert_tokens_to_ids("|<MASK>|")
    assert model.stop_id == model.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert (EMBEDDED_DIR / "draft_graph.json").is_file() and (EMBEDDED_DIR / "draft_graph.counts.json").is_file()


@pytest.fixture(scope="module")
def spiffy_decodes(model, prompts):
    """``spiffy_decodes(budget, depth)``: spiffy's decode of every prompt with the graph selected for that budget and
    depth cap. NOTE: a decode reads only the graph's nodes, their parents and its drafting policy (not its budget or
    depth-cap fields), and the verifier's kind; configurations that select the same of these (the shipped graph is
    2 deep, so caps 2-4 select the uncapped B = 7 graph) are one computation, decoded once and checked for each."""
    cfg = decode_config_for(model, MAX_NEW)
    memo: dict[tuple, list] = {}

    def get(budget: int, depth: int | None) -> list:
        m = prepare_method(model, MethodConfig(method="spiffy", budget=budget, depth=depth), cfg)
        g = m.drafter.graph
        key = (type(m.verifier).__name__, m.drafter.lookahead, g.nodes, g.parents, g.policy)
        if key not in memo:
            memo[key] = [decode(model, ids, cfg, verifier=m.verifier, drafter=m.drafter) for ids in prompts]
        return memo[key]

    return get


@pytest.mark.parametrize("budget, depth", [(1, None), (3, None), (7, None), (7, 1), (7, 2), (7, 3), (7, 4)])
def test_spiffy_is_token_identical_to_vanilla(vanilla, spiffy_decodes, budget, depth):
    results = spiffy_decodes(budget, depth)
    assert [r.token_ids for r in results] == vanilla
    assert sum(r.accepted_drafts for r in results) > 0


def test_specfold_at_delta_zero_is_token_identical_to_vanilla_and_spiffy(model, prompts, vanilla):
    cfg = decode_config_for(model, MAX_NEW)
    m = prepare_method(model, MethodConfig(method="specfold", delta=0.0), cfg)
    # every pass folds (the per-pass rule may pick dense passes on a CPU where folding does not pay, which would make
    # the identity vacuous); the method's own verifier, with its rule, must give the same tokens too
    forced = FoldedVerifier(model.net, 0.0, pass_choice="fold")
    folded = 0.0
    for ids, want in zip(prompts, vanilla, strict=True):
        assert decode(model, ids, cfg, verifier=m.verifier, drafter=m.drafter).token_ids == want
        res = decode(model, ids, cfg, verifier=forced, drafter=m.drafter)
        assert res.token_ids == want
        folded += res.engine_stats.folded_triples
    assert folded > 0  # rows really folded, so the identity is not vacuous


@pytest.mark.slow  # minutes in the Triton interpreter (-m slow); tests/engine/test_triton_decode.py is the fast one
def test_triton_backend_at_delta_zero_is_token_identical(model, prompts):
    pytest.importorskip("triton")  # on CPU, tests/conftest.py has switched on the interpreter
    cfg = decode_config_for(model, 32)
    # one prompt (the interpreter is slow): the first where the torch engine folds rows, so the test is not vacuous
    ref = prepare_method(model, MethodConfig(method="specfold", delta=0.0), cfg)

    def folds(ids: list[int]) -> bool:
        res = decode(model, ids, cfg, verifier=ref.verifier, drafter=ref.drafter)
        return res.engine_stats.folded_triples > 0

    ids = next((p for p in prompts if folds(p)), None)
    assert ids is not None, "no held-out prompt folds any row at delta 0 with the torch engine"
    m = prepare_method(model, MethodConfig(method="specfold", delta=0.0, backend="triton"), cfg)
    got = decode(model, ids, cfg, verifier=m.verifier, drafter=m.drafter)
    assert got.token_ids == decode(model, ids, cfg).token_ids and got.engine_stats.folded_triples > 0
