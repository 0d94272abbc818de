"""Sweep figures from synthetic records: one subplot per task, titles, axis labels, legends, file formats."""

from __future__ import annotations

from pathlib import Path

import pytest

from specfold.eval.plots import plot_sweep, sweep_figure
from specfold.eval.sweep import sweep_summary


def _rec(task, method, params, label, sample, tps, correct=True, fold=None):
    rec = {"task": task, "method": method, "params": params, "label": label, "sample_id": f"{task}/{sample}",
           "correct": correct, "nfe": 10, "nfe_denoise": 9, "generated_tokens": int(tps), "seconds": 1.0,
           "accepted_drafts": 2}
    if fold is not None:
        rec.update(draft_triples=100.0, folded_triples=100.0 * fold)
    return rec


def records(kind: str) -> list[dict]:
    out = []
    for task in ("synth-math", "synth-code"):
        for s in range(2):
            out.append(_rec(task, "vanilla", {}, "vanilla", s, 100))
            if kind == "delta":
                out.append(_rec(task, "spiffy", {"budget": 7, "depth": None, "graph": None}, "spiffy[budget=7]",
                                s, 110))
                for d in (0.05, 0.2, 0.5):
                    out.append(_rec(task, "specfold", {"budget": 7, "depth": None, "graph": None, "delta": d},
                                    f"specfold[budget=7,delta={d}]", s, 100 + 200 * d, correct=d < 0.4, fold=d))
            else:
                for v in (2, 4, 6):
                    b, dep = (v, None) if kind == "budget" else (7, v)
                    p = {"budget": b, "depth": dep, "graph": None}
                    tag = f"budget={b}" + (f",depth={dep}" if dep else "")
                    out.append(_rec(task, "spiffy", p, f"spiffy[{tag}]", s, 100 + v))
                    out.append(_rec(task, "specfold", {**p, "delta": 0.1}, f"specfold[{tag},delta=0.1]", s,
                                    120 + 10 * v, fold=0.5))
    return out


@pytest.mark.parametrize("kind", ["delta", "budget", "depth"])
def test_figure_has_a_labelled_subplot_per_task(kind: str):
    fig = sweep_figure(sweep_summary(records(kind), kind))
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in axes] == ["synth-math (n=2)", "synth-code (n=2)"]
    assert "Fig." in fig._suptitle.get_text()
    for ax in axes:
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert any(t.startswith("SpecFold") for t in legend) and any(t.startswith("vanilla") for t in legend)
        assert any(t.startswith("Spiffy") for t in legend)
        if kind == "delta":
            assert (ax.get_xlabel(), ax.get_ylabel()) == ("tokens / s", "accuracy (%)")
            assert sorted(t.get_text() for t in ax.texts) == ["0.05", "0.2", "0.5"]  # δ labels on the points
        else:
            assert ax.get_xlabel() == {"budget": "draft budget B", "depth": "depth cap D"}[kind]
            assert ax.get_ylabel() == "tokens/s gain vs vanilla (×)"
            specfold = next(line for line in ax.get_lines() if line.get_label().startswith("SpecFold"))
            assert list(specfold.get_xdata()) == [2, 4, 6]
            assert list(specfold.get_ydata()) == pytest.approx([(120 + 10 * v) / 100 for v in (2, 4, 6)])


BLUE, ORANGE, WHITE = (31, 119, 180), (255, 127, 14), (255, 255, 255)  # SpecFold, Spiffy (tab: colours), background


@pytest.mark.parametrize("kind", ["delta", "budget"])
def test_png_has_a_drawn_panel_per_task(tmp_path: Path, png_pixels, kind: str):
    out = plot_sweep(records(kind), kind, tmp_path / "fig.png")
    px = png_pixels.read(out)
    assert px.shape == (660, 1380, 3)  # two panels side by side: (4.6 in × 2) × (3.6 + 0.8 in) at 150 dpi
    white = png_pixels.count(px, WHITE) / (px.shape[0] * px.shape[1])
    assert 0.5 < white < 0.98  # neither blank nor a filled canvas
    for half in (px[:, : px.shape[1] // 2], px[:, px.shape[1] // 2 :]):  # each task's panel draws both methods
        assert png_pixels.count(half, BLUE) > 300 and png_pixels.count(half, ORANGE) > 300


def test_svg_has_the_lines_of_both_methods(tmp_path: Path):
    out = plot_sweep(records("budget"), "budget", tmp_path / "fig.svg")
    svg = out.read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    for colour in ("#1f77b4", "#ff7f0e"):  # SpecFold and Spiffy, in both panels
        assert svg.count(f"stroke: {colour}") >= 8, colour  # measured 13: a line, its markers, the legend


def test_no_records_is_an_error(tmp_path: Path):
    with pytest.raises(ValueError, match="no records"):
        plot_sweep([], "delta", tmp_path / "x.png")


def test_plot_without_matplotlib_is_one_line_naming_the_extra(tmp_path: Path, monkeypatch, capsys):
    """The core venv (`make demo`) has no matplotlib: `specfold plot` ends with one line naming the extra to
    install, exit status 2, and writes no figure."""
    import json
    import sys

    from specfold.cli import main

    path = tmp_path / "sweep.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records("delta")))
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ModuleNotFoundError
    out = tmp_path / "delta.png"
    assert main(["plot", "delta", "--records", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["specfold: error: matplotlib is not installed: run `make venv` (every extra) or pip install "
                   "'specfold[plot]'"]
    assert not out.exists()
