"""Synthetic instruction following: name exactly k things from a topic under verifiable constraints.

Every prompt asks for ``k`` distinct words from one topic's word list in one output *format*
(numbered list, dashed list, comma-separated line, space-separated words, JSON ``{"answer": [...]}``,
or a comma-separated line wrapped in double quotes), plus 0–2 *extra* constraints from distinct groups:
case (all upper / all lower), a word to include, a word to exclude, a final line to end with.
Incompatible pairs (case with JSON or an ending; an ending with JSON or quotes) are never drawn.

``meta["constraints"]`` holds the constraints as structured dicts; the scorer checks each one exactly
and never re-reads the prompt. The reference is canonical: the first allowed words of the topic list in
list order (the include word swapped in if needed), capitalised unless a case constraint says otherwise.

    >>> import random
    >>> prompt, reference, meta = generate(random.Random(0))
"""

from __future__ import annotations

import json
import random
import re

TASK = "synth-if"
K_RANGE = (2, 6)

TOPICS: dict[str, tuple[str, ...]] = {
    "colors": ("red", "blue", "green", "yellow", "black", "white", "pink", "brown", "purple", "gray"),
    "animals": ("cat", "dog", "horse", "cow", "pig", "sheep", "goat", "lion", "tiger", "bear", "wolf", "fox"),
    "fruits": ("apple", "banana", "pear", "grape", "lemon", "mango", "peach", "plum", "cherry", "melon"),
    "vegetables": ("carrot", "potato", "onion", "tomato", "pea", "bean", "cabbage", "pepper", "corn", "garlic"),
    "birds": ("eagle", "owl", "duck", "goose", "parrot", "crow", "robin", "swan", "hawk", "pigeon"),
    "tools": ("hammer", "saw", "drill", "wrench", "knife", "shovel", "rake", "axe", "ruler", "needle"),
    "sports": ("tennis", "golf", "soccer", "hockey", "boxing", "rugby", "cricket", "baseball", "skiing"),
    "instruments": ("piano", "guitar", "violin", "drum", "flute", "harp", "trumpet", "cello", "banjo", "organ"),
    "drinks": ("water", "milk", "tea", "coffee", "juice", "soda", "cocoa", "lemonade"),
    "vehicles": ("car", "bus", "train", "bike", "truck", "boat", "plane", "ship", "taxi", "van"),
    "jobs": ("teacher", "doctor", "farmer", "baker", "nurse", "pilot", "driver", "cook", "judge", "painter"),
    "metals": ("iron", "gold", "silver", "copper", "tin", "lead", "zinc", "nickel"),
}
FORMATS = ("numbered", "dashed", "comma", "words", "json", "quotes")
ENDINGS = ("That is all.", "The end.", "Done.", "Thank you.", "I hope this helps.")

_LEADS = ("List", "Name", "Give")
_FORMAT_TEXT = {
    "numbered": ("{lead} {k} {topic} as a numbered list.", "{lead} {k} {topic}, one per line, numbered."),
    "dashed": ("{lead} {k} {topic} as a list with dashes.", "{lead} {k} {topic}, one per line, each after a dash."),
    "comma": ("{lead} {k} {topic} on one line, separated by commas.",),
    "words": (
        "Answer with exactly {k} words, all of them {topic}, separated by spaces.",
        "Write exactly {k} {topic} on one line, separated by spaces.",
    ),
    "json": ('{lead} {k} {topic} as JSON in the form {{"answer": [...]}}.',),
    "quotes": ("{lead} {k} {topic}, separated by commas, and wrap the whole answer in double quotes.",),
}
_EXTRA_TEXT = {
    "upper": ("Use only capital letters.", "Write in all caps."),
    "lower": ("Use only lowercase letters.", "Do not use capital letters."),
    "include": ("Include {w}.", "Make sure {w} is one of them."),
    "exclude": ("Do not include {w}.", "Leave out {w}."),
    "end": ("End with the line: {p}", "Finish with the line: {p}"),
}
_GROUPS = ("case", "include", "exclude", "end")

_NUMBERED_RE = re.compile(r"(\d+)\. (\S.*)")
_DASHED_RE = re.compile(r"- (\S.*)")


def _compatible(fmt: str, groups: tuple[str, ...]) -> bool:
    if "case" in groups and ("end" in groups or fmt == "json"):
        return False
    return not ("end" in groups and fmt in ("json", "quotes"))


def render_items(items: list[str], fmt: str) -> str:
    """Lay out ``items`` in one of :data:`FORMATS` (the inverse of :func:`parse_items`)."""
    if fmt == "numbered":
        return "\n".join(f"{i}. {w}" for i, w in enumerate(items, 1))
    if fmt == "dashed":
        return "\n".join(f"- {w}" for w in items)
    if fmt == "comma":
        return ", ".join(items)
    if fmt == "words":
        return " ".join(items)
    if fmt == "json":
        return json.dumps({"answer": items})
    if fmt == "quotes":
        return '"' + ", ".join(items) + '"'
    raise ValueError(f"unknown format {fmt!r}; expected one of {FORMATS}")


def parse_items(body: str, fmt: str) -> list[str] | None:
    """The items of ``body`` if it is laid out exactly in ``fmt`` (nothing else in it), else ``None``."""
    if fmt in ("numbered", "dashed"):
        items = []
        for i, line in enumerate(body.split("\n"), 1):
            m = (_NUMBERED_RE if fmt == "numbered" else _DASHED_RE).fullmatch(line.rstrip())
            if m is None or (fmt == "numbered" and int(m.group(1)) != i):
                return None
            items.append(m.group(m.lastindex).strip())
        return items
    if fmt == "json":
        try:
            obj = json.loads(body)
        except ValueError:
            return None
        if not (isinstance(obj, dict) and list(obj) == ["answer"] and isinstance(obj["answer"], list)):
            return None
        items = obj["answer"]
        return items if all(isinstance(w, str) for w in items) else None
    if fmt == "quotes":
        if len(body) < 2 or body[0] != '"' or body[-1] != '"':
            return None
        body = body[1:-1]
        fmt = "comma"
    if "\n" in body or not body.strip():
        return None
    if fmt == "comma":
        return [w.strip() for w in body.split(",")]
    if fmt == "words":
        return body.split()
    raise ValueError(f"unknown format {fmt!r}; expected one of {FORMATS}")


def _reference(vocab: tuple[str, ...], k: int, fmt: str, extras: dict[str, str]) -> str:
    allowed = [w for w in vocab if w != extras.get("exclude")]
    chosen = allowed[:k]
    include = extras.get("include")
    if include is not None and include not in chosen:
        chosen = chosen[: k - 1] + [include]
    chosen.sort(key=vocab.index)
    case = extras.get("case")
    items = [w.upper() if case == "upper" else w if case == "lower" else w.capitalize() for w in chosen]
    text = render_items(items, fmt)
    return text + "\n" + extras["end"] if "end" in extras else text


def generate(rng: random.Random) -> tuple[str, str, dict]:
    """Draw one prompt: ``(prompt, reference, meta)`` with ``meta = {"constraints": [...]}``."""
    topic = rng.choice(sorted(TOPICS))
    vocab = TOPICS[topic]
    k = rng.randint(*K_RANGE)
    while True:
        fmt = rng.choice(FORMATS)
        groups = tuple(sorted(rng.sample(_GROUPS, rng.choice((0, 1, 1, 2)))))
        if _compatible(fmt, groups):
            break

    extras: dict[str, str] = {}
    sentences = [rng.choice(_FORMAT_TEXT[fmt]).format(lead=rng.choice(_LEADS), k=k, topic=topic)]
    constraints: list[dict] = [
        {"type": "count", "k": k, "topic": topic, "vocab": list(vocab)},
        {"type": "format", "format": fmt},
    ]
    words = rng.sample(vocab, 2)  # distinct include / exclude words
    for group in groups:
        if group == "case":
            case = rng.choice(("upper", "lower"))
            extras["case"] = case
            sentences.append(rng.choice(_EXTRA_TEXT[case]))
            constraints.append({"type": "case", "case": case})
        elif group in ("include", "exclude"):
            w = words[0] if group == "include" else words[1]
            extras[group] = w
            sentences.append(rng.choice(_EXTRA_TEXT[group]).format(w=w))
            constraints.append({"type": group, "word": w})
        else:
            p = rng.choice(ENDINGS)
            extras["end"] = p
            sentences.append(rng.choice(_EXTRA_TEXT["end"]).format(p=p))
            constraints.append({"type": "end", "phrase": p})
    return " ".join(sentences), _reference(vocab, k, fmt, extras), {"constraints": constraints}


def check(meta: dict, response: str) -> dict[str, bool]:
    """Per-constraint verdicts, keyed by constraint type."""
    cons = {c["type"]: c for c in meta["constraints"]}
    verdict: dict[str, bool] = {}
    body = response.strip()
    if "end" in cons:
        phrase = cons["end"]["phrase"]
        verdict["end"] = body.endswith(phrase) and (body == phrase or body[: -len(phrase)].endswith("\n"))
        body = body[: -len(phrase)].rstrip() if verdict["end"] else body
    items = parse_items(body, cons["format"]["format"])
    verdict["format"] = items is not None
    folded = [w.lower() for w in items or []]
    count = cons["count"]
    verdict["count"] = (
        items is not None
        and len(folded) == count["k"]
        and len(set(folded)) == len(folded)
        and all(w in count["vocab"] for w in folded)
    )
    if "case" in cons:
        text = response.strip()
        want = text.upper() if cons["case"]["case"] == "upper" else text.lower()
        verdict["case"] = text == want
    if "include" in cons:
        verdict["include"] = cons["include"]["word"] in folded
    if "exclude" in cons:
        verdict["exclude"] = items is not None and cons["exclude"]["word"] not in folded
    return verdict


def score(meta: dict, response: str) -> bool:
    """Pass iff every constraint holds."""
    return all(check(meta, response).values())
