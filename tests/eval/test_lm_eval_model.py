"""lm-eval adapter (registration, generate_until with stop strings and max_gen_toks, chat template, likelihoods
refused), optional import, and EvalPlus sample files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from specfold.api import generate, load_model
from specfold.cli import main
from specfold.eval.evalplus import evalplus_task_id, write_evalplus

CONTEXT = "What is 3 + 4?"
DECODE = {"block_size": 8, "threshold": 1.0}  # one token a step: drafts and folding run


def test_importing_specfold_does_not_import_lm_eval():
    code = ("import sys, specfold, specfold.api, specfold.cli, specfold.eval.harness, specfold.eval.sweep, "
            "specfold.eval.merge, specfold.eval.evalplus; assert 'lm_eval' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.fixture(scope="module")
def lm_eval_model():
    pytest.importorskip("lm_eval")
    from specfold.eval import lm_eval_model

    return lm_eval_model


def _request(context: str, **gen_kwargs):
    from lm_eval.api.instance import Instance

    return Instance("generate_until", doc={}, arguments=(context, gen_kwargs), idx=0)


def test_registered_and_built_from_model_args(lm_eval_model, text_ckpt: Path):
    from lm_eval.api.registry import get_model

    cls = get_model("specfold")
    assert cls is lm_eval_model.SpecFoldLM
    lm = cls.create_from_arg_string(
        f"pretrained={text_ckpt},method=specfold,delta=0.1,budget=7,dtype=fp32,max_new_tokens=12,block_size=8,"
        "threshold=1.0",
        {"batch_size": 1, "max_batch_size": None, "device": None},
    )
    assert lm.method.name == "specfold" and lm.method.verifier.delta == 0.1 and lm.method.graph.budget == 7
    assert lm.cfg.max_new_tokens == 12 and lm.cfg.block_size == 8


def test_generate_until_applies_stops_and_max_gen_toks(lm_eval_model, text_ckpt: Path):
    lm = lm_eval_model.SpecFoldLM(pretrained=str(text_ckpt), method="specfold", delta=0.1, budget=3,
                                  max_new_tokens=16, **DECODE)
    model = load_model(text_ckpt)
    full = generate(model, CONTEXT, max_new_tokens=16, method="specfold", delta=0.1, budget=3, **DECODE)
    short = generate(model, CONTEXT, max_new_tokens=5, method="specfold", delta=0.1, budget=3, **DECODE)
    assert len(full.text) > 6
    stop = full.text[3:6]
    outs = lm.generate_until([_request(CONTEXT, until=[stop, "never there"]), _request(CONTEXT, max_gen_toks=5),
                              _request(CONTEXT, until=[])])
    assert outs == [full.text[: full.text.find(stop)], short.text, full.text]
    assert lm.stats["samples"] == 3 and lm.stats["generated_tokens"] == 16 + 5 + 16


def test_chat_template_applied_once(lm_eval_model, text_ckpt: Path):
    lm = lm_eval_model.SpecFoldLM(pretrained=str(text_ckpt), method="vanilla", max_new_tokens=8, **DECODE)
    model = load_model(text_ckpt)
    rendered = lm.apply_chat_template([{"role": "user", "content": CONTEXT}])
    assert rendered.endswith("assistant\n") and CONTEXT in rendered
    # lm-eval rendered the template, so the context goes in as is (not wrapped a second time)
    raw = generate(model, rendered, max_new_tokens=8, chat=False, **DECODE)
    assert lm.generate_until([_request(rendered)]) == [raw.text]


def test_likelihoods_are_refused_clearly(lm_eval_model, text_ckpt: Path):
    lm = lm_eval_model.SpecFoldLM(pretrained=str(text_ckpt), method="vanilla", max_new_tokens=8, **DECODE)
    for fn in (lm.loglikelihood, lm.loglikelihood_rolling):
        with pytest.raises(NotImplementedError, match="generation tasks"):
            fn([])
    assert lm_eval_model.truncate_at_stops("abc\n\nQ:", ["Q:", "\n\n", ""]) == "abc"


def test_evalplus_files_per_method(tmp_path: Path):
    def rec(task, sample_id, label, text):
        return {"task": task, "sample_id": sample_id, "method": label.split("[")[0], "label": label, "text": text}

    code = "```python\ndef f(x):\n    return x\n```"
    records = [
        rec("humaneval", "humaneval/HumanEval/0", "vanilla", code),
        rec("mbpp", "mbpp/test/11", "vanilla", code),
        rec("synth-code", "synth-code/test/00003", "vanilla", code),
        rec("synth-math", "synth-math/test/00001", "vanilla", "7"),  # not a code task: skipped
        rec("humaneval", "humaneval/HumanEval/0", "specfold[delta=0.1]", code),
    ]
    he = SimpleNamespace(meta={"prompt": "def f(x):\n    \"\"\"id\"\"\"\n", "entry_point": "f"})
    written = write_evalplus(records, tmp_path / "s.jsonl", samples={"humaneval/HumanEval/0": he})
    assert set(written) == {"vanilla", "specfold[delta=0.1]"}
    rows = [json.loads(line) for line in written["vanilla"].read_text().splitlines()]
    assert [r["task_id"] for r in rows] == ["HumanEval/0", "Mbpp/11", "synth-code/test/00003"]
    assert rows[0]["solution"].startswith(he.meta["prompt"]) and "return x" in rows[0]["solution"]
    assert rows[1]["solution"] == rows[2]["solution"] == "def f(x):\n    return x\n"
    only = write_evalplus(records, tmp_path / "h.jsonl", label="specfold[delta=0.1]")  # no samples: completion
    row = json.loads(only["specfold[delta=0.1]"].read_text())
    assert row == {"task_id": "HumanEval/0", "completion": "def f(x):\n    return x\n"}
    assert evalplus_task_id("mbpp", "mbpp/sanitized-test/601") == "Mbpp/601"
    with pytest.raises(ValueError, match="no records"):
        write_evalplus(records[3:4], tmp_path / "none.jsonl")


def test_eval_evalplus_out(text_ckpt: Path, tmp_path: Path, capsys):
    out = tmp_path / "samples.jsonl"
    argv = ["eval", "--model", str(text_ckpt), "--tasks", "synth-code", "--limit", "1", "--max-new-tokens", "8",
            "--block-size", "8", "--evalplus-out", str(out)]
    assert main(argv) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["task_id"].startswith("synth-code/test/") and "solution" in rows[0]
    assert "evalplus samples" in capsys.readouterr().err
