"""Figures of the sweeps (the paper's Fig. 4, 5 and 8) from sweep records or their summary.

* ``delta``  — accuracy vs tokens/s per task, one point per δ, vanilla and spiffy as reference points; points that
  would overprint share one label listing their δs;
* ``budget`` — tokens/s gain over vanilla vs draft budget B, spiffy and specfold;
* ``depth``  — tokens/s gain over vanilla vs the draft graph's depth cap, spiffy and specfold.

One subplot per task. Figures are built on :class:`matplotlib.figure.Figure` directly (the Agg canvas; no pyplot
state, no display needed); the output format follows the file suffix (``.png``, ``.svg``, ``.pdf``).

    >>> plot_sweep(read_records(Path("sweeps/delta.jsonl")), "delta", Path("fig4.png"))
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specfold.eval.sweep import SWEEP_KINDS, sweep_summary
from specfold.io import atomic_output, check_figure_path

if TYPE_CHECKING:
    from matplotlib.figure import Figure

TITLES = {
    "delta": "Accuracy vs throughput across the recompute threshold δ\n(cf. paper Fig. 4)",
    "budget": "Tokens/s gain over vanilla vs draft budget B\n(cf. paper Fig. 5)",
    "depth": "Tokens/s gain over vanilla vs draft graph depth cap\n(cf. paper Fig. 8)",
}
X_LABELS = {"budget": "draft budget B", "depth": "depth cap D"}
COLORS = {"vanilla": "black", "spiffy": "tab:orange", "specfold": "tab:blue"}
SUBPLOT_INCHES = (4.6, 3.6)
MIN_WIDTH_INCHES = 5.5
MAX_COLUMNS = 3
LABEL_CLUSTER = 0.04  # δ points within this share of both axes' spans share one label (else they overprint)
LABEL_OFFSETS = (7, -13, 17, -23, 27, -33)  # label heights over / under a δ point (points), tried in turn
LABEL_CHAR_POINTS = 4.3  # width of one character of a 7-point label (points)


def _figure(n_tasks: int, title: str):
    from matplotlib.figure import Figure

    cols = min(MAX_COLUMNS, max(1, n_tasks))
    rows = math.ceil(max(1, n_tasks) / cols)
    width = max(MIN_WIDTH_INCHES, SUBPLOT_INCHES[0] * cols)
    fig = Figure(figsize=(width, SUBPLOT_INCHES[1] * rows + 0.8), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax in axes[n_tasks:]:
        ax.set_visible(False)
    fig.suptitle(title)
    return fig, axes


def _label_clusters(xs: list[float], ys: list[float], span: tuple[float, float]) -> list[list[int]]:
    """Indices of points grouped so that labels do not overprint: walking the points by ``x``, a point joins the
    current group while it lies within :data:`LABEL_CLUSTER` of both axes' ``span`` from the group's first point."""
    groups: list[list[int]] = []
    for i in sorted(range(len(xs)), key=lambda j: (xs[j], ys[j])):
        if groups:
            first = groups[-1][0]
            if (abs(xs[i] - xs[first]) <= LABEL_CLUSTER * span[0]
                    and abs(ys[i] - ys[first]) <= LABEL_CLUSTER * span[1]):
                groups[-1].append(i)
                continue
        groups.append([i])
    return groups


def _delta_labels(ax, pts: list[dict[str, Any]], xs: list[float], ys: list[float]) -> None:
    """δ labels that do not overprint: points closer than :data:`LABEL_CLUSTER` share one label; each label takes
    the first of :data:`LABEL_OFFSETS` (points above / below its point) where it overlaps no label placed before."""
    ax.autoscale_view()
    lim = ax.dataLim
    span = (lim.width or abs(lim.x0) or 1.0, lim.height or abs(lim.y0) or 1.0)
    placed: list[tuple[float, float, float]] = []  # (left, right, vertical offset) in points along x
    to_points = ax.transData.transform
    for group in _label_clusters(xs, ys, span):
        text = ", ".join(f"{pts[i]['delta']:g}" for i in sorted(group, key=lambda i: pts[i]["delta"]))
        x, y = sum(xs[i] for i in group) / len(group), sum(ys[i] for i in group) / len(group)
        centre = to_points((x, y))[0] * 72 / ax.figure.dpi
        half = LABEL_CHAR_POINTS * len(text) / 2
        free = [dy for dy in LABEL_OFFSETS
                if not any(dy == q and centre - half < right and left < centre + half for left, right, q in placed)]
        dy = free[0] if free else LABEL_OFFSETS[len(placed) % len(LABEL_OFFSETS)]
        placed.append((centre - half, centre + half, dy))
        ax.annotate(text, (x, y), textcoords="offset points", xytext=(0, dy), ha="center", fontsize=7)


def _delta_panel(ax, entry: dict[str, Any]) -> None:
    pts = [p for p in entry["specfold"] if p.get("delta") is not None]
    xs = [p["tokens_per_second"] for p in pts]
    ys = [100 * p["accuracy"] for p in pts]
    if pts:
        ax.plot(xs, ys, "o-", color=COLORS["specfold"], label="SpecFold (δ)")
    for p in entry["spiffy"]:
        shown = ", ".join(f"{short}={p[k]}" for k, short in (("budget", "B"), ("depth", "D")) if k in p)
        ax.plot(p["tokens_per_second"], 100 * p["accuracy"], "s", ms=8, color=COLORS["spiffy"],
                label=f"Spiffy ({shown})" if shown else "Spiffy")
    if entry["vanilla"]:
        v = entry["vanilla"]
        ax.plot(v["tokens_per_second"], 100 * v["accuracy"], "*", ms=12, color=COLORS["vanilla"], label="vanilla")
    if pts:
        _delta_labels(ax, pts, xs, ys)
    ax.set_xlabel("tokens / s")
    ax.set_ylabel("accuracy (%)")


def _gain_panel(ax, kind: str, entry: dict[str, Any]) -> None:
    for method, marker, name in (("spiffy", "s--", "Spiffy"), ("specfold", "o-", "SpecFold")):
        pts = [p for p in entry[method] if p.get(kind) is not None and p.get("tps_vs_vanilla") is not None]
        if pts:
            deltas = sorted({p["delta"] for p in pts if "delta" in p})
            label = name + (f" (δ={deltas[0]:g})" if len(deltas) == 1 else "")
            ax.plot([p[kind] for p in pts], [p["tps_vs_vanilla"] for p in pts], marker, color=COLORS[method],
                    label=label)
    ax.axhline(1.0, color=COLORS["vanilla"], lw=1, ls=":", label="vanilla (1.0×)")
    ax.set_xlabel(X_LABELS[kind])
    ax.set_ylabel("tokens/s gain vs vanilla (×)")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def sweep_figure(summary: dict[str, Any], title: str | None = None) -> Figure:
    """The :class:`matplotlib.figure.Figure` of a :func:`~specfold.eval.sweep.sweep_summary`, one subplot per task."""
    kind = summary["kind"]
    if kind not in SWEEP_KINDS:
        raise ValueError(f"unknown sweep {kind!r}; choose one of {', '.join(SWEEP_KINDS)}")
    tasks = summary["tasks"]
    if not tasks:
        raise ValueError("no records to plot")
    fig, axes = _figure(len(tasks), title or TITLES[kind])
    for ax, (task, entry) in zip(axes, tasks.items(), strict=False):
        if kind == "delta":
            _delta_panel(ax, entry)
        else:
            _gain_panel(ax, kind, entry)
        n = entry["vanilla"]["n"] if entry["vanilla"] else max((p["n"] for p in entry["specfold"]), default=0)
        ax.set_title(f"{task} (n={n})")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    return fig


def plot_summary(summary: dict[str, Any], out: Path, title: str | None = None) -> Path:
    """Draw the figure of a sweep summary and save it to ``out`` (format from the suffix)."""
    check_figure_path(out)
    fig = sweep_figure(summary, title)
    with atomic_output(out) as tmp:
        fig.savefig(tmp, dpi=150)
    return out


def plot_sweep(records: Iterable[dict[str, Any]], kind: str, out: Path, title: str | None = None) -> Path:
    """Summarise sweep records (:func:`~specfold.eval.sweep.sweep_summary`) and draw the figure of ``kind``."""
    return plot_summary(sweep_summary(records, kind), out, title)
