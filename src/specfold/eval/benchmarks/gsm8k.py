"""GSM8K (Cobbe et al. 2021): grade-school word problems, scored by the final number.

Release files: ``DIR/gsm8k/{test,train}.jsonl``, one ``{"question", "answer"}`` object a line; the answer is
a worked solution ending in ``#### N``. Fallback: hub ``openai/gsm8k`` (config ``main``).

Scoring (:func:`extract_answer`): the response's final answer is, in order of preference, the number after
the last ``####``, inside the last ``\\boxed{}``, after the last "answer is", else the last number in the
text. Thousands commas, ``$`` and trailing units or full stops are tolerated; the value is compared exactly
(as a ``Decimal``, so ``18.00`` equals ``18``) with the ``#### N`` reference.

    >>> score({"answer": "18"}, "She makes 9 * 2 = $18 a day.")
    True
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
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

NAME = "gsm8k"
SPLITS: tuple[str, ...] = ("test", "train")
# The zero-shot instruction instruct models (Qwen2.5 and its diffusion descendants) were tuned on.
PROMPT_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."

# A number: optional sign, thousands-grouped or plain digits, optional decimals ("1,234.5", "-3", ".5").
_NUMBER_RE = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+")
_ANSWER_IS_RE = re.compile(r"answer\s+is\s*:?\s*(.*)", re.IGNORECASE)


def build_prompt(question: str) -> str:
    """The zero-shot user message."""
    return question.strip() + PROMPT_SUFFIX


def reference_answer(answer: str) -> str:
    """The ``N`` of a release answer's ``#### N`` line, commas stripped."""
    return answer.split("####")[-1].strip().replace(",", "")


def _first_number(text: str) -> str | None:
    m = _NUMBER_RE.search(text)
    return m.group(0) if m else None


def _last_boxed_content(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None


def extract_answer(response: str) -> str | None:
    """The final number of a response (see the module docstring for the order), commas stripped."""
    candidates: list[str | None] = []
    if "####" in response:
        candidates.append(_first_number(response.rsplit("####", 1)[1]))
    boxed = _last_boxed_content(response)
    if boxed is not None:
        candidates.append(_first_number(boxed))
    said = _ANSWER_IS_RE.findall(response)
    if said:
        candidates.append(_first_number(said[-1]))
    numbers = _NUMBER_RE.findall(response)
    candidates.append(numbers[-1] if numbers else None)
    found = next((c for c in candidates if c is not None), None)
    return None if found is None else found.replace(",", "")


def _to_decimal(text: str) -> Decimal | None:
    try:
        return Decimal(text.replace(",", "").strip())
    except InvalidOperation:
        return None


def score(meta: dict, response: str) -> bool:
    """True iff the response's final number equals ``meta["answer"]`` exactly."""
    got = extract_answer(response)
    if got is None:
        return False
    a, b = _to_decimal(got), _to_decimal(meta["answer"])
    return a is not None and b is not None and a == b


def load(data_dir: Path | None, split: str = "test", limit: int | None = None) -> list[BenchSample]:
    """GSM8K samples in file order; ``meta = {"answer": N}``, ``reference`` = the worked answer."""
    check_split(NAME, split, SPLITS)
    check_limit(limit)
    path = Path(data_dir, NAME, f"{split}.jsonl") if data_dir is not None else None
    if path is not None and path.is_file():
        rows = read_jsonl(path)
    elif datasets_available():
        rows = hf_rows("openai/gsm8k", "main", split,
                       lambda why: missing_data(NAME, expected_path(data_dir, NAME, f"{split}.jsonl"), why))
    else:
        raise missing_data(NAME, expected_path(data_dir, NAME, f"{split}.jsonl"))
    rows = rows if limit is None else rows[:limit]
    return [
        BenchSample(
            NAME,
            f"{NAME}/{split}/{i:05d}",
            build_prompt(row["question"]),
            {"answer": reference_answer(row["answer"])},
            row["answer"],
        )
        for i, row in enumerate(rows)
    ]
