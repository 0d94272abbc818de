"""What ``specfold demo`` measures: the evaluation of a plan repeated until its tokens/s medians settle, and the
findings its summary sentence is made of (all computed from the run's own records, nothing assumed).

Decoding is deterministic, so every repeat produces the same tokens, accuracy and NFE; only the wall-clock times
change between repeats. Tokens/s of a (task, method) row is taken per repeat (tokens / seconds over the row's
samples) and reported as the median over repeats with its min and max: on a shared CPU the spread shows how far a
single figure can be trusted.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specfold.eval.harness import EvalPlan, Progress, run_eval, summarize
from specfold.model.loading import LoadedModel
from specfold.timing import Spread


@dataclass(frozen=True)
class MethodFindings:
    """One method over every task of the demo (pooled samples)."""

    label: str
    method: str
    n: int  # samples
    correct: int
    same_as_vanilla: int  # samples whose tokens equal vanilla's
    nfe: int  # forwards (denoising passes + cache writes), all samples
    passes: int  # denoising (verification) passes
    tokens: int
    seconds_per_pass: float  # median repeat's decode seconds / NFE
    tokens_per_second: Spread
    accepted_per_pass: float | None  # accepted drafts per verification pass (None for vanilla)
    fold_ratio: float | None  # share of draft (branch, position, layer) triples folded at the attention gate


@dataclass
class DemoResult:
    records: list[dict[str, Any]]  # the first repeat's records (texts, correctness, NFE)
    summary: dict[str, dict[str, dict[str, Any]]]  # summarize() of them, tokens/s replaced by the median repeat
    timing: dict[tuple[str, str], Spread]  # (task, label) -> tokens/s over the repeats
    methods: dict[str, MethodFindings]  # label -> findings over all tasks
    repeats: int
    settled: bool  # the last repeat moved no row's median by more than the tolerance


def _tokens_per_second(records: list[dict[str, Any]]) -> float:
    seconds = sum(r["seconds"] for r in records)
    return sum(r["generated_tokens"] for r in records) / seconds if seconds else 0.0


def _medians(runs: list[list[dict[str, Any]]], keys: list[tuple[str, str]]) -> dict[tuple[str, str], float]:
    return {k: statistics.median(_tokens_per_second([r for r in run if (r["task"], r["label"]) == k]) for run in runs)
            for k in keys}


def run_demo(
    model: LoadedModel,
    plan: EvalPlan,
    min_repeats: int = 3,
    max_repeats: int = 5,
    tolerance: float = 0.05,
    progress: Callable[[int, Progress], None] | None = None,
) -> DemoResult:
    """Evaluate ``plan`` (no records file) at least ``min_repeats`` and at most ``max_repeats`` times, stopping once
    one more repeat changes no (task, method) row's median tokens/s by more than ``tolerance`` (relative).
    ``progress(repeat, p)`` follows each repeat (repeat counted from 1)."""
    if not 1 <= min_repeats <= max_repeats:
        raise ValueError(f"repeats must satisfy 1 <= min ({min_repeats}) <= max ({max_repeats})")
    runs: list[list[dict[str, Any]]] = []
    settled = False
    while len(runs) < max_repeats:
        n = len(runs) + 1
        runs.append(run_eval(model, plan, None, None if progress is None else (lambda p, n=n: progress(n, p))))
        keys = sorted({(r["task"], r["label"]) for r in runs[0]})
        if len(runs) >= max(2, min_repeats):
            now, before = _medians(runs, keys), _medians(runs[:-1], keys)
            settled = all(abs(now[k] - before[k]) <= tolerance * now[k] for k in keys)
            if settled and len(runs) >= min_repeats:
                break
    records = runs[0]
    timing = {(task, label): Spread(tuple(_tokens_per_second([r for r in run if (r["task"], r["label"]) ==
                                                              (task, label)]) for run in runs))
              for task, label in dict.fromkeys((r["task"], r["label"]) for r in records)}
    summary = summarize(records)
    for task, rows in summary.items():
        for label, row in rows.items():
            row["tokens_per_second"] = timing[task, label].median
        base = rows.get("vanilla")
        for row in rows.values():
            row["tps_vs_vanilla"] = row["tokens_per_second"] / base["tokens_per_second"] if base else None
    return DemoResult(records, summary, timing, _findings(runs), len(runs), settled)


def _findings(runs: list[list[dict[str, Any]]]) -> dict[str, MethodFindings]:
    first = runs[0]
    vanilla = {r["sample_id"]: r["token_ids"] for r in first if r["method"] == "vanilla"}
    out: dict[str, MethodFindings] = {}
    for label in dict.fromkeys(r["label"] for r in first):
        recs = [r for r in first if r["label"] == label]
        tps = Spread(tuple(_tokens_per_second([r for r in run if r["label"] == label]) for run in runs))
        median_run = sorted(runs, key=lambda run: _tokens_per_second([r for r in run if r["label"] == label]))
        seconds = sum(r["seconds"] for r in median_run[len(runs) // 2] if r["label"] == label)
        nfe = sum(r["nfe"] for r in recs)
        passes = sum(r.get("nfe_denoise", r["nfe"]) for r in recs)
        draft = sum(r.get("draft_triples", 0.0) for r in recs)
        method = recs[0]["method"]
        out[label] = MethodFindings(
            label=label,
            method=method,
            n=len(recs),
            correct=sum(bool(r["correct"]) for r in recs),
            same_as_vanilla=sum(vanilla.get(r["sample_id"]) == r["token_ids"] for r in recs),
            nfe=nfe,
            passes=passes,
            tokens=sum(r["generated_tokens"] for r in recs),
            seconds_per_pass=seconds / nfe if nfe else 0.0,
            tokens_per_second=tps,
            accepted_per_pass=None if method == "vanilla" else sum(r.get("accepted_drafts", 0) for r in recs)
            / max(1, passes),
            fold_ratio=sum(r.get("folded_triples", 0.0) for r in recs) / draft if draft else None,
        )
    return out
