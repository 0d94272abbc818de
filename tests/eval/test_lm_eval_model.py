"""lm-eval adapter (registration, generate_until with stop strings and max_gen_toks, chat template, likelihoods
refused), an lm-eval run of a local GSM8K-style task end to end, optional import, and EvalPlus sample files.

``make test`` installs the ``lmeval`` extra and sets ``SPECFOLD_REQUIRE_LM_EVAL=1``: there the lm-eval tests fail
instead of skipping when lm-eval is missing, so CI always runs them against the real harness."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from specfold.api import generate, load_model
from specfold.cli import main
from specfold.eval.evalplus import evalplus_task_id, write_evalplus
from specfold.eval.tasks.synthetic import load_split

CONTEXT = "What is 3 + 4?"
DECODE = {"block_size": 8, "threshold": 1.0}  # one token a step: drafts and folding run
TASKS_DIR = Path(__file__).parent / "lm_eval_tasks"
GSM8K_STOPS = ["Question:", "</s>", "<|im_end|>"]  # as in lm_eval_tasks/gsm8k_local.yaml
GSM8K_MAX_GEN = 24


def require_lm_eval() -> None:
    """Skip without lm-eval, unless the run requires it (``make test``): then fail."""
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        if os.environ.get("SPECFOLD_REQUIRE_LM_EVAL"):
            pytest.fail("SPECFOLD_REQUIRE_LM_EVAL is set but lm-eval is not installed: pip install -e '.[lmeval]'")
        pytest.skip("lm-eval not installed (pip install -e '.[lmeval]')")


def test_importing_specfold_does_not_import_lm_eval():
    require_lm_eval()  # installed, so the assertion below can fail
    code = ("import sys, specfold, specfold.api, specfold.cli, specfold.eval.harness, specfold.eval.sweep, "
            "specfold.eval.merge, specfold.eval.evalplus; assert 'lm_eval' not in sys.modules, 'imported lm_eval'; "
            "import specfold.eval.lm_eval_model; assert 'lm_eval' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.fixture(scope="module")
def lm_eval_model():
    require_lm_eval()
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


def test_model_args_are_one_method_config(lm_eval_model):
    from specfold.config import MethodConfig
    from specfold.validation import ValidationError

    args = {"delta": "0.2", "budget": "3", "attention": "direct", "lookahead": "false", "batch_size": "1"}
    assert lm_eval_model._method_config("specfold", args) == MethodConfig(
        "specfold", delta=0.2, budget=3, attention="direct", lookahead=False
    )
    assert lm_eval_model._method_config("vanilla", {"delta": "none", "graph": ""}) == MethodConfig()
    # an option for another method is refused, before any model is loaded
    with pytest.raises(ValidationError, match="^delta applies to specfold, not vanilla$"):
        lm_eval_model.SpecFoldLM(pretrained="/no/such/checkpoint", method="vanilla", delta=0.1)


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


def _gsm8k_records(path: Path, n: int = 3) -> list[dict]:
    """``n`` GSM8K-format records (question, worked answer ending in ``#### N``) made from synth-math test samples."""
    rows = [{"question": s.prompt, "answer": s.reference.replace("Answer: ", "#### ")}
            for s in load_split("synth-math", "test", n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


@pytest.mark.parametrize("lm_eval_chat", [False, True], ids=["adapter-chat", "lm-eval-chat-template"])
def test_lm_eval_run_on_local_gsm8k_equals_generate(lm_eval_model, tmp_path, monkeypatch, lm_eval_chat):
    """lm-eval's own pipeline (task YAML, request building, generate_until, filters, exact_match) over the
    embedded model: each response is specfold.generate's text on the task's prompt, cut at the task's stop strings;
    with lm-eval's --apply_chat_template the prompt is templated once (by lm-eval), not twice."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    monkeypatch.chdir(tmp_path)  # the task's data file and datasets cache are relative to the working directory
    docs = _gsm8k_records(tmp_path / "gsm8k_local.jsonl")
    lm = lm_eval_model.SpecFoldLM(method="specfold", delta=0.1, max_new_tokens=256)
    out = simple_evaluate(model=lm, tasks=["gsm8k_local"], task_manager=TaskManager(include_path=str(TASKS_DIR),
                          include_defaults=False), log_samples=True, apply_chat_template=lm_eval_chat)
    samples = sorted(out["samples"]["gsm8k_local"], key=lambda r: r["doc_id"])
    assert [r["doc_id"] for r in samples] == [0, 1, 2]

    model = load_model(None)
    correct, tokens = [], 0
    for doc, rec in zip(docs, samples, strict=True):
        text = f"Question: {doc['question']}\nAnswer:"
        [(context, gen_kwargs)] = rec["arguments"]  # the one request of the doc: (context, generation kwargs)
        assert gen_kwargs["until"] == GSM8K_STOPS and gen_kwargs["max_gen_toks"] == GSM8K_MAX_GEN
        if lm_eval_chat:  # lm-eval rendered the model's template around the prompt, once
            assert context == model.tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
        else:
            assert context == text
        want = generate(model, text, max_new_tokens=GSM8K_MAX_GEN, method="specfold", delta=0.1)
        tokens += want.generated_tokens
        assert rec["resps"] == [[lm_eval_model.truncate_at_stops(want.text, GSM8K_STOPS)]]
        numbers = re.findall(r"(-?[$0-9.,]{2,})|(-?[0-9]+)", rec["resps"][0][0])
        extracted = "".join(numbers[-1]) if numbers else "[invalid]"  # the task's flexible-extract filter
        assert rec["filtered_resps"] == [extracted]
        correct.append(extracted == doc["answer"].split("#### ")[-1])
        assert rec["exact_match"] == float(correct[-1])
    assert out["results"]["gsm8k_local"]["exact_match,flexible-extract"] == pytest.approx(sum(correct) / 3)
    assert lm.stats["samples"] == 3 and lm.stats["generated_tokens"] == tokens


@pytest.mark.slow  # ~25 s: lm-eval's CLI indexes its thousands of built-in task files before it starts
def test_lm_eval_command_line_on_local_gsm8k(lm_eval_model, tmp_path):
    """What the adapter's docstring tells users to run: ``python -m specfold.eval.lm_eval_model --model specfold``
    (lm-eval's own CLI with the model registered), hub access switched off."""
    _gsm8k_records(tmp_path / "gsm8k_local.jsonl")
    src = str(Path(lm_eval_model.__file__).parents[2])  # this checkout's sources, as the test process imports them
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
           "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "specfold.eval.lm_eval_model", "--model", "specfold", "--model_args",
           "method=specfold,delta=0.1", "--tasks", "gsm8k_local", "--include_path", str(TASKS_DIR), "--output_path",
           str(tmp_path / "out"), "--log_samples"]
    subprocess.run(cmd, cwd=tmp_path, env=env, check=True, timeout=300, capture_output=True)
    [path] = (tmp_path / "out").rglob("samples_gsm8k_local_*.jsonl")
    rows = sorted((json.loads(line) for line in path.read_text().splitlines()), key=lambda r: r["doc_id"])
    model = load_model(None)
    for row in rows:
        text = row["arguments"]["gen_args_0"]["arg_0"]
        want = generate(model, text, max_new_tokens=GSM8K_MAX_GEN, method="specfold", delta=0.1).text
        assert row["resps"] == [[lm_eval_model.truncate_at_stops(want, GSM8K_STOPS)]]
    assert len(rows) == 3


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
