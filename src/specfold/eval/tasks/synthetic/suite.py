"""The synthetic suite: the common ``Sample`` type, hash-based splits, the task registry and scoring.

Tasks: ``synth-math`` (:mod:`.math`), ``synth-code`` (:mod:`.code`), ``synth-if`` (:mod:`.instruct`).
Each task module draws ``(prompt, reference, meta)`` from a ``random.Random``; this module decides the
split. A sample's split is a pure function of its prompt text (:func:`split_of`: sha256 → bucket in
``[0, 1000)``; test = buckets 0–19, calib = 20–29, train = the rest), so one prompt can never be in two
splits, whatever the seed or the order of generation. ``test`` and ``calib`` are drawn by rejection from
a seeded stream (prompts unique within the split) and cached; ``train`` is an endless stream.

    >>> from specfold.eval.tasks.synthetic import load_split, score
    >>> test = load_split("synth-math", "test")            # 200 samples, always the same
    >>> score(test[0], test[0].reference)
    True
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType

from specfold.eval.tasks.synthetic import code, instruct
from specfold.eval.tasks.synthetic import math as math_task

TASKS: tuple[str, ...] = ("synth-math", "synth-code", "synth-if")
SPLITS: tuple[str, ...] = ("train", "calib", "test")
SPLIT_SIZES: dict[str, int] = {"test": 200, "calib": 24, "train": 20_000}  # train: default for load_split

N_BUCKETS = 1000
_SPLIT_BUCKETS = {"test": range(0, 20), "calib": range(20, 30), "train": range(30, N_BUCKETS)}
_MODULES: dict[str, ModuleType] = {"synth-math": math_task, "synth-code": code, "synth-if": instruct}
_MAX_DRAWS_PER_SAMPLE = 2000  # guard: a too-small prompt space raises instead of looping forever


@dataclass(frozen=True)
class Sample:
    """One prompt with a correct response and what its scorer needs (``meta`` is JSON-serialisable)."""

    task: str  # "synth-math" | "synth-code" | "synth-if"
    sample_id: str  # stable id, e.g. "synth-math/test/00017"
    prompt: str  # the user message, no chat template applied
    reference: str  # a correct response; the training target
    meta: dict  # scorer data: answer / hidden tests / structured constraints


def _check_task(task: str) -> ModuleType:
    if task not in _MODULES:
        raise ValueError(f"unknown task {task!r}; expected one of {TASKS}")
    return _MODULES[task]


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")


def prompt_bucket(prompt: str) -> int:
    """The split bucket of a prompt: the first 8 bytes of sha256(prompt, utf-8) mod ``N_BUCKETS``."""
    return int.from_bytes(hashlib.sha256(prompt.encode("utf-8")).digest()[:8], "big") % N_BUCKETS


def split_of(prompt: str) -> str:
    """The one split this prompt text belongs to."""
    bucket = prompt_bucket(prompt)
    return next(s for s, r in _SPLIT_BUCKETS.items() if bucket in r)


def _sample_id(task: str, split: str, index: int, seed: int) -> str:
    seed_part = f"s{seed}/" if seed else ""
    return f"{task}/{split}/{seed_part}{index:05d}"


def _stream(task: str, split: str, seed: int) -> Iterator[tuple[str, str, dict]]:
    """Endless draws of ``task`` that land in ``split`` (duplicates possible)."""
    module = _check_task(task)
    rng = random.Random(f"{task}|{split}|{seed}")  # str seeds are hashed with sha512: stable across runs
    while True:
        prompt, reference, meta = module.generate(rng)
        if split_of(prompt) == split:
            yield prompt, reference, meta


@functools.lru_cache(maxsize=64)
def _eval_split(task: str, split: str, seed: int) -> tuple[Sample, ...]:
    size = SPLIT_SIZES[split]
    seen: set[str] = set()
    out: list[Sample] = []
    draws = 0
    for prompt, reference, meta in _stream(task, split, seed):
        draws += 1
        if draws > _MAX_DRAWS_PER_SAMPLE * size:
            raise RuntimeError(f"{task}: prompt space too small for {size} unique {split} samples")
        if prompt in seen:
            continue
        seen.add(prompt)
        out.append(Sample(task, _sample_id(task, split, len(out), seed), prompt, reference, meta))
        if len(out) == size:
            return tuple(out)
    raise AssertionError("unreachable")


def load_split(task: str, split: str, limit: int | None = None, seed: int = 0) -> list[Sample]:
    """Deterministic samples of one task and split.

    ``test`` has 200 and ``calib`` 24 unique prompts per task (``limit`` takes a prefix). ``train``
    returns the first ``limit`` (default 20 000) samples of :func:`iter_train` for this task.
    """
    _check_task(task)
    _check_split(split)
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    if split == "train":
        n = SPLIT_SIZES["train"] if limit is None else limit
        return list(itertools.islice(iter_train(task, seed), n))
    samples = _eval_split(task, split, seed)
    return list(samples if limit is None else samples[:limit])


def iter_train(task: str | None = None, seed: int = 0, weights: dict[str, int] | None = None) -> Iterator[Sample]:
    """Endless deterministic train samples; with ``task=None`` the tasks are interleaved round-robin, each
    round giving ``weights[t]`` samples of task ``t`` (default 1 each; 0 leaves a task out)."""
    tasks = TASKS if task is None else (task,)
    for t in tasks:
        _check_task(t)
    counts = {t: 1 for t in tasks}
    if weights is not None:
        unknown = set(weights) - set(tasks)
        if unknown:
            raise ValueError(f"weights name tasks {sorted(unknown)} outside {tasks}")
        if any(not isinstance(w, int) or w < 0 for w in weights.values()):
            raise ValueError(f"weights must be non-negative integers, got {weights}")
        counts.update(weights)
        if not any(counts.values()):
            raise ValueError("weights leave out every task")
    streams = {t: _stream(t, "train", seed) for t in tasks}
    index = dict.fromkeys(tasks, 0)
    while True:
        for t in tasks:
            for _ in range(counts[t]):
                prompt, reference, meta = next(streams[t])
                yield Sample(t, _sample_id(t, "train", index[t], seed), prompt, reference, meta)
                index[t] += 1


def score(sample: Sample, response: str) -> bool:
    """Exact score of ``response`` (the generated assistant text, without the stop token)."""
    return bool(_check_task(sample.task).score(sample.meta, response))
