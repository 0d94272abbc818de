"""Parameter sweeps of SPEC §6 (the paper's Fig. 4, 5 and 8), built on :func:`~specfold.eval.harness.run_eval`.

A sweep is one :class:`~specfold.eval.harness.EvalPlan` whose methods are the grid points plus reference points,
so it shares the harness's resumable JSONL records (one file per sweep), sharding and side-by-side timing:

* ``delta``  — specfold at every δ of the grid (budget B fixed, default 7); vanilla and spiffy (same B) as
  reference points (Fig. 4: accuracy vs tokens/s).
* ``budget`` — spiffy and specfold (δ fixed, default 0.1) at every B, each B with its own graph selected from
  the calibration counts shipped beside the model (:func:`~specfold.api.resolve_graph`); vanilla as reference
  (Fig. 5: tokens/s gain vs B).
* ``depth``  — spiffy and specfold at every depth cap D of the B = 7 graph; vanilla as reference (Fig. 8).

    >>> records = run_sweep(model, "delta", ["synth-math"], out=Path("sweeps/delta.jsonl"), limit=20)
    >>> summary = sweep_summary(records, "delta")   # {"kind", "grid", "tasks": {task: {vanilla, spiffy, specfold}}}

Every record carries its provenance, including the sweep's kind and its fixed B or δ; resuming with other settings
(which would mix incomparable records in one file) is refused, naming the field. The grid itself may grow between
runs. :func:`check_sweep_kind` refuses to summarise records of one kind of sweep as another.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from specfold.config import FoldConfig, MethodConfig, MethodName, check_delta
from specfold.eval.harness import EvalPlan, Progress, run_eval, summarize
from specfold.model.loading import LoadedModel
from specfold.validation import ValidationError

SWEEP_KINDS: tuple[str, ...] = ("delta", "budget", "depth")
DEFAULT_GRIDS: dict[str, tuple[float | int, ...]] = {
    "delta": (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7),
    "budget": (2, 3, 4, 5, 6, 7, 8),
    "depth": (1, 2, 3, 4),
}
SWEEP_BUDGET = 7  # B of the delta and depth sweeps (the paper's)
SWEEP_DELTA = 0.1  # δ of the budget and depth sweeps
# What a grid point reports (SPEC §6); any missing one (e.g. fold ratio of spiffy) is left out.
POINT_METRICS: tuple[str, ...] = (
    "n",
    "accuracy",
    "tokens_per_second",
    "tps_vs_vanilla",
    "nfe_per_sample",
    "nfe_vs_vanilla",
    "tokens_per_forward",
    "accepted_per_step",
    "fold_ratio",
)


def check_grid(kind: str, grid: Iterable[float | int]) -> list[float | int]:
    """The grid as a sorted, duplicate-free list of valid values (δ in [0, 1]; B and D positive integers)."""
    if kind not in SWEEP_KINDS:
        raise ValueError(f"unknown sweep {kind!r}; choose one of {', '.join(SWEEP_KINDS)}")
    values = list(grid)
    if not values:
        raise ValueError(f"empty {kind} grid")
    if kind == "delta":
        return sorted({check_delta(v, "delta grid value") for v in values})
    if any(float(v) != int(v) or int(v) < 1 for v in values):
        raise ValueError(f"{kind} grid values must be positive integers, got {values}")
    return sorted({int(v) for v in values})


def sweep_methods(
    kind: str,
    grid: Iterable[float | int] | None = None,
    budget: int | None = None,
    delta: float | None = None,
    fold: FoldConfig | None = None,
    compile: bool | None = None,
) -> list[MethodConfig]:
    """The methods of a sweep: vanilla, the spiffy reference point(s), then specfold at every grid point.

    ``budget`` is B of the delta/depth sweeps (default 7), ``delta`` the δ of the budget/depth sweeps (0.1); a value
    that the sweep itself varies is rejected. ``fold`` gives specfold's backend, FFN reuse and attention (its δ is
    the sweep's). ``compile``: every method's dense forwards compiled (``MethodConfig.compile``; None = the
    default)."""
    values = check_grid(kind, DEFAULT_GRIDS[kind] if grid is None else grid)
    if kind == "budget" and budget is not None:
        raise ValueError("a budget sweep varies B itself; do not also fix --budget")
    if kind == "delta" and delta is not None:
        raise ValueError("a delta sweep varies δ itself; do not also fix --delta")
    b = SWEEP_BUDGET if budget is None else budget
    d = SWEEP_DELTA if delta is None else delta
    f = fold or FoldConfig()
    spiffy = partial(MethodConfig, MethodName.SPIFFY, compile=compile)
    specfold = partial(MethodConfig, MethodName.SPECFOLD, backend=f.backend, ffn=f.ffn, attention=f.attention,
                       compile=compile)
    specs = [MethodConfig(MethodName.VANILLA, compile=compile)]
    if kind == "delta":
        specs.append(spiffy(budget=b))
        specs += [specfold(budget=b, delta=float(v)) for v in values]
    elif kind == "budget":
        for v in values:
            specs += [spiffy(budget=int(v)), specfold(budget=int(v), delta=d)]
    else:
        for v in values:
            specs += [spiffy(budget=b, depth=int(v)), specfold(budget=b, depth=int(v), delta=d)]
    return specs


def run_sweep(
    model: LoadedModel,
    kind: str,
    tasks: Sequence[str],
    grid: Iterable[float | int] | None = None,
    out: Path | None = None,
    progress: Callable[[Progress], None] | None = None,
    *,
    budget: int | None = None,
    delta: float | None = None,
    fold: FoldConfig | None = None,
    compile: bool | None = None,
    overwrite: bool = False,
    **plan_options: Any,
) -> list[dict[str, Any]]:
    """Run (or resume) one sweep and return all its records (old and new); ``overwrite`` starts ``out`` afresh.
    ``budget``, ``delta``, ``fold`` and ``compile`` are as for :func:`sweep_methods`.

    ``plan_options`` are the other :class:`EvalPlan` fields (``limit``, ``split``, ``max_new_tokens``, ``threshold``,
    ``block_size``, ``small_block_size``, ``steps``, ``strategy``, ``num_shards``, ``shard_id``, ``chat``,
    ``data_dir``)."""
    specs = sweep_methods(kind, grid, budget, delta, fold, compile)
    fixed = {"kind": kind, "budget": None, "delta": None}
    if kind != "budget":
        fixed["budget"] = SWEEP_BUDGET if budget is None else budget
    if kind != "delta":
        fixed["delta"] = SWEEP_DELTA if delta is None else delta
    plan = EvalPlan(tasks=list(tasks), methods=specs, sweep=fixed, **plan_options)
    return run_eval(model, plan, out, progress, overwrite=overwrite)


def _point(label: str, rec: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    params = {k: v for k, v in rec.get("params", {}).items() if k in ("budget", "depth", "delta") and v is not None}
    return {"label": label, **params, **{k: row[k] for k in POINT_METRICS if row.get(k) is not None}}


def sweep_kind_of(records: Iterable[dict[str, Any]]) -> str | None:
    """The kind of sweep that made ``records``: from their provenance, else (older records, eval records) the one
    parameter that takes several values among the specfold records; None when that says nothing."""
    records = list(records)
    kinds = {r["provenance"].get("sweep") for r in records if isinstance(r.get("provenance"), dict)} - {None}
    if len(kinds) > 1:
        raise ValidationError(f"the records mix sweeps of {' and '.join(sorted(kinds))}; plot each file on its own")
    if kinds:
        return kinds.pop()
    params = [r.get("params", {}) for r in records if r.get("method") == "specfold"]
    varying = [k for k in SWEEP_KINDS if len({p.get(k) for p in params} - {None}) > 1]
    return varying[0] if len(varying) == 1 else None


def check_sweep_kind(records: Iterable[dict[str, Any]], kind: str) -> None:
    """Refuse to read records of one kind of sweep as another (``plot budget`` of a delta sweep)."""
    records = list(records)
    if not records:
        raise ValidationError("no records to plot")
    made = sweep_kind_of(records)
    if made is not None and made != kind:
        raise ValidationError(f"the records hold a {made} sweep, not a {kind} sweep")
    if not any(r.get("method") in ("spiffy", "specfold") for r in records):
        raise ValidationError(f"the records hold no {kind} sweep: not one spiffy or specfold record")


def sweep_summary(records: Iterable[dict[str, Any]], kind: str) -> dict[str, Any]:
    """Per task: ``vanilla`` (its metrics or None), and ``spiffy`` / ``specfold`` lists of points sorted by the swept
    parameter; a point carries its ``budget``/``depth``/``delta``, accuracy, tokens/s, gain vs vanilla tokens/s
    (``tps_vs_vanilla``), NFE per sample, fold ratio, …  Works on any records, e.g. a merged file."""
    if kind not in SWEEP_KINDS:
        raise ValueError(f"unknown sweep {kind!r}; choose one of {', '.join(SWEEP_KINDS)}")
    records = list(records)
    check_sweep_kind(records, kind)
    first: dict[tuple[str, str], dict[str, Any]] = {}
    for r in records:
        first.setdefault((r["task"], r.get("label", r["method"])), r)
    table = summarize(records)
    tasks: dict[str, Any] = {}
    grid: set[float | int] = set()
    for task, rows in table.items():
        entry: dict[str, Any] = {"vanilla": None, "spiffy": [], "specfold": []}
        for label, row in rows.items():
            rec = first[(task, label)]
            point = _point(label, rec, row)
            if rec["method"] == "vanilla":
                entry["vanilla"] = point
                continue
            entry[rec["method"]].append(point)
            if rec["method"] == "specfold" and point.get(kind) is not None:
                grid.add(point[kind])
        for method in ("spiffy", "specfold"):
            entry[method].sort(key=lambda p: (p.get(kind) is None, p.get(kind) or 0, p["label"]))
        tasks[task] = entry
    return {"kind": kind, "grid": sorted(grid), "tasks": tasks}


def format_sweep(summary: dict[str, Any]) -> str:
    """The sweep summary as a text table: per task and point, accuracy, tokens/s, gain, NFE, fold ratio."""
    kind = summary["kind"]
    rows = [
        (task, p)
        for task, entry in summary["tasks"].items()
        for p in ([entry["vanilla"]] if entry["vanilla"] else []) + entry["spiffy"] + entry["specfold"]
    ]
    tw = max([4] + [len(task) for task, _ in rows])  # columns as wide as the longest task and method names
    mw = max([6] + [len(p["label"]) for _, p in rows])
    head = f"{'task':<{tw}} {'method':<{mw}} {'acc':>6} {'tok/s':>8} {'TPS×':>6} {'NFE':>7} {'fold':>5}"
    lines = [f"sweep over {kind}", head, "-" * len(head)]

    def num(p: dict[str, Any], key: str, width: int, scale: float = 1.0) -> str:
        v = p.get(key)
        return f"{scale * v:>{width}.2f}" if isinstance(v, (int, float)) else "-".rjust(width)

    for task, p in rows:
        lines.append(
            f"{task:<{tw}} {p['label']:<{mw}} {num(p, 'accuracy', 5, 100)}% {num(p, 'tokens_per_second', 8)} "
            f"{num(p, 'tps_vs_vanilla', 6)} {num(p, 'nfe_per_sample', 7)} {num(p, 'fold_ratio', 5)}"
        )
    return "\n".join(lines)
