"""IFEval (Zhou et al. 2023): verifiable instructions, scored by strict prompt-level accuracy.

Release file: ``DIR/ifeval/input_data.jsonl`` (key, prompt, instruction_id_list, kwargs); fallback hub
``google/IFEval``. The prompt is used as is.

The checkers are a port of the 25 instruction ids of the release, following the maintained copy in
lm-evaluation-harness 0.4.13 (``lm_eval/tasks/ifeval/instructions.py``, Apache-2.0, from Google's
``instruction_following_eval``). lm-eval itself is not used: importing its ifeval module imports the
whole task manager (``datasets``, ``evaluate``, scikit-learn, ...) and downloads NLTK's ``punkt_tab`` at
import, which an offline machine cannot do. Differences from lm-eval, all in tokenisation:

* ``length_constraints:number_sentences`` counts sentences with the release's own regex splitter
  (``split_into_sentences``) instead of NLTK's Punkt model; they can differ on abbreviations.
* ``change_case:capital_word_frequency`` tokenises words with ``\\w+(?:[-'.]\\w+)*`` instead of
  ``nltk.word_tokenize`` (which splits ``DON'T`` into two upper-case tokens; here it is one).
* ``language:response_language``, ``change_case:english_capital`` and ``change_case:english_lowercase``
  need ``langdetect`` (optional; seeded to 0 for deterministic answers). Without it these ids are
  reported by :func:`unsupported_instructions` and count as not followed.

* ``keywords:letter_frequency`` counts the given character literally. lm-eval swaps a non-letter
  (``!`` in key 1129, ``#`` in one other prompt) for a *random* letter, so its verdict on those two
  prompts changes from run to run; the instruction clearly means the character given.

Cross-check: with the two tokenisers above substituted into lm-eval's code, the checkers agree with
lm-eval 0.4.13 on all 16,680 instruction checks of 20 synthetic responses per release prompt, except
the random-letter cases.

As in the reference, kwargs with a falsy value are dropped, an empty response follows nothing, and an
id with no checker counts as not followed (listed by :func:`unknown_instructions`). A prompt is correct
(strict) iff every instruction is followed.
"""

from __future__ import annotations

import collections
import functools
import importlib.util
import json
import re
from collections.abc import Callable
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

NAME = "ifeval"
SPLITS: tuple[str, ...] = ("test",)
_LANGDETECT_IDS = ("language:response_language", "change_case:english_capital", "change_case:english_lowercase")


# ---------------------------------------------------------------------------------------------- helpers


@functools.cache
def _langdetect():
    import langdetect  # optional dependency

    langdetect.DetectorFactory.seed = 0  # detection samples randomly; a fixed seed makes scores reproducible
    return langdetect


def _detect_language(text: str) -> str | None:
    """ISO code of ``text``'s language; None when langdetect finds no features (the reference then passes)."""
    ld = _langdetect()
    try:
        return ld.detect(text)
    except ld.LangDetectException:
        return None


def _compare(count: int, relation: str, threshold: int) -> bool:
    if relation == "less than":
        return count < threshold
    if relation == "at least":
        return count >= threshold
    raise ValueError(f"unknown relation {relation!r}")


_PREFIXES = "(Mr|St|Mrs|Ms|Dr)[.]"
_SUFFIXES = "(Inc|Ltd|Jr|Sr|Co)"
_STARTERS = (
    r"(Mr|Mrs|Ms|Dr|Prof|Capt|Cpt|Lt|He\s|She\s|It\s|They\s|Their\s|Our\s|We\s"
    r"|But\s|However\s|That\s|This\s|Wherever)"
)
_ACRONYMS = "([A-Z][.][A-Z][.](?:[A-Z][.])?)"
_WEBSITES = "[.](com|net|org|io|gov|edu|me)"
_ALPHA = "([A-Za-z])"
_DIGITS = "([0-9])"


def split_into_sentences(text: str) -> list[str]:
    """The release's rule-based sentence splitter (``instructions_util.split_into_sentences``)."""
    text = " " + text + "  "
    text = text.replace("\n", " ")
    text = re.sub(_PREFIXES, "\\1<prd>", text)
    text = re.sub(_WEBSITES, "<prd>\\1", text)
    text = re.sub(_DIGITS + "[.]" + _DIGITS, "\\1<prd>\\2", text)
    text = re.sub(r"\.{2,}", lambda m: "<prd>" * len(m.group(0)) + "<stop>", text)
    text = text.replace("Ph.D.", "Ph<prd>D<prd>")
    text = re.sub(r"\s" + _ALPHA + "[.] ", " \\1<prd> ", text)
    text = re.sub(_ACRONYMS + " " + _STARTERS, "\\1<stop> \\2", text)
    text = re.sub(_ALPHA + "[.]" + _ALPHA + "[.]" + _ALPHA + "[.]", "\\1<prd>\\2<prd>\\3<prd>", text)
    text = re.sub(_ALPHA + "[.]" + _ALPHA + "[.]", "\\1<prd>\\2<prd>", text)
    text = re.sub(" " + _SUFFIXES + "[.] " + _STARTERS, " \\1<stop> \\2", text)
    text = re.sub(" " + _SUFFIXES + "[.]", " \\1<prd>", text)
    text = re.sub(" " + _ALPHA + "[.]", " \\1<prd>", text)
    text = text.replace(".\u201d", "\u201d.").replace('."', '".').replace('!"', '"!').replace('?"', '"?')
    text = text.replace(".", ".<stop>").replace("?", "?<stop>").replace("!", "!<stop>")
    text = text.replace("<prd>", ".")
    sentences = [s.strip() for s in text.split("<stop>")]
    if sentences and not sentences[-1]:
        sentences = sentences[:-1]
    return sentences


def count_words(text: str) -> int:
    """Words as NLTK's ``RegexpTokenizer(r"\\w+")`` counts them (identical)."""
    return len(re.findall(r"\w+", text))


# --------------------------------------------------------------------------------------------- checkers
# Each checker: (response, kwargs, prompt) -> followed. ``response`` is non-empty.


def _keywords_existence(r: str, kw: dict, _p: str) -> bool:
    return all(re.search(k, r, flags=re.IGNORECASE) for k in sorted(kw["keywords"]))


def _keywords_frequency(r: str, kw: dict, _p: str) -> bool:
    n = len(re.findall(kw["keyword"].strip(), r, flags=re.IGNORECASE))
    return _compare(n, kw["relation"], kw["frequency"])


def _forbidden_words(r: str, kw: dict, _p: str) -> bool:
    return not any(re.search(r"\b" + w + r"\b", r, flags=re.IGNORECASE) for w in set(kw["forbidden_words"]))


def _letter_frequency(r: str, kw: dict, _p: str) -> bool:
    n = collections.Counter(r.lower())[kw["letter"].strip().lower()]
    return _compare(n, kw["let_relation"], kw["let_frequency"])


def _response_language(r: str, kw: dict, _p: str) -> bool:
    lang = _detect_language(r)
    return lang is None or lang == kw["language"]


def _number_sentences(r: str, kw: dict, _p: str) -> bool:
    return _compare(len(split_into_sentences(r)), kw["relation"], kw["num_sentences"])


def _number_paragraphs(r: str, kw: dict, _p: str) -> bool:
    paragraphs = re.split(r"\s?\*\*\*\s?", r)
    n = len(paragraphs)
    for i, paragraph in enumerate(paragraphs):
        if not paragraph.strip():
            if i in (0, len(paragraphs) - 1):
                n -= 1
            else:
                return False
    return n == kw["num_paragraphs"]


def _number_words(r: str, kw: dict, _p: str) -> bool:
    return _compare(count_words(r), kw["relation"], kw["num_words"])


def _nth_paragraph_first_word(r: str, kw: dict, _p: str) -> bool:
    paragraphs = re.split(r"\n\n", r)
    n = sum(1 for p in paragraphs if p.strip())
    nth = kw["nth_paragraph"]
    if nth > n:
        return False
    paragraph = paragraphs[nth - 1].strip()
    if not paragraph:
        return False
    word = paragraph.split()[0].strip().lstrip("'").lstrip('"')
    first = ""
    for ch in word:
        if ch in {".", ",", "?", "!", "'", '"'}:
            break
        first += ch.lower()
    return n == kw["num_paragraphs"] and first == kw["first_word"].lower()


def _number_placeholders(r: str, kw: dict, _p: str) -> bool:
    return len(re.findall(r"\[.*?\]", r)) >= kw["num_placeholders"]


def _postscript(r: str, kw: dict, _p: str) -> bool:
    marker = kw["postscript_marker"].strip()
    if marker == "P.P.S":
        pattern = r"\s*p\.\s?p\.\s?s.*$"
    elif marker == "P.S.":
        pattern = r"\s*p\.\s?s\..*$"
    else:
        pattern = r"\s*" + marker.lower() + r".*$"
    return bool(re.findall(pattern, r.lower(), flags=re.MULTILINE))


def _number_bullet_lists(r: str, kw: dict, _p: str) -> bool:
    stars = re.findall(r"^\s*\*[^\*].*$", r, flags=re.MULTILINE)
    dashes = re.findall(r"^\s*-.*$", r, flags=re.MULTILINE)
    return len(stars) + len(dashes) == kw["num_bullets"]


def _constrained_response(r: str, _kw: dict, _p: str) -> bool:
    return any(opt in r.strip() for opt in ("My answer is yes.", "My answer is no.", "My answer is maybe."))


def _number_highlighted_sections(r: str, kw: dict, _p: str) -> bool:
    n = sum(1 for h in re.findall(r"\*[^\n\*]*\*", r) if h.strip("*").strip())
    n += sum(1 for h in re.findall(r"\*\*[^\n\*]*\*\*", r) if h.removeprefix("**").removesuffix("**").strip())
    return n >= kw["num_highlights"]


def _multiple_sections(r: str, kw: dict, _p: str) -> bool:
    sections = re.split(r"\s?" + kw["section_spliter"].strip() + r"\s?\d+\s?", r)
    return len(sections) - 1 >= kw["num_sections"]


def _json_format(r: str, _kw: dict, _p: str) -> bool:
    value = r.strip()
    for prefix in ("```json", "```Json", "```JSON", "```"):
        value = value.removeprefix(prefix)
    value = value.removesuffix("```").strip()
    try:
        json.loads(value)
    except ValueError:
        return False
    return True


def _title(r: str, _kw: dict, _p: str) -> bool:
    return any(t.lstrip("<").rstrip(">").strip() for t in re.findall(r"<<[^\n]+>>", r))


def _two_responses(r: str, _kw: dict, _p: str) -> bool:
    parts = r.split("******")
    valid = []
    for i, part in enumerate(parts):
        if not part.strip():
            if i not in (0, len(parts) - 1):
                return False
        else:
            valid.append(part)
    return len(valid) == 2 and valid[0].strip() != valid[1].strip()


def _repeat_prompt(r: str, kw: dict, _p: str) -> bool:
    return r.strip().lower().startswith(kw["prompt_to_repeat"].strip().lower())


def _end_checker(r: str, kw: dict, _p: str) -> bool:
    return r.strip().strip('"').lower().endswith(kw["end_phrase"].strip().lower())


def _capital_word_frequency(r: str, kw: dict, _p: str) -> bool:
    words = re.findall(r"\w+(?:[-'.]\w+)*", r)
    return _compare(sum(1 for w in words if w.isupper()), kw["capital_relation"], kw["capital_frequency"])


def _english_capital(r: str, _kw: dict, _p: str) -> bool:
    return r.isupper() and _detect_language(r) in ("en", None)


def _english_lowercase(r: str, _kw: dict, _p: str) -> bool:
    return r.islower() and _detect_language(r) in ("en", None)


def _no_comma(r: str, _kw: dict, _p: str) -> bool:
    return "," not in r


def _quotation(r: str, _kw: dict, _p: str) -> bool:
    v = r.strip()
    return len(v) > 1 and v[0] == '"' and v[-1] == '"'


CHECKERS: dict[str, Callable[[str, dict, str], bool]] = {
    "keywords:existence": _keywords_existence,
    "keywords:frequency": _keywords_frequency,
    "keywords:forbidden_words": _forbidden_words,
    "keywords:letter_frequency": _letter_frequency,
    "language:response_language": _response_language,
    "length_constraints:number_sentences": _number_sentences,
    "length_constraints:number_paragraphs": _number_paragraphs,
    "length_constraints:number_words": _number_words,
    "length_constraints:nth_paragraph_first_word": _nth_paragraph_first_word,
    "detectable_content:number_placeholders": _number_placeholders,
    "detectable_content:postscript": _postscript,
    "detectable_format:number_bullet_lists": _number_bullet_lists,
    "detectable_format:constrained_response": _constrained_response,
    "detectable_format:number_highlighted_sections": _number_highlighted_sections,
    "detectable_format:multiple_sections": _multiple_sections,
    "detectable_format:json_format": _json_format,
    "detectable_format:title": _title,
    "combination:two_responses": _two_responses,
    "combination:repeat_prompt": _repeat_prompt,
    "startend:end_checker": _end_checker,
    "change_case:capital_word_frequency": _capital_word_frequency,
    "change_case:english_capital": _english_capital,
    "change_case:english_lowercase": _english_lowercase,
    "punctuation:no_comma": _no_comma,
    "startend:quotation": _quotation,
}


def unsupported_instructions() -> tuple[str, ...]:
    """Ids with a checker that cannot run here (``langdetect`` missing); they count as not followed."""
    return () if importlib.util.find_spec("langdetect") is not None else _LANGDETECT_IDS


def unknown_instructions(meta: dict) -> list[str]:
    """The ids of a sample that have no working checker here."""
    missing = set(unsupported_instructions())
    return [i for i in meta["instruction_id_list"] if i not in CHECKERS or i in missing]


def follow_list(meta: dict, response: str) -> list[bool]:
    """Per-instruction strict verdicts (unknown or unsupported ids are False)."""
    missing = set(unsupported_instructions())
    out = []
    for instruction_id, kwargs in zip(meta["instruction_id_list"], meta["kwargs"], strict=True):
        checker = CHECKERS.get(instruction_id)
        kw = {k: v for k, v in (kwargs or {}).items() if v}
        ok = checker is not None and instruction_id not in missing and bool(response.strip())
        out.append(ok and bool(checker(response, kw, meta.get("prompt", ""))))
    return out


def score(meta: dict, response: str) -> bool:
    """Strict prompt-level: every instruction of the prompt is followed."""
    return all(follow_list(meta, response))


def load(data_dir: Path | None, split: str = "test", limit: int | None = None) -> list[BenchSample]:
    """IFEval in file order; ``meta`` holds key, instruction_id_list, kwargs and the prompt."""
    check_split(NAME, split, SPLITS)
    check_limit(limit)
    path = Path(data_dir, NAME, "input_data.jsonl") if data_dir is not None else None
    if path is not None and path.is_file():
        rows = read_jsonl(path)
    elif datasets_available():
        rows = hf_rows("google/IFEval", None, "train",
                       lambda why: missing_data(NAME, expected_path(data_dir, NAME, "input_data.jsonl"), why))
    else:
        raise missing_data(NAME, expected_path(data_dir, NAME, "input_data.jsonl"))
    rows = rows if limit is None else rows[:limit]
    return [
        BenchSample(
            NAME,
            f"{NAME}/{split}/{r['key']}",
            r["prompt"],
            {
                "key": r["key"],
                "prompt": r["prompt"],
                "instruction_id_list": list(r["instruction_id_list"]),
                "kwargs": [dict(k) for k in r["kwargs"]],
            },
        )
        for r in rows
    ]
