"""Synthetic math: 2–3 step arithmetic word problems with a worked, line-per-step solution.

A problem is a templated story about one subject (a person or a place) and one kind of item: a start
sentence, one or two events, and a question. Each arithmetic step is one reference line ``a+b=c``,
``a-b=c`` or ``a*b=c``; the last line is ``Answer: N``. All operands and intermediate values are small
non-negative integers (≤ ``MAX_VALUE``; products use one-digit factors) so a tiny model can learn them.

Scoring is exact: the integer after the last ``Answer:`` must equal ``meta["answer"]``.

    >>> import random
    >>> prompt, reference, meta = generate(random.Random(0))
"""

from __future__ import annotations

import random
import re

TASK = "synth-math"
MAX_VALUE = 99  # every intermediate value and the answer stay in [0, MAX_VALUE]
MAX_ADDEND = 30
MIN_STEPS, MAX_STEPS = 2, 3
MAX_PROMPT_CHARS = 130  # keeps prompts ≤ ~40 tokens; longer draws are redrawn

# fmt: off
# (name used at sentence start, name used mid-sentence, subject pronoun, object pronoun)
_PEOPLE = (
    ("Tom", "Tom", "he", "him"), ("Mia", "Mia", "she", "her"), ("Sam", "Sam", "he", "him"),
    ("Ann", "Ann", "she", "her"), ("Ben", "Ben", "he", "him"), ("Lily", "Lily", "she", "her"),
    ("Max", "Max", "he", "him"), ("Emma", "Emma", "she", "her"), ("Leo", "Leo", "he", "him"),
    ("Zoe", "Zoe", "she", "her"), ("Jack", "Jack", "he", "him"), ("Kate", "Kate", "she", "her"),
    ("Noah", "Noah", "he", "him"), ("Lucy", "Lucy", "she", "her"), ("Paul", "Paul", "he", "him"),
    ("Rosa", "Rosa", "she", "her"),
)
_PLACES = (
    ("The shop", "the shop", "it", "it"), ("The school", "the school", "it", "it"),
    ("The farm", "the farm", "it", "it"), ("The club", "the club", "it", "it"),
)
_ITEMS = (
    "apples", "pens", "books", "cards", "coins", "stamps", "marbles", "cookies",
    "stickers", "shells", "eggs", "balls", "toys", "flowers", "candies", "rocks",
)
# fmt: on
_CONTAINERS = ("boxes", "bags", "packs", "jars")
_ADD = (
    "{p} buys {b} more {items}.",
    "{p} finds {b} more {items}.",
    "{p} gets {b} more {items}.",
    "{p} makes {b} more {items}.",
    "A friend gives {o} {b} more {items}.",
)
_SUB = (
    "{p} gives away {b} {items}.",
    "{p} loses {b} {items}.",
    "{p} sells {b} {items}.",
    "{p} uses {b} {items}.",
)
_PACK = "{p} buys {c} {box} with {d} {items} in each."
_TIMES = {2: "The number of {items} doubles.", 3: "The number of {items} triples."}
_QUESTIONS = ("How many {items} does {n} have now?", "How many {items} does {n} have at the end?")

_ANSWER_RE = re.compile(r"Answer:([^\n]*)")
_INT_RE = re.compile(r"-?\d+")


def _cap(s: str) -> str:
    return s[0].upper() + s[1:]


def _try_generate(rng: random.Random) -> tuple[str, str, dict] | None:
    """One attempt; ``None`` when a value leaves ``[0, MAX_VALUE]`` or the prompt is too long."""
    start_name, mid_name, pron, obj = rng.choice(_PEOPLE + _PLACES) if rng.random() < 0.25 else rng.choice(_PEOPLE)
    items = rng.choice(_ITEMS)
    n_steps = rng.randint(MIN_STEPS, MAX_STEPS)
    sentences: list[str] = []
    lines: list[str] = []

    if rng.random() < 0.4:
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        value = a * b
        sentences.append(f"{start_name} has {a} {rng.choice(_CONTAINERS)} with {b} {items} in each.")
        lines.append(f"{a}*{b}={value}")
    else:
        value = rng.randint(2, MAX_ADDEND)
        sentences.append(f"{start_name} has {value} {items}.")

    first_event = True
    while len(lines) < n_steps:
        kinds = ["add", "sub", "times"] + (["pack"] if n_steps - len(lines) >= 2 else [])
        kind = rng.choice(kinds)
        fields = {"p": pron, "o": obj, "items": items}
        if kind == "add":
            b = rng.randint(2, MAX_ADDEND)
            new = value + b
            text = rng.choice(_ADD).format(b=b, **fields)
            lines.append(f"{value}+{b}={new}")
        elif kind == "sub":
            if value < 2:
                return None
            b = rng.randint(1, min(value, MAX_ADDEND))
            new = value - b
            text = rng.choice(_SUB).format(b=b, **fields)
            lines.append(f"{value}-{b}={new}")
        elif kind == "times":
            k = rng.choice((2, 3))
            new = value * k
            text = _TIMES[k].format(**fields)
            lines.append(f"{value}*{k}={new}")
        else:
            c, d = rng.randint(2, 9), rng.randint(2, 9)
            product = c * d
            new = value + product
            text = _PACK.format(c=c, d=d, box=rng.choice(_CONTAINERS), **fields)
            lines.append(f"{c}*{d}={product}")
            lines.append(f"{value}+{product}={new}")
        if new > MAX_VALUE:
            return None
        if not first_event and rng.random() < 0.5:
            text = "Then " + text[0].lower() + text[1:]
        sentences.append(_cap(text))
        value = new
        first_event = False

    sentences.append(rng.choice(_QUESTIONS).format(items=items, n=mid_name))
    prompt = " ".join(sentences)
    if len(prompt) > MAX_PROMPT_CHARS:
        return None
    lines.append(f"Answer: {value}")
    return prompt, "\n".join(lines), {"answer": value}


def generate(rng: random.Random) -> tuple[str, str, dict]:
    """Draw one problem: ``(prompt, reference, meta)`` with ``meta = {"answer": int}``."""
    while True:
        out = _try_generate(rng)
        if out is not None:
            return out


def extract_answer(response: str) -> int | None:
    """The integer on the line of the last ``Answer:`` (a trailing period is allowed), else ``None``."""
    matches = _ANSWER_RE.findall(response)
    if not matches:
        return None
    text = matches[-1].strip().removesuffix(".").strip()
    if not _INT_RE.fullmatch(text):
        return None
    return int(text)


def score(meta: dict, response: str) -> bool:
    """Exact match of the final answer."""
    answer = extract_answer(response)
    return answer is not None and answer == meta["answer"]
