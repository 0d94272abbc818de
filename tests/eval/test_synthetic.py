"""Synthetic suite: splits (sizes, determinism, provable disjointness) and every scorer on right and
wrong answers, including near misses."""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter

import pytest

from specfold.eval.tasks.synthetic import (
    SPLITS,
    TASKS,
    Sample,
    instruct,
    iter_train,
    load_split,
    score,
    split_of,
    suite,
)
from specfold.eval.tasks.synthetic import code as code_task
from specfold.eval.tasks.synthetic import math as math_task

# ---------------------------------------------------------------------------------------------- splits


@pytest.mark.parametrize("task", TASKS)
def test_split_sizes_ids_and_limit(task: str) -> None:
    test = load_split(task, "test")
    calib = load_split(task, "calib")
    assert len(test) == 200 and len(calib) >= 20
    assert len({s.prompt for s in test}) == 200 and len({s.prompt for s in calib}) == len(calib)
    assert [s.sample_id for s in test[:2]] == [f"{task}/test/00000", f"{task}/test/00001"]
    assert all(s.task == task for s in test + calib)
    assert load_split(task, "test", limit=7) == test[:7]
    assert len(load_split(task, "train", limit=13)) == 13


@pytest.mark.parametrize("task", TASKS)
def test_splits_are_deterministic(task: str) -> None:
    first = load_split(task, "test")
    suite._eval_split.cache_clear()
    assert load_split(task, "test") == first
    assert load_split(task, "train", limit=50) == load_split(task, "train", limit=50)
    assert load_split(task, "test", seed=1) != first


def test_unknown_task_or_split_names_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="synth-math"):
        load_split("synth-nope", "test")
    with pytest.raises(ValueError, match="calib"):
        load_split("synth-math", "dev")
    with pytest.raises(ValueError, match="synth-if"):
        next(iter_train("gsm8k"))


def test_splits_are_disjoint_by_prompt_hash() -> None:
    held_out: dict[str, str] = {}
    for task, split in itertools.product(TASKS, ("test", "calib")):
        for s in load_split(task, split):
            assert split_of(s.prompt) == split
            assert held_out.setdefault(s.prompt, split) == split
    train = [s.prompt for s in itertools.islice(iter_train(), 20_000)]
    assert all(split_of(p) == "train" for p in train)
    assert not set(train) & set(held_out)
    assert len(set(train)) > 15_000  # the train stream is mostly fresh prompts, not a small loop


def test_iter_train_interleaves_tasks_deterministically() -> None:
    head = list(itertools.islice(iter_train(), 9))
    assert [s.task for s in head] == list(TASKS) * 3
    assert head == list(itertools.islice(iter_train(), 9))
    assert [s.sample_id for s in head[:3]] == [f"{t}/train/00000" for t in TASKS]
    only_code = list(itertools.islice(iter_train("synth-code"), 3))
    assert only_code == [s for s in head if s.task == "synth-code"]
    assert [s.prompt for s in itertools.islice(iter_train(seed=1), 3)] != [s.prompt for s in head[:3]]


def test_iter_train_weights_set_samples_per_round() -> None:
    weights = {"synth-math": 3, "synth-code": 0, "synth-if": 2}
    head = list(itertools.islice(iter_train(weights=weights), 10))
    assert [s.task for s in head] == (["synth-math"] * 3 + ["synth-if"] * 2) * 2
    # each task's stream is the unweighted one, ids counting per task
    assert [s for s in head if s.task == "synth-math"] == list(itertools.islice(iter_train("synth-math"), 6))
    assert [s.sample_id for s in head if s.task == "synth-if"] == [f"synth-if/train/{i:05d}" for i in range(4)]
    assert list(itertools.islice(iter_train(weights={}), 6)) == list(itertools.islice(iter_train(), 6))


@pytest.mark.parametrize(
    "weights, message",
    [({"gsm8k": 1}, "outside"), ({"synth-math": -1}, "non-negative"), ({t: 0 for t in TASKS}, "every task")],
)
def test_iter_train_rejects_bad_weights(weights, message) -> None:
    with pytest.raises(ValueError, match=message):
        next(iter_train(weights=weights))


@pytest.mark.parametrize("task", TASKS)
def test_meta_is_json_serialisable_and_references_score(task: str) -> None:
    samples = load_split(task, "test") + load_split(task, "calib")
    for s in samples:
        assert json.loads(json.dumps(s.meta)) == s.meta
    if task == "synth-code":
        # Trusted, generated code: check every reference in-process here; the sandbox path is below.
        for s in samples:
            ns: dict = {}
            exec(s.reference + "\n" + "\n".join(s.meta["tests"]), ns)  # noqa: S102
    else:
        assert all(score(s, s.reference) for s in samples)


def test_split_of_is_the_only_rule() -> None:
    assert SPLITS == ("train", "calib", "test")
    counts = Counter(split_of(f"prompt {i}") for i in range(20_000))
    assert 300 <= counts["test"] <= 500 and 130 <= counts["calib"] <= 270


# ------------------------------------------------------------------------------------------------ math

_STEP_RE = re.compile(r"(\d+)([+*-])(\d+)=(\d+)")


def test_math_references_are_correct_worked_solutions() -> None:
    for s in load_split("synth-math", "test") + load_split("synth-math", "train", limit=500):
        *steps, last = s.reference.split("\n")
        assert 2 <= len(steps) <= 3
        for line in steps:
            a, op, b, c = _STEP_RE.fullmatch(line).groups()
            a, b, c = int(a), int(b), int(c)
            assert {"+": a + b, "-": a - b, "*": a * b}[op] == c
            assert 0 <= c <= math_task.MAX_VALUE and (op != "*" or min(a, b) <= 9)
        assert last == f"Answer: {s.meta['answer']}" == f"Answer: {c}"


@pytest.mark.parametrize(
    ("response", "ok"),
    [
        ("5+3=8\n8-2=6\nAnswer: 6", True),
        ("Answer: 6.", True),
        ("Answer:6", True),
        ("Answer: 3\nAnswer: 6", True),  # the last answer counts
        ("5+3=8\n8-2=6\nAnswer: 7", False),
        ("Answer: 61", False),
        ("Answer: 6.5", False),
        ("Answer: 6 apples", False),
        ("Answer: -6", False),
        ("Answer: 6\nAnswer: 5", False),
        ("5+3=8\n8-2=6", False),
        ("6", False),
        ("", False),
    ],
)
def test_math_scorer(response: str, ok: bool) -> None:
    sample = Sample("synth-math", "synth-math/test/x", "…", "Answer: 6", {"answer": 6})
    assert score(sample, response) is ok


# ------------------------------------------------------------------------------------------------ code


def _code_sample(template: str) -> Sample:
    return next(s for s in iter_train("synth-code") if s.meta["template"] == template)


def test_every_code_template_reference_passes_in_the_sandbox() -> None:
    seen: dict[str, Sample] = {}
    for s in itertools.islice(iter_train("synth-code"), 3000):
        seen.setdefault(s.meta["template"], s)
    assert set(seen) == set(code_task.TEMPLATE_KEYS)
    for s in seen.values():
        assert score(s, s.reference), s


def test_code_scorer_near_misses() -> None:
    s = Sample(
        "synth-code",
        "synth-code/test/x",
        "Write a function add_k(x) that returns x plus 5.",
        "def add_k(x):\n    return x + 5",
        {"entry_point": "add_k", "tests": ["assert add_k(1) == 6", "assert add_k(0) == 5"], "template": "add"},
    )
    assert score(s, "def add_k(x):\n    return x + 5")
    assert score(s, "```python\ndef add_k(x):\n    return 5 + x\n```")
    assert not score(s, "def add_k(x):\n    return x + 4")  # wrong constant
    assert not score(s, "def add_k(x):\n    return 6 if x == 1 else 0")  # fails only the second test
    assert not score(s, "def add(x):\n    return x + 5")  # wrong name -> NameError
    assert not score(s, "def add_k(x):\n    raise ValueError(x)")  # raises
    assert not score(s, "def add_k(x)\n    return x + 5")  # syntax error
    assert not score(s, "")


def test_code_scorer_infinite_loop_times_out() -> None:
    meta = {"entry_point": "f", "tests": ["assert f(1) == 1"], "template": "add"}
    assert not code_task.score(meta, "def f(x):\n    while True:\n        x += 1", timeout_s=1.0)


@pytest.mark.parametrize(
    ("template", "near_miss"),
    [
        ("count_gt", "return len([v for v in {x} if v >= {k}])"),
        ("greater", "return {x} >= {k}"),
        ("less", "return {x} <= {k}"),
        ("filter_gt", "return [v for v in {x} if v >= {k}]"),
        ("divisible", "return {x} % {k} != 0"),
    ],
)
def test_hidden_tests_separate_off_by_one_bodies(template: str, near_miss: str) -> None:
    for s in itertools.islice((s for s in iter_train("synth-code") if s.meta["template"] == template), 20):
        head, body = s.reference.split("\n    ")
        x = head[head.index("(") + 1 : head.index(")")]
        k = int(re.findall(r"\d+", s.prompt)[-1])
        ns: dict = {}
        exec(head + "\n    " + near_miss.format(x=x, k=k), ns)  # noqa: S102
        with pytest.raises(AssertionError):
            exec("\n".join(s.meta["tests"]), ns)  # noqa: S102


def test_code_template_sample_shape() -> None:
    s = _code_sample("count_char")
    name = s.meta["entry_point"]
    assert s.reference.startswith(f"def {name}(") and s.reference.count("\n") == 1
    assert len(s.meta["tests"]) == code_task.N_TESTS and all(t.startswith(f"assert {name}(") for t in s.meta["tests"])


# ------------------------------------------------------------------------------ instruction following


def _if_meta(k: int = 3, fmt: str = "numbered", **extra: str) -> dict:
    cons: list[dict] = [
        {"type": "count", "k": k, "topic": "colors", "vocab": list(instruct.TOPICS["colors"])},
        {"type": "format", "format": fmt},
    ]
    for kind, value in extra.items():
        key = {"case": "case", "include": "word", "exclude": "word", "end": "phrase"}[kind]
        cons.append({"type": kind, key: value})
    return {"constraints": cons}


@pytest.mark.parametrize(
    ("meta", "response", "ok"),
    [
        (_if_meta(), "1. Red\n2. Blue\n3. Green", True),
        (_if_meta(), "1. pink\n2. gray\n3. white", True),  # any valid words, any order
        (_if_meta(), "1. Red\n2. Blue\n3. Green\n4. Black", False),  # extra item
        (_if_meta(), "1. Red\n2. Blue", False),  # too few
        (_if_meta(), "1. Red\n2. Red\n3. Green", False),  # duplicate
        (_if_meta(), "1. Red\n2. Blue\n3. Apple", False),  # off-topic
        (_if_meta(), "1. Red\n3. Blue\n4. Green", False),  # bad numbering
        (_if_meta(), "- Red\n- Blue\n- Green", False),  # wrong format
        (_if_meta(), "Here you go:\n1. Red\n2. Blue\n3. Green", False),  # extra text
        (_if_meta(fmt="dashed"), "- Red\n- Blue\n- Green", True),
        (_if_meta(fmt="comma"), "Red, Blue, Green", True),
        (_if_meta(fmt="comma"), "Red, Blue\nGreen", False),
        (_if_meta(fmt="words"), "Red Blue Green", True),
        (_if_meta(fmt="words"), "Red Blue Green Pink", False),
        (_if_meta(fmt="json"), '{"answer": ["Red", "Blue", "Green"]}', True),
        (_if_meta(fmt="json"), '{"answer": ["Red", "Blue", "Green"]', False),  # malformed
        (_if_meta(fmt="json"), '{"answer": ["Red", "Blue", "Green"], "x": 1}', False),
        (_if_meta(fmt="quotes"), '"Red, Blue, Green"', True),
        (_if_meta(fmt="quotes"), "Red, Blue, Green", False),
        (_if_meta(case="upper"), "1. RED\n2. BLUE\n3. GREEN", True),
        (_if_meta(case="upper"), "1. RED\n2. Blue\n3. GREEN", False),  # case violation
        (_if_meta(case="lower"), "1. red\n2. blue\n3. green", True),
        (_if_meta(case="lower"), "1. Red\n2. blue\n3. green", False),
        (_if_meta(include="pink"), "1. Red\n2. Pink\n3. Green", True),
        (_if_meta(include="pink"), "1. Red\n2. Blue\n3. Green", False),
        (_if_meta(exclude="red"), "1. Blue\n2. Green\n3. Pink", True),
        (_if_meta(exclude="red"), "1. RED\n2. Blue\n3. Green", False),
        (_if_meta(end="Done."), "1. Red\n2. Blue\n3. Green\nDone.", True),
        (_if_meta(end="Done."), "1. Red\n2. Blue\n3. Green", False),
        (_if_meta(end="Done."), "1. Red\n2. Blue\n3. Green Done.", False),
        (_if_meta(end="Done."), "1. Red\n2. Blue\n3. Green\nDone. Bye.", False),
        (_if_meta(k=2, fmt="comma", case="lower", exclude="red"), "blue, green", True),
        (_if_meta(k=2, fmt="comma", case="lower", exclude="red"), "red, green", False),
    ],
)
def test_instruct_scorer(meta: dict, response: str, ok: bool) -> None:
    sample = Sample("synth-if", "synth-if/test/x", "…", "", meta)
    assert score(sample, response) is ok


def test_instruct_check_reports_each_constraint() -> None:
    verdict = instruct.check(_if_meta(case="upper", include="pink"), "1. RED\n2. BLUE\n3. Green")
    assert verdict == {"format": True, "count": True, "case": False, "include": False}


def test_instruct_prompts_cover_formats_and_extras() -> None:
    test = load_split("synth-if", "test")
    formats = Counter(c["format"] for s in test for c in s.meta["constraints"] if c["type"] == "format")
    extras = Counter(c["type"] for s in test for c in s.meta["constraints"] if c["type"] not in ("count", "format"))
    assert set(formats) == set(instruct.FORMATS)
    assert set(extras) == {"case", "include", "exclude", "end"}
    for s in test:
        assert 2 <= len(s.meta["constraints"]) <= 4
        assert str(s.meta["constraints"][0]["k"]) in s.prompt
        assert all(instruct.check(s.meta, s.reference).values())
