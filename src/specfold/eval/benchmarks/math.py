"""MATH (Hendrycks et al. 2021) and MATH-500 (Lightman et al. 2023): competition maths, scored by ``\\boxed{}``.

Release files:

* MATH-500: ``DIR/math/math500/test.jsonl`` (problem, solution, answer, subject, level, unique_id);
  fallback hub ``HuggingFaceH4/MATH-500``.
* MATH: ``DIR/math/MATH/{train,test}/<subject>/<id>.json`` (problem, level, type, solution), read in
  (subject, numeric id) order; the reference answer is the last ``\\boxed{}`` of the solution. Fallback
  hub ``EleutherAI/hendrycks_math`` (one config per subject; ids are then row indices).

Sample ids reuse the release's ``unique_id`` (``test/precalculus/807.json``), so a MATH-500 problem has
the same id tail in both benchmarks.

Scoring: the content of the response's last ``\\boxed{...}`` (balanced braces; ``\\fbox`` and the
``\\boxed 5`` form too) is compared with the reference by :func:`is_equiv`, a port of the
``is_equiv``/``strip_string`` normalisation of Hendrycks et al. (``hendrycks/math``, MIT licence):
line breaks, ``\\!`` and spaces dropped; ``\\\\``→``\\``; ``tfrac``/``dfrac``→``frac``; ``\\left``/``\\right``,
``^\\circ``, ``\\$`` and ``\\%`` removed; units after ``\\text{ `` cut; ``.5``→``0.5``; a short ``x =``
prefix dropped; ``\\sqrt3``→``\\sqrt{3}``; ``\\frac12``→``\\frac{1}{2}``; ``0.5``→``\\frac{1}{2}``;
``a/b``→``\\frac{a}{b}``. Documented extras, applied on both sides: surrounding ``$`` and a trailing
full stop stripped; ``\\mbox{ `` treated like ``\\text{ ``; remaining ``\\text``/``\\textbf``/``\\mbox``/
``\\mathrm`` wrappers unwrapped; a bare ``%`` removed like ``\\%``; thousands commas (``1,000``) dropped
in plain numbers; and two answers that are both simple numbers (integers, decimals, ``\\frac{p}{q}`` or
``p/q`` with integer ``p, q``) compare as exact fractions, so ``0.25`` equals ``\\frac14`` but ``0.333``
does not equal ``\\frac13``.

    >>> is_equiv("\\\\dfrac{1}{2}", "0.5")
    True
"""

from __future__ import annotations

import json
import re
from fractions import Fraction
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

SUBJECTS: tuple[str, ...] = (
    "algebra",
    "counting_and_probability",
    "geometry",
    "intermediate_algebra",
    "number_theory",
    "prealgebra",
    "precalculus",
)
SPLITS: dict[str, tuple[str, ...]] = {"math500": ("test",), "math": ("test", "train")}
PROMPT_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."


def build_prompt(problem: str) -> str:
    """The zero-shot user message."""
    return problem.strip() + PROMPT_SUFFIX


# ------------------------------------------------------------------------------------------ extraction


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{..}`` / ``\\fbox{..}`` / ``\\boxed X`` in ``text``, or None."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = start + (len("\\boxed") if text.startswith("\\boxed", start) else len("\\fbox"))
    if text.startswith(" ", i):  # "\boxed 5$": up to the closing dollar or the end of the line
        return re.split(r"[$\n]", text[i + 1 :], maxsplit=1)[0].strip()
    if not text.startswith("{", i):
        return None
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None  # unbalanced: a truncated response


# ----------------------------------------------------------------------- Hendrycks normalisation port


class _Malformed(ValueError):
    """Raised where the original code's asserts would fail; :func:`is_equiv` then compares raw strings."""


def _fix_fracs(s: str) -> str:
    parts = s.split("\\frac")
    out = parts[0]
    for sub in parts[1:]:
        out += "\\frac"
        if sub.startswith("{"):
            out += sub
            continue
        if len(sub) < 2:
            return s
        a, b, rest = sub[0], sub[1], sub[2:]
        out += "{" + a + "}" + b + rest if b == "{" else "{" + a + "}{" + b + "}" + rest
    return out


def _fix_a_slash_b(s: str) -> str:
    parts = s.split("/")
    if len(parts) != 2:
        return s
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError:
        return s
    return f"\\frac{{{a}}}{{{b}}}" if s == f"{a}/{b}" else s


def _remove_right_units(s: str) -> str:
    for marker in ("\\text{ ", "\\mbox{ "):
        if marker in s:
            parts = s.split(marker)
            if len(parts) != 2:
                raise _Malformed(s)
            return parts[0]
    return s


def _fix_sqrt(s: str) -> str:
    parts = s.split("\\sqrt")
    out = parts[0]
    for sub in parts[1:]:
        out += "\\sqrt" + (sub if not sub or sub[0] == "{" else "{" + sub[0] + "}" + sub[1:])
    return out


def _unwrap_text(s: str) -> str:
    return re.sub(r"\\(?:text|textbf|mbox|mathrm)\{([^{}]*)\}", r"\1", s)


def strip_string(s: str) -> str:
    """Canonical form of an answer string (the Hendrycks ``_strip_string`` plus the documented extras)."""
    s = s.strip().strip("$").strip()
    s = s.removesuffix(".").strip()
    s = s.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")
    s = s.replace("\\$", "")
    s = _remove_right_units(s)
    s = _unwrap_text(s)
    s = s.replace("\\%", "").replace("%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    if len(s.split("=")) == 2 and len(s.split("=")[0]) <= 2:
        s = s.split("=")[1]
    s = _fix_sqrt(s)
    s = s.replace(" ", "")
    s = _fix_fracs(s)
    if re.fullmatch(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?", s):
        s = s.replace(",", "")
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _fix_a_slash_b(s)


def _as_fraction(s: str) -> Fraction | None:
    """A normalised answer that is a simple number, as an exact fraction; None otherwise."""
    if re.fullmatch(r"-?\d+(?:\.\d+)?", s):
        return Fraction(s)
    m = re.fullmatch(r"(-?)\\frac\{(-?\d+)\}\{(-?\d+)\}", s)
    if m and int(m.group(3)) != 0:
        value = Fraction(int(m.group(2)), int(m.group(3)))
        return -value if m.group(1) else value
    return None


def is_equiv(a: str | None, b: str | None) -> bool:
    """Whether two final answers are equal after :func:`strip_string` (exact for simple numbers)."""
    if a is None or b is None:
        return False
    try:
        sa, sb = strip_string(a), strip_string(b)
    except _Malformed:
        return a == b
    if sa == sb:
        return True
    fa, fb = _as_fraction(sa), _as_fraction(sb)
    return fa is not None and fa == fb


def score(meta: dict, response: str) -> bool:
    """True iff the last ``\\boxed{}`` of the response is equivalent to ``meta["answer"]``."""
    return is_equiv(last_boxed(response), meta["answer"])


# ----------------------------------------------------------------------------------------------- loaders


def _sample(task: str, unique_id: str, problem: str, answer: str | None, solution: str, **extra) -> BenchSample:
    meta = {"answer": answer, "unique_id": unique_id, **extra}
    return BenchSample(task, f"{task}/{unique_id}", build_prompt(problem), meta, solution)


def load_math500(data_dir: Path | None, split: str = "test", limit: int | None = None) -> list[BenchSample]:
    """MATH-500 in file order; ``meta`` holds answer, subject, level, unique_id."""
    check_split("math500", split, SPLITS["math500"])
    check_limit(limit)
    path = Path(data_dir, "math", "math500", "test.jsonl") if data_dir is not None else None
    if path is not None and path.is_file():
        rows = read_jsonl(path)
    elif datasets_available():
        rows = hf_rows("HuggingFaceH4/MATH-500", None, "test", lambda why: missing_data(
            "math500", expected_path(data_dir, "math", "math500", "test.jsonl"), why))
    else:
        raise missing_data("math500", expected_path(data_dir, "math", "math500", "test.jsonl"))
    rows = rows if limit is None else rows[:limit]
    return [
        _sample(
            "math500", r["unique_id"], r["problem"], r["answer"], r["solution"], subject=r["subject"], level=r["level"]
        )
        for r in rows
    ]


def _math_sample(uid: str, r: dict) -> BenchSample:
    """A full-MATH record (release file or hub row: the same fields) as a sample; the answer is its last box."""
    return _sample(
        "math", uid, r["problem"], last_boxed(r["solution"]), r["solution"], level=r["level"], type=r["type"]
    )


def _id_key(path: Path) -> tuple[int, str]:
    return (int(path.stem), "") if path.stem.isdigit() else (1 << 62, path.stem)


def load_math(data_dir: Path | None, split: str = "test", limit: int | None = None) -> list[BenchSample]:
    """Full MATH in (subject, numeric id) order; ``meta["answer"]`` is the solution's last ``\\boxed{}``."""
    check_split("math", split, SPLITS["math"])
    check_limit(limit)
    root = Path(data_dir, "math", "MATH", split) if data_dir is not None else None
    out: list[BenchSample] = []
    if root is not None and root.is_dir() and any(root.glob("*/*.json")):
        for subject_dir in sorted(p for p in root.iterdir() if p.is_dir()):
            for path in sorted(subject_dir.glob("*.json"), key=_id_key):
                if limit is not None and len(out) >= limit:
                    return out
                r = json.loads(path.read_text(encoding="utf-8"))
                out.append(_math_sample(f"{split}/{subject_dir.name}/{path.name}", r))
        return out
    if not datasets_available():
        raise missing_data("math", expected_path(data_dir, "math", "MATH", split, "<subject>", "<id>.json"))
    expected = expected_path(data_dir, "math", "MATH", split, "<subject>", "<id>.json")
    for subject in SUBJECTS:
        rows = hf_rows("EleutherAI/hendrycks_math", subject, split, lambda why: missing_data("math", expected, why))
        for i, r in enumerate(rows):
            if limit is not None and len(out) >= limit:
                return out
            out.append(_math_sample(f"{split}/{subject}/{i}.json", r))
    return out
