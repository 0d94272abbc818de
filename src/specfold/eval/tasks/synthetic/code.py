"""Synthetic code: a one-sentence spec of a small Python function; hidden asserts decide pass/fail.

Each template fixes the function's behaviour; a draw varies the opening phrase, the function name, the
argument name and the constants (``k``, a letter ``c``), so the body depends on the spec text. The
reference is the two-line function ``def name(arg):\\n    return ...``. ``meta`` holds the entry point
and the hidden tests (``assert name(...) == ...`` lines, expected values computed here in Python).

Scoring runs ``program + tests`` in :mod:`specfold.eval.sandbox` (a separate process, with a timeout);
the response passes only when every assert passes.

    >>> import random
    >>> prompt, reference, meta = generate(random.Random(0))
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Callable
from dataclasses import dataclass

from specfold.eval.sandbox import run_program

TASK = "synth-code"
N_TESTS = 4
SCORE_TIMEOUT_S = 5.0

_OPENERS = (
    "Write a function {sig} that returns {desc}.",
    "Write a Python function {sig} that returns {desc}.",
    "Define {sig} so that it returns {desc}.",
    "Implement {sig}: it should return {desc}.",
)
_GENERIC_NAMES = ("f", "g", "solve", "compute", "func", "helper", "calc", "process", "transform", "answer")
_ARG_NAMES = {
    "int": ("x", "n", "a", "num", "value"),
    "list": ("xs", "nums", "items", "values", "lst", "numbers"),
    "str": ("s", "text", "word", "w"),
    "pair": (("a", "b"), ("x", "y"), ("m", "n"), ("p", "q")),
}
_LETTERS = "abcde"  # letters for the char templates; test strings use the same ones so counts are non-zero


@dataclass(frozen=True)
class _Template:
    """One function family. ``descs``/``body`` use ``{x}`` (the argument or the first of a pair),
    ``{y}`` (second of a pair), ``{k}`` (an integer constant) and ``{c}`` (a letter)."""

    key: str
    kind: str  # "int" | "list" | "str" | "pair"
    names: tuple[str, ...]
    descs: tuple[str, ...]
    body: str
    impl: Callable[..., object]  # impl(args: tuple, k: int, c: str) -> expected value
    k_range: tuple[int, int] = (1, 9)
    nonempty: bool = False  # list/str inputs must be non-empty
    edge: str = ""  # one input is "k": equal to / contains k; "mult": a multiple of k; "c": starts with c


_T = _Template
# fmt: off
_TEMPLATES: tuple[_Template, ...] = (
    _T("add", "int", ("add_k", "plus", "increase", "shift_up"), ("{x} plus {k}", "{k} more than {x}"),
       "return {x} + {k}", lambda a, k, c: a[0] + k, (1, 20)),
    _T("sub", "int", ("subtract", "minus", "decrease", "shift_down"), ("{x} minus {k}", "{k} less than {x}"),
       "return {x} - {k}", lambda a, k, c: a[0] - k, (1, 20)),
    _T("mul", "int", ("multiply", "times", "scale"), ("{x} times {k}", "{x} multiplied by {k}"),
       "return {x} * {k}", lambda a, k, c: a[0] * k, (2, 12)),
    _T("mod", "int", ("remainder", "mod_k"), ("the remainder of {x} divided by {k}",),
       "return {x} % {k}", lambda a, k, c: a[0] % k, (2, 9)),
    _T("divisible", "int", ("is_divisible", "divides"), ("True if {x} is divisible by {k}, else False",),
       "return {x} % {k} == 0", lambda a, k, c: a[0] % k == 0, (2, 9), edge="mult"),
    _T("greater", "int", ("is_big", "above", "is_greater"), ("True if {x} is greater than {k}, else False",),
       "return {x} > {k}", lambda a, k, c: a[0] > k, (1, 30), edge="k"),
    _T("less", "int", ("is_small", "below", "is_less"), ("True if {x} is less than {k}, else False",),
       "return {x} < {k}", lambda a, k, c: a[0] < k, (1, 30), edge="k"),
    _T("max", "list", ("largest", "biggest", "max_item"), ("the largest item of the list {x}",),
       "return max({x})", lambda a, k, c: max(a[0]), nonempty=True),
    _T("min", "list", ("smallest", "min_item", "lowest"), ("the smallest item of the list {x}",),
       "return min({x})", lambda a, k, c: min(a[0]), nonempty=True),
    _T("sum", "list", ("total", "sum_items", "add_all"), ("the sum of the items of the list {x}",),
       "return sum({x})", lambda a, k, c: sum(a[0])),
    _T("len", "list", ("size", "count_items", "length"), ("the number of items in the list {x}",),
       "return len({x})", lambda a, k, c: len(a[0])),
    _T("count_gt", "list", ("count_big", "count_above", "how_many"),
       ("how many items of the list {x} are greater than {k}",),
       "return len([v for v in {x} if v > {k}])", lambda a, k, c: len([v for v in a[0] if v > k]), (1, 15),
       edge="k"),
    _T("count_lt", "list", ("count_small", "count_below", "how_many"),
       ("how many items of the list {x} are less than {k}",),
       "return len([v for v in {x} if v < {k}])", lambda a, k, c: len([v for v in a[0] if v < k]), (1, 15),
       edge="k"),
    _T("filter_gt", "list", ("keep_big", "above", "filter_items"),
       ("a list of the items of {x} that are greater than {k}",),
       "return [v for v in {x} if v > {k}]", lambda a, k, c: [v for v in a[0] if v > k], (1, 15), edge="k"),
    _T("evens", "list", ("evens", "keep_even", "filter_items"), ("a list of the even items of {x}",),
       "return [v for v in {x} if v % 2 == 0]", lambda a, k, c: [v for v in a[0] if v % 2 == 0]),
    _T("add_each", "list", ("add_each", "shift_all", "increase_all"),
       ("a list with {k} added to each item of {x}",),
       "return [v + {k} for v in {x}]", lambda a, k, c: [v + k for v in a[0]], (1, 20)),
    _T("mul_each", "list", ("scale_all", "multiply_all", "times_all"),
       ("a list with each item of {x} multiplied by {k}",),
       "return [v * {k} for v in {x}]", lambda a, k, c: [v * k for v in a[0]], (2, 9)),
    _T("first_n", "list", ("head", "first_items", "take"), ("the first {k} items of the list {x}",),
       "return {x}[:{k}]", lambda a, k, c: a[0][:k], (1, 5)),
    _T("last_n", "list", ("tail", "last_items", "take_last"), ("the last {k} items of the list {x}",),
       "return {x}[-{k}:]", lambda a, k, c: a[0][-k:], (1, 5)),
    _T("reverse", "str", ("reverse", "backwards", "flip"), ("the string {x} reversed",),
       "return {x}[::-1]", lambda a, k, c: a[0][::-1]),
    _T("upper", "str", ("shout", "to_upper", "caps"), ("the string {x} in upper case",),
       "return {x}.upper()", lambda a, k, c: a[0].upper()),
    _T("repeat", "str", ("repeat", "echo", "copies"), ("the string {x} repeated {k} times",),
       "return {x} * {k}", lambda a, k, c: a[0] * k, (2, 5)),
    _T("count_char", "str", ("count_letter", "letter_count", "how_many"),
       ("how many times the letter {c} appears in the string {x}",),
       "return {x}.count('{c}')", lambda a, k, c: a[0].count(c), edge="c"),
    _T("starts", "str", ("starts_with", "begins", "check_start"),
       ("True if the string {x} starts with the letter {c}, else False",),
       "return {x}.startswith('{c}')", lambda a, k, c: a[0].startswith(c), edge="c"),
    _T("add2", "pair", ("add", "plus", "total"), ("the sum of {x} and {y}",),
       "return {x} + {y}", lambda a, k, c: a[0] + a[1]),
    _T("max2", "pair", ("larger", "bigger", "max_of"), ("the larger of {x} and {y}",),
       "return max({x}, {y})", lambda a, k, c: max(a[0], a[1])),
    _T("mul2", "pair", ("product", "multiply", "times"), ("the product of {x} and {y}",),
       "return {x} * {y}", lambda a, k, c: a[0] * a[1]),
    _T("diff2", "pair", ("difference", "minus", "subtract"), ("{x} minus {y}",),
       "return {x} - {y}", lambda a, k, c: a[0] - a[1]),
)
# fmt: on
TEMPLATE_KEYS: tuple[str, ...] = tuple(t.key for t in _TEMPLATES)


def _random_input(rng: random.Random, t: _Template, k: int, c: str, edge: bool) -> tuple:
    """One argument tuple for a hidden test; ``edge`` forces the case that separates near-miss bodies."""
    if t.kind == "int":
        if edge and t.edge == "k":
            return (k,)
        if edge and t.edge == "mult":
            return (k * rng.randint(0, 9),)
        return (rng.randint(0, 50),)
    if t.kind == "pair":
        return (rng.randint(0, 30), rng.randint(0, 30))
    if t.kind == "list":
        n = rng.randint(1 if t.nonempty else 0, 6)
        xs = [rng.randint(0, 20) for _ in range(n)]
        if edge:
            xs = xs + [rng.randint(0, 20)] if not xs else xs
            if t.edge == "k":
                xs[rng.randrange(len(xs))] = k
        return (xs,)
    alphabet = _LETTERS if t.key in ("count_char", "starts") else string.ascii_lowercase
    n = rng.randint(1 if t.nonempty or edge else 0, 6)
    text = "".join(rng.choice(alphabet) for _ in range(n))
    return (c + text[1:] if edge and t.edge == "c" else text,)


def generate(rng: random.Random) -> tuple[str, str, dict]:
    """Draw one function spec: ``(prompt, reference, meta)``; meta has ``entry_point``, ``tests``, ``template``."""
    t = rng.choice(_TEMPLATES)
    name = rng.choice(_GENERIC_NAMES) if rng.random() < 0.4 else rng.choice(t.names)
    arg = rng.choice(_ARG_NAMES[t.kind])
    x, y = arg if t.kind == "pair" else (arg, "")
    k = rng.randint(*t.k_range)
    c = rng.choice(_LETTERS)
    fields = {"x": x, "y": y, "k": k, "c": c}
    params = f"{x}, {y}" if t.kind == "pair" else x
    sig = f"{name}({params})"
    prompt = rng.choice(_OPENERS).format(sig=sig, desc=rng.choice(t.descs).format(**fields))
    reference = f"def {sig}:\n    " + t.body.format(**fields)

    tests: list[str] = []
    seen: set[str] = set()
    while len(tests) < N_TESTS:
        args = _random_input(rng, t, k, c, edge=not tests)
        call = f"{name}({', '.join(repr(a) for a in args)})"
        if call in seen:
            continue
        seen.add(call)
        tests.append(f"assert {call} == {t.impl(args, k, c)!r}")
    return prompt, reference, {"entry_point": name, "tests": tests, "template": t.key}


_FENCE_RE = re.compile(r"```[a-zA-Z0-9_+-]*\n(.*?)```", re.DOTALL)


def extract_code(response: str) -> str:
    """The program in a response: the first fenced block if there is one, else the whole text."""
    m = _FENCE_RE.search(response)
    return m.group(1) if m else response


def score(meta: dict, response: str, timeout_s: float = SCORE_TIMEOUT_S) -> bool:
    """Pass iff every hidden assert passes when run after the response in the sandbox."""
    result = run_program(extract_code(response), "\n".join(meta["tests"]), timeout_s=timeout_s)
    return result.passed
