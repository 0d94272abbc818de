"""Every CLI command's success path on tiny inputs, checked against the library computing the same thing directly:
generate, demo, calibrate, export-evalplus, init-random, train (eval, sweep, plot, analyze and merge are run in
tests/eval), and every command's --help. Through ``specfold.cli.main`` only, so the tests hold whatever module the
commands live in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from specfold.api import decode_config_for, encode_prompt, load_model, prepare_method, record_counts
from specfold.cli import main
from specfold.config import MethodConfig
from specfold.decoding.calibration import counts_to_json, graph_from_counts
from specfold.decoding.decoder import decode
from specfold.decoding.draft_graph import DraftGraph
from specfold.eval.tasks.synthetic import TASKS, load_split, score
from specfold.model.embedded import EMBEDDED_DIR
from specfold.model.random_checkpoint import write_random_checkpoint

PROMPT = load_split("synth-math", "test", limit=1)[0].prompt  # in the embedded model's domain: drafts are accepted


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def embedded():
    return load_model(None)


def run(capsys, *argv: str) -> tuple[str, str]:
    assert main(list(argv)) == 0
    return capsys.readouterr()


@pytest.mark.parametrize("method", ["vanilla", "specfold"])
def test_generate_json_is_the_decode_of_the_prompt(capsys, embedded, method):
    extra = ["--method", "specfold", "--delta", "0"] if method == "specfold" else []
    out, _ = run(capsys, "generate", PROMPT, "--max-new-tokens", "24", "--json", *extra)
    rec = json.loads(out.strip().splitlines()[-1])
    want = decode(embedded, encode_prompt(embedded, PROMPT), decode_config_for(embedded, 24))  # vanilla, chat
    assert rec["token_ids"] == want.token_ids  # specfold at delta 0 is token-identical to vanilla
    assert rec["text"] == embedded.tokenizer.decode(want.token_ids, skip_special_tokens=True) != ""
    assert rec["generated_tokens"] == len(rec["token_ids"]) == want.generated_tokens
    assert rec["stopped"] == want.stopped and rec["method"] == method and rec["model"] == str(EMBEDDED_DIR)
    if method == "vanilla":
        assert (rec["nfe"], rec["nfe_denoise"], rec["steps_per_block"]) == (want.nfe, want.nfe_denoise,
                                                                            want.steps_per_block)
    else:
        # the per-pass rule may run every pass dense where folding cannot pay (fold ratio 0 then)
        assert rec["nfe"] <= want.nfe and 0.0 <= rec["fold_ratio"] < 1.0 and rec["accepted_per_step"] >= 0


def test_generate_text_output(capsys, embedded):
    out, err = run(capsys, "generate", PROMPT, "--max-new-tokens", "16", "--no-chat")
    want = decode(embedded, encode_prompt(embedded, PROMPT, chat=False), decode_config_for(embedded, 16))
    assert out == embedded.tokenizer.decode(want.token_ids, skip_special_tokens=True) + "\n"
    assert f"[{want.generated_tokens} tokens, NFE {want.nfe} " in err


def _table_rows(text: str) -> dict[tuple[str, str], list[str]]:
    table = text[: text.index("\nColumns:")]  # the results table, not the timing rows after it
    return {(cols[0], cols[1]): cols[2:] for cols in (line.split() for line in table.splitlines())
            if cols and cols[0] in TASKS}


def test_demo_shows_each_domain_the_table_its_key_timing_and_conclusions(capsys, embedded):
    out, _ = run(capsys, "demo", "--limit", "1", "--max-new-tokens", "16", "--repeats", "2", "--dtype", "fp32")
    assert out.startswith(f"specfold demo: the embedded model ({EMBEDDED_DIR}), 1 held-out problems per domain, fp32, "
                          "1 CPU thread (--threads N for more)\n")
    rows = _table_rows(out)
    labels = ["vanilla", "spiffy", "specfold[delta=0.1]"]
    assert list(rows) == [(t, m) for t in TASKS for m in labels]
    cfg = decode_config_for(embedded, 16)
    spiffy = prepare_method(embedded, MethodConfig("spiffy"), cfg)
    nfe = {"vanilla": 0, "spiffy": 0}
    n_correct = 0
    for task in TASKS:
        sample = load_split(task, "test", limit=1)[0]
        ids = encode_prompt(embedded, sample.prompt)
        want = decode(embedded, ids, cfg)
        text = embedded.tokenizer.decode(want.token_ids, skip_special_tokens=True)
        correct = score(sample, text)
        n_correct += correct
        assert f"\n[{task}] {'correct' if correct else 'WRONG'}, NFE {want.nfe}\n{text}\n" in out
        acc, nfe_col = rows[task, "vanilla"][:2]
        assert (acc, float(nfe_col)) == ("100.0%" if correct else "0.0%", want.nfe)
        spiffy_acc, spiffy_nfe = rows[task, "spiffy"][:2]  # lossless: the same answer, never more passes
        assert spiffy_acc == acc and float(spiffy_nfe) <= want.nfe
        nfe["vanilla"] += want.nfe
        nfe["spiffy"] += decode(embedded, ids, cfg, verifier=spiffy.verifier, drafter=spiffy.drafter).nfe
    # the key names every column of the table
    header = next(line for line in out.splitlines() if line.startswith("task "))
    key = out[out.index("Columns:"):out.index("\nTiming:")]
    keyed = {line.split()[0] for line in key.splitlines()[1:] if line.startswith("  ") and line[2] != " "}
    for column in header.split()[2:]:
        assert column in keyed or f"{column} = relative to vanilla" in key, column
    # timing: 2 repeats, the table's tok/s is their median, within min..max
    assert "\nTiming: tokens/s over 2 repeats" in out
    timing = out[out.index("\nTiming:"):out.index("\nWhat this run shows:")].splitlines()[3:]
    assert len(timing) == 9
    for line, (task, label) in zip(timing, rows, strict=True):
        cols = line.split()
        assert cols[:2] == [task, label]
        median, low, high = map(float, cols[2:5])
        assert low <= median <= high and f"{median:.1f}" == rows[task, label][3]
    # the conclusions are the run's numbers
    shows = " ".join(out[out.index("What this run shows:"):].split())  # the sentences, unwrapped
    pct = f"{100 * n_correct / 3:.1f}%"
    assert f"Accuracy over 3 problems: vanilla {pct}, spiffy {pct}, " in shows
    assert (f"spiffy gave vanilla's tokens on 3/3 problems (lossless); it needed "
            f"{nfe['spiffy'] / nfe['vanilla']:.2f}× vanilla's forward passes") in shows
    assert "Noise: over 2 repeats a row's tokens/s spanned up to " in shows


def test_calibrate_writes_the_graph_of_the_counted_prompts(capsys, embedded, tmp_path):
    (tmp_path / "cal").mkdir()
    out_path = tmp_path / "cal" / "graph.json"
    # threshold 1: one token a step, so even 3 short prompts show many transitions (at 0.9 the model fills a small
    # block in one step and there is next to nothing to count)
    out, _ = run(capsys, "calibrate", "--out", str(out_path), "--samples", "3", "--max-new-tokens", "16",
                 "--threshold", "1.0", "--budget", "3")
    info = json.loads(out.strip().splitlines()[-1])
    counts_path = tmp_path / "cal" / "graph.counts.json"
    assert (info["graph"], info["counts"], info["budget"]) == (str(out_path), str(counts_path), 3)
    # the same three prompts (one calib prompt per domain, in suite order), counted directly
    cfg = decode_config_for(embedded, 16, threshold=1.0)
    prompts = [encode_prompt(embedded, load_split(t, "calib", limit=1)[0].prompt) for t in TASKS]
    counts = record_counts(embedded, prompts, cfg)
    assert json.loads(counts_path.read_text()) == json.loads(json.dumps(counts_to_json(counts)))
    assert info["observations"] == sum(counts.values()) > 0
    graph = DraftGraph.load(out_path)
    assert graph.budget == 3 and graph.strings() == graph_from_counts(counts, 3).strings()
    assert info["nodes"] == graph.strings()[1:] and len(info["nodes"]) == 3
    # the written graph drives spiffy losslessly
    m = prepare_method(embedded, MethodConfig("spiffy", graph=out_path), cfg)
    got = decode(embedded, prompts[0], cfg, verifier=m.verifier, drafter=m.drafter)
    assert got.token_ids == decode(embedded, prompts[0], cfg).token_ids


def test_export_evalplus_from_records(capsys, tmp_path):
    code = "```python\ndef f(x):\n    return x\n```"
    records = [
        {"task": "mbpp", "sample_id": "mbpp/test/11", "method": "vanilla", "label": "vanilla", "text": code},
        {"task": "synth-math", "sample_id": "synth-math/test/00001", "method": "vanilla", "label": "vanilla",
         "text": "7"},
        {"task": "mbpp", "sample_id": "mbpp/test/11", "method": "specfold", "label": "specfold[delta=0.1]",
         "text": "Here:\n```python\ndef g():\n    pass\n```\nDone."},
    ]
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    out, _ = run(capsys, "export-evalplus", "--records", str(path), "--out", str(tmp_path / "s.jsonl"),
                 "--label", "specfold[delta=0.1]")
    files = json.loads(out)["files"]
    assert list(files) == ["specfold[delta=0.1]"]
    rows = [json.loads(line) for line in Path(files["specfold[delta=0.1]"]).read_text().splitlines()]
    assert rows == [{"task_id": "Mbpp/11", "solution": "def g():\n    pass\n"}]  # the code block, fences cut
    assert main(["export-evalplus", "--records", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "x")]) == 2
    assert "no records file" in capsys.readouterr().err


def test_init_random_writes_the_seeded_checkpoint(capsys, tmp_path):
    shape = {"vocab_size": 64, "hidden_size": 32, "num_heads": 4, "num_kv_heads": 2, "num_layers": 1,
             "intermediate_size": 48}
    out, _ = run(capsys, "init-random", str(tmp_path / "r"), "--family", "nld", "--seed", "5", "--vocab-size", "64",
                 "--hidden-size", "32", "--heads", "4", "--kv-heads", "2", "--layers", "1", "--intermediate-size", "48")
    assert "RANDOM-WEIGHT nld checkpoint" in out and "mask id 63, stop id 62" in out
    model = load_model(tmp_path / "r")
    cfg = model.config
    assert (cfg.family, cfg.vocab_size, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.num_layers,
            cfg.intermediate_size) == ("nld", 64, 32, 4, 2, 1, 48)
    assert (model.mask_id, model.stop_id) == (63, 62)
    want = load_file(write_random_checkpoint(tmp_path / "w", "nld", seed=5, mask_token_id=63, eos_token_id=62,
                                             **shape) / "model.safetensors")
    got = load_file(tmp_path / "r" / "model.safetensors")
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)  # the seed reached it
    out, _ = run(capsys, "generate", "--model", str(tmp_path / "r"), "--prompt-ids", "1,2,3", "--max-new-tokens", "8",
                 "--json")
    assert json.loads(out)["generated_tokens"] >= 1


def test_train_runs_and_exports_a_loadable_model(capsys, tmp_path):
    out, _ = run(capsys, "train", "--out", str(tmp_path / "run"), "--tokenizer", str(EMBEDDED_DIR), "--steps", "3",
                 "--batch-size", "2", "--hidden-size", "32", "--layers", "1", "--heads", "2", "--kv-heads", "1",
                 "--intermediate-size", "64")
    info = json.loads(out.strip().splitlines()[-1])
    assert info["steps"] == 3 and info["model"] == str(tmp_path / "run" / "model")
    log = [json.loads(line) for line in (tmp_path / "run" / "loss.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3]
    assert info["final_loss"] == pytest.approx(sum(r["loss"] for r in log) / 3)
    model = load_model(info["model"])
    assert info["parameters"] == sum(p.numel() for p in model.net.parameters())
    assert (model.config.hidden_size, model.config.num_layers) == (32, 1)
    assert model.tokenizer is not None and model.mask_id == model.tokenizer.convert_tokens_to_ids("|<MASK>|")


def test_train_ctrl_c_saves_and_a_rerun_resumes(capsys, tmp_path):
    """A real SIGINT to a real `specfold train` process: it ends after the step in flight with one line and status
    130, the state is at the last logged step, and a rerun continues the log without a gap or a repeated step (that
    the resumed steps are the uninterrupted run's is tests/train/test_train_loop.py's)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import specfold

    run_dir = tmp_path / "run"
    argv = ["train", "--out", str(run_dir), "--tokenizer", str(EMBEDDED_DIR), "--steps", "1000", "--batch-size", "2",
            "--hidden-size", "32", "--layers", "1", "--heads", "2", "--kv-heads", "1", "--intermediate-size", "64"]
    env = {**os.environ, "PYTHONPATH": str(Path(specfold.__file__).parents[1]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "specfold.cli", *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    log = run_dir / "loss.jsonl"
    deadline = time.monotonic() + 120
    while (not log.is_file() or len(log.read_text().splitlines()) < 3) and proc.poll() is None:
        assert time.monotonic() < deadline, "training never logged 3 steps"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and out == ""
    steps = [json.loads(line)["step"] for line in log.read_text().splitlines()]
    stopped = steps[-1]
    assert 3 <= stopped < 1000 and steps == list(range(1, stopped + 1))
    assert err.splitlines()[-1] == (f"specfold: SIGINT after step {stopped} of 1000: state saved to "
                                    f"{run_dir / 'state.pt'}; run the same command again to resume")
    assert torch.load(run_dir / "state.pt", weights_only=False)["step"] == stopped
    argv[argv.index("1000")] = str(stopped + 2)  # two more steps
    out, _ = run(capsys, *argv)
    assert json.loads(out.strip().splitlines()[-1])["steps"] == stopped + 2
    assert [json.loads(line)["step"] for line in log.read_text().splitlines()] == list(range(1, stopped + 3))


COMMANDS = ["generate", "demo", "eval", "serve", "sweep", "plot", "analyze", "merge", "export-evalplus", "calibrate",
            "bench", "train", "init-random"]


SUBCOMMANDS = [["analyze", "residuals"], ["bench", "layer"], ["bench", "pass"], ["bench", "batch"]]


@pytest.mark.parametrize("argv", [[c] for c in COMMANDS] + SUBCOMMANDS, ids=lambda a: " ".join(a))
def test_every_command_has_help(capsys, argv):
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: specfold " + " ".join(argv)) and "--help" in out
