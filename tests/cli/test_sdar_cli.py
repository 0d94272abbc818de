"""The CLI on an SDAR checkpoint (random weights in SDAR's format, the embedded model's tokenizer beside them):
``calibrate`` writes a graph, ``generate --prompt-ids … --json`` prints the library's decode for every method, and
``--steps`` / ``--strategy`` reach the rule (refused, with one line, for a family without a quota rule)."""

from __future__ import annotations

import json
import shutil

import pytest

from specfold.api import decode_config_for, load_model, prepare_method
from specfold.cli import main
from specfold.config import MethodConfig
from specfold.decoding.decoder import decode
from specfold.decoding.draft_graph import DraftGraph
from specfold.model.embedded import EMBEDDED_DIR
from specfold.model.random_checkpoint import write_random_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = [5, 17, 33, 2, 41, 9]


@pytest.fixture(scope="module")
def sdar_tok(tmp_path_factory):
    from transformers import PreTrainedTokenizerFast

    out = tmp_path_factory.mktemp("sdar_tok")
    tok = PreTrainedTokenizerFast(tokenizer_file=str(EMBEDDED_DIR / "tokenizer.json"))
    mask, stop = tok.convert_tokens_to_ids("|<MASK>|"), tok.convert_tokens_to_ids("<|im_end|>")
    ckpt = write_random_checkpoint(out, "sdar", seed=3, vocab_size=1024, mask_token_id=mask, eos_token_id=stop,
                                   generation_eos=[stop, stop - 1])
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(EMBEDDED_DIR / name, ckpt / name)
    return ckpt


def run_json(capsys, *argv: str) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_calibrate_then_generate_every_method(capsys, sdar_tok, tmp_path):
    graph = tmp_path / "g.json"
    assert main(["calibrate", "--model", str(sdar_tok), "--samples", "4", "--budget", "2", "--out", str(graph),
                 "--max-new-tokens", "16", "--dtype", "fp64"]) == 0
    capsys.readouterr()
    model = load_model(sdar_tok, dtype="fp64")
    assert model.stop_ids[0] == model.stop_id and len(model.stop_ids) == 2
    cfg = decode_config_for(model, max_new_tokens=16, threshold=0.9)
    want = decode(model, PROMPT, cfg)
    ids = ",".join(map(str, PROMPT))
    base = ["generate", "--model", str(sdar_tok), "--prompt-ids", ids, "--max-new-tokens", "16", "--threshold", "0.9",
            "--dtype", "fp64", "--json"]
    for method, extra in (("vanilla", []), ("spiffy", ["--graph", str(graph)]),
                          ("specfold", ["--graph", str(graph), "--delta", "0"])):
        rec = run_json(capsys, *base, "--method", method, *extra)
        assert rec["token_ids"] == want.token_ids and rec["method"] == method
        if method == "vanilla":
            assert rec["nfe"] == want.nfe
    spiffy = prepare_method(model, MethodConfig(method="spiffy", graph=DraftGraph.load(graph)), cfg)
    assert decode(model, PROMPT, cfg, spiffy.verifier, spiffy.drafter).token_ids == want.token_ids


def test_steps_and_strategy_reach_the_rule(capsys, sdar_tok, tmp_path):
    model = load_model(sdar_tok, dtype="fp64")
    cfg = decode_config_for(model, max_new_tokens=16, threshold=0.9, steps=8, strategy="low_confidence_static")
    want = decode(model, PROMPT, cfg)
    rec = run_json(capsys, "generate", "--model", str(sdar_tok), "--prompt-ids", ",".join(map(str, PROMPT)),
                   "--max-new-tokens", "16", "--dtype", "fp64", "--json", "--steps", "8", "--strategy",
                   "low_confidence_static")
    assert rec["token_ids"] == want.token_ids and rec["steps_per_block"] == want.steps_per_block
    fd = write_random_checkpoint(tmp_path / "fd", "fast_dllm_v2", mask_token_id=300)
    assert main(["generate", "--model", str(fd), "--prompt-ids", "1,2,3", "--max-new-tokens", "8", "--steps", "4",
                 "--json"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "quota" in err[0]
