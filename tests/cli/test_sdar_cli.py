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


# The quota rule through eval, sweep and serve. At threshold 0.01 the dynamic strategy unmasks every mask above it at
# once while the static one unmasks one position per pass, so the two differ in NFE: a run that dropped --strategy
# would show it.
STATIC = ("--threshold", "0.01", "--strategy", "low_confidence_static")


def static_and_dynamic(model, max_new_tokens=8):
    return [decode_config_for(model, max_new_tokens=max_new_tokens, threshold=0.01, strategy=s)
            for s in ("low_confidence_static", None)]


def task_prompts(model, limit):
    from specfold.api import encode_prompt
    from specfold.eval.harness import load_task

    return [list(encode_prompt(model, s.prompt, True)) for s in load_task("synth-math", "test", limit).samples]


def refused_with_one_line(capsys, argv) -> str:
    capsys.readouterr()  # what earlier steps printed (a library warning) is not this command's
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_eval_takes_steps_and_strategy(capsys, sdar_tok, tmp_path):
    out = tmp_path / "eval.jsonl"
    argv = ["eval", "--model", str(sdar_tok), "--tasks", "synth-math", "--limit", "2", "--methods", "vanilla",
            "--max-new-tokens", "8", "--out", str(out), "--json"]
    assert main([*argv, *STATIC]) == 0
    capsys.readouterr()
    records = [json.loads(line) for line in out.read_text().splitlines()]
    model = load_model(sdar_tok)
    static, dynamic = static_and_dynamic(model)
    want = [decode(model, p, static) for p in task_prompts(model, 2)]
    assert [r["token_ids"] for r in records] == [w.token_ids for w in want]
    assert [r["nfe"] for r in records] == [w.nfe for w in want]
    assert [w.nfe for w in want] != [decode(model, p, dynamic).nfe for p in task_prompts(model, 2)]
    assert {(r["provenance"]["strategy"], r["provenance"]["steps"]) for r in records} == {("low_confidence_static",
                                                                                           None)}
    # a rerun into the same file under the other strategy is refused (the records would mix two rules)
    line = refused_with_one_line(capsys, [*argv, "--threshold", "0.01"])
    assert "strategy" in line
    fd = write_random_checkpoint(tmp_path / "fd", "fast_dllm_v2", mask_token_id=300)
    line = refused_with_one_line(capsys, ["eval", "--model", str(fd), "--tasks", "synth-math", "--limit", "1",
                                          "--methods", "vanilla", "--steps", "4"])
    assert "quota" in line


def test_sweep_takes_steps_and_strategy(capsys, sdar_tok, tmp_path):
    ckpt = tmp_path / "sdar"
    shutil.copytree(sdar_tok, ckpt)
    assert main(["calibrate", "--model", str(ckpt), "--samples", "4", "--budget", "2", "--max-new-tokens", "8",
                 "--out", str(ckpt / "draft_graph.json"), *STATIC]) == 0
    out = tmp_path / "sweep.jsonl"
    assert main(["sweep", "delta", "--model", str(ckpt), "--tasks", "synth-math", "--limit", "1", "--grid", "0",
                 "--budget", "2", "--max-new-tokens", "8", "--out", str(out), "--json", *STATIC]) == 0
    capsys.readouterr()
    records = {r["label"]: r for r in map(json.loads, out.read_text().splitlines())}
    model = load_model(ckpt)
    want = decode(model, task_prompts(model, 1)[0], static_and_dynamic(model)[0])
    assert {r["method"] for r in records.values()} == {"vanilla", "spiffy", "specfold"}
    for r in records.values():  # every method lossless under the static rule
        assert r["token_ids"] == want.token_ids and r["provenance"]["strategy"] == "low_confidence_static"
    assert records["vanilla"]["nfe"] == want.nfe
    fd = write_random_checkpoint(tmp_path / "fd", "fast_dllm_v2", mask_token_id=300)
    line = refused_with_one_line(capsys, ["sweep", "delta", "--model", str(fd), "--tasks", "synth-math", "--limit",
                                          "1", "--out", str(tmp_path / "fd.jsonl"), "--strategy",
                                          "low_confidence_static"])
    assert "quota" in line


def test_serve_takes_steps_and_strategy_per_server(capsys, sdar_tok, tmp_path):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from specfold.serve import ServerConfig, build_app

    model = load_model(sdar_tok)
    static, dynamic = static_and_dynamic(model)
    want = decode(model, PROMPT, static)
    assert want.nfe != decode(model, PROMPT, dynamic).nfe
    config = ServerConfig(max_batch=1, threshold=0.01, strategy="low_confidence_static")
    with TestClient(build_app(model, config)) as client:
        body = {"prompt": PROMPT, "max_tokens": 8}
        got = client.post("/v1/completions", json=body).json()["specfold"]
        assert got["token_ids"] == want.token_ids and got["nfe"] == want.nfe
        refused = client.post("/v1/completions", json={**body, "strategy": "low_confidence_dynamic"})
        assert refused.status_code == 400  # per server, not per request
    fd = write_random_checkpoint(tmp_path / "fd", "fast_dllm_v2", mask_token_id=300)
    line = refused_with_one_line(capsys, ["serve", "--model", str(fd), "--port", "0", "--steps", "4"])
    assert "quota" in line


def test_calibrate_and_generate_at_a_block_of_64(capsys, sdar_tok, tmp_path):
    ckpt = tmp_path / "sdar64"
    shutil.copytree(sdar_tok, ckpt)
    raw = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**raw, "block_size": 64}))
    graph = tmp_path / "g64.json"
    assert main(["calibrate", "--model", str(ckpt), "--samples", "2", "--budget", "2", "--max-new-tokens", "16",
                 "--block-size", "64", "--out", str(graph)]) == 0
    capsys.readouterr()
    assert DraftGraph.load(graph).provenance["block_size"] == 64
    model = load_model(ckpt)
    cfg = decode_config_for(model, max_new_tokens=16)
    assert cfg.block_size == 64  # the checkpoint's block, as generate takes it by default
    want = decode(model, PROMPT, cfg)
    base = ["generate", "--model", str(ckpt), "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", "16",
            "--json", "--graph", str(graph)]
    for method in ("spiffy", "specfold"):
        rec = run_json(capsys, *base, "--method", method, *(["--delta", "0"] if method == "specfold" else []))
        assert rec["token_ids"] == want.token_ids and rec["steps_per_block"] == want.steps_per_block
    # the graph of 64 is refused for blocks of 16, with one line
    assert main([*base, "--method", "spiffy", "--block-size", "16"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "calibrated with block size 64" in err[0]
