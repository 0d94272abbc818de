"""The CLI on LLaDA and Dream checkpoints (random weights in their formats, the embedded model's tokenizer beside
them): ``calibrate --cache`` writes a graph, ``generate --prompt-ids … --cache … --json`` prints the library's
decode for every method (vanilla's NFE, specfold's fold ratios of block and context rows), and what a family or the
references do not define is refused with one line."""

from __future__ import annotations

import json
import shutil

import pytest

from specfold.api import decode_config_for, load_model
from specfold.cli import main
from specfold.decoding.decoder import decode
from specfold.model.embedded import EMBEDDED_DIR
from specfold.model.random_checkpoint import write_random_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = [5, 17, 33, 2, 41, 9]
SHAPE = dict(vocab_size=1024, hidden_size=32, num_heads=4, num_kv_heads=2, intermediate_size=64)


def with_tokenizer(tmp_path_factory, family: str):
    from transformers import PreTrainedTokenizerFast

    out = tmp_path_factory.mktemp(family)
    tok = PreTrainedTokenizerFast(tokenizer_file=str(EMBEDDED_DIR / "tokenizer.json"))
    mask, stop = tok.convert_tokens_to_ids("|<MASK>|"), tok.convert_tokens_to_ids("<|im_end|>")
    ckpt = write_random_checkpoint(out, family, seed=3, mask_token_id=mask, eos_token_id=stop, **SHAPE)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(EMBEDDED_DIR / name, ckpt / name)
    return ckpt


@pytest.fixture(scope="module")
def llada_tok(tmp_path_factory):
    return with_tokenizer(tmp_path_factory, "llada")


@pytest.fixture(scope="module")
def dream_tok(tmp_path_factory):
    return with_tokenizer(tmp_path_factory, "dream")


def run_json(capsys, *argv: str) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def refused_with_one_line(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("family,cache", [("llada", "prefix"), ("dream", "dual")])
def test_calibrate_then_generate_every_method(capsys, llada_tok, dream_tok, tmp_path, family, cache):
    ckpt = llada_tok if family == "llada" else dream_tok
    graph = tmp_path / "g.json"
    settings = ["--max-new-tokens", "16", "--block-size", "8", "--cache", cache, "--dtype", "fp64"]
    assert main(["calibrate", "--model", str(ckpt), "--samples", "4", "--budget", "2", "--out", str(graph),
                 "--threshold", "0.99", *settings]) == 0
    capsys.readouterr()
    model = load_model(ckpt, dtype="fp64")
    cfg = decode_config_for(model, max_new_tokens=16, block_size=8, threshold=0.99, cache=cache)
    want = decode(model, PROMPT, cfg)
    base = ["generate", "--model", str(ckpt), "--prompt-ids", ",".join(map(str, PROMPT)), "--threshold", "0.99",
            "--json", *settings]
    for method, extra in (("vanilla", []), ("spiffy", ["--graph", str(graph)]),
                          ("specfold", ["--graph", str(graph), "--delta", "0"])):
        rec = run_json(capsys, *base, "--method", method, *extra)
        assert rec["token_ids"] == want.token_ids and rec["method"] == method
        if method == "vanilla":
            assert rec["nfe"] == want.nfe and rec["nfe_cache"] == len(want.steps_per_block)
        if method == "specfold":  # (the cost rule may run layers dense: they fold nothing, in either count)
            stats = rec["engine_stats"]
            assert 0.0 <= rec["fold_ratio_block"] <= 1.0 and stats["block_folded_triples"] <= stats["folded_triples"]


def test_llada_steps_without_a_cache_and_refusals(capsys, llada_tok, tmp_path):
    model = load_model(llada_tok, dtype="fp64")
    cfg = decode_config_for(model, max_new_tokens=16, block_size=8, steps=8, cache="none")
    want = decode(model, PROMPT, cfg)
    rec = run_json(capsys, "generate", "--model", str(llada_tok), "--prompt-ids", ",".join(map(str, PROMPT)),
                   "--max-new-tokens", "16", "--block-size", "8", "--steps", "8", "--cache", "none", "--dtype",
                   "fp64", "--json")
    assert rec["token_ids"] == want.token_ids and rec["nfe"] == want.nfe
    base = ["generate", "--model", str(llada_tok), "--prompt-ids", "1,2,3", "--block-size", "8"]
    assert "multiple of the block size" in refused_with_one_line(capsys, [*base, "--max-new-tokens", "20"])
    assert "blocks" in refused_with_one_line(capsys, [*base, "--max-new-tokens", "16", "--steps", "3"])
    fd = write_random_checkpoint(tmp_path / "fd", "fast_dllm_v2", mask_token_id=300)
    line = refused_with_one_line(capsys, ["generate", "--model", str(fd), "--prompt-ids", "1,2,3",
                                          "--max-new-tokens", "8", "--cache", "prefix"])
    assert "--cache applies to the fully bidirectional" in line


def test_eval_takes_the_cache(capsys, llada_tok, tmp_path):
    from specfold.api import encode_prompt
    from specfold.eval.harness import load_task

    out = tmp_path / "eval.jsonl"
    assert main(["eval", "--model", str(llada_tok), "--tasks", "synth-math", "--limit", "2", "--methods", "vanilla",
                 "--max-new-tokens", "16", "--block-size", "8", "--cache", "prefix", "--dtype", "fp64", "--out",
                 str(out), "--json"]) == 0
    capsys.readouterr()
    records = [json.loads(line) for line in out.read_text().splitlines()]
    model = load_model(llada_tok, dtype="fp64")
    cfg = decode_config_for(model, max_new_tokens=16, block_size=8, cache="prefix")
    prompts = [encode_prompt(model, s.prompt, True) for s in load_task("synth-math", "test", 2).samples]
    want = [decode(model, p, cfg) for p in prompts]
    assert [r["token_ids"] for r in records] == [w.token_ids for w in want]
    assert [r["nfe"] for r in records] == [w.nfe for w in want]
    assert {r["provenance"]["cache"] for r in records} == {"prefix"}
