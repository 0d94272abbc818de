"""Sweeps: the methods of each grid, per-B graphs, resumable records, the JSON summary, the CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from specfold.api import decode_config_for, load_model, prepare_method
from specfold.cli import main
from specfold.eval.harness import read_records, record_key
from specfold.eval.sweep import DEFAULT_GRIDS, run_sweep, sweep_methods, sweep_summary

TINY = {"limit": 1, "max_new_tokens": 8, "block_size": 8, "threshold": 1.0}  # one token a step: drafts run


def test_methods_of_each_sweep_cover_the_paper_grids():
    delta = sweep_methods("delta")
    assert [m.method for m in delta[:2]] == ["vanilla", "spiffy"] and delta[1].budget == 7
    assert [m.delta for m in delta[2:]] == list(DEFAULT_GRIDS["delta"])
    assert all(m.method == "specfold" and m.budget == 7 for m in delta[2:])

    budget = sweep_methods("budget")
    assert budget[0].method == "vanilla"
    assert [(m.method, m.budget) for m in budget[1:]] == [(n, b) for b in range(2, 9) for n in ("spiffy", "specfold")]
    assert all(m.delta == 0.1 for m in budget if m.method == "specfold")

    depth = sweep_methods("depth", delta=0.2)
    assert [(m.method, m.depth) for m in depth[1:]] == [(n, d) for d in range(1, 5) for n in ("spiffy", "specfold")]
    assert all(m.budget == 7 for m in depth[1:]) and all(m.delta == 0.2 for m in depth if m.method == "specfold")
    for specs in (delta, budget, depth):  # every grid point has its own resume keys
        assert len({(m.method, repr(m.params)) for m in specs}) == len(specs)


@pytest.mark.parametrize(
    "kind, grid, kwargs, message",
    [
        ("delta", [-0.1], {}, "delta grid value must be a finite number in [0, 1], got -0.1"),
        ("delta", [0.1, 1.5], {}, "delta grid value must be a finite number in [0, 1], got 1.5"),
        ("delta", [float("nan")], {}, "delta grid value must be a finite number in [0, 1], got nan"),
        ("budget", [0], {}, "positive integers"),
        ("depth", [1.5], {}, "positive integers"),
        ("budget", [2], {"budget": 3}, "varies B"),
        ("delta", [0.1], {"delta": 0.2}, "varies δ"),
        ("width", [1], {}, "unknown sweep"),
        ("delta", [], {}, "empty"),
    ],
)
def test_bad_grids_are_refused(kind, grid, kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        sweep_methods(kind, grid, **kwargs)


def test_budget_sweep_selects_a_graph_per_budget_and_resumes(text_ckpt: Path, tmp_path: Path):
    model = load_model(text_ckpt)
    cfg = decode_config_for(model, 8, block_size=8)
    specs = sweep_methods("budget", [2, 3])
    assert [prepare_method(model, s, cfg).graph.budget for s in specs if s.drafts] == [2, 2, 3, 3]

    out = tmp_path / "budget.jsonl"
    records = run_sweep(model, "budget", ["synth-math"], [2, 3], out, **TINY)
    assert len(records) == 5 == len(read_records(out))
    vanilla = next(r for r in records if r["method"] == "vanilla")
    for r in records:
        if r["method"] == "spiffy":  # lossless: the vanilla trajectory
            assert r["token_ids"] == vanilla["token_ids"]

    # a rerun (grid grown by one point) only runs the new point
    records2 = run_sweep(model, "budget", ["synth-math"], [2, 3, 4], out, **TINY)
    lines = read_records(out)
    assert len(records2) == len(lines) == 7
    assert len({record_key(r) for r in lines}) == 7

    summary = sweep_summary(records2, "budget")
    assert summary["grid"] == [2, 3, 4]
    entry = summary["tasks"]["synth-math"]
    assert entry["vanilla"]["tps_vs_vanilla"] == pytest.approx(1.0)
    assert [p["budget"] for p in entry["spiffy"]] == [p["budget"] for p in entry["specfold"]] == [2, 3, 4]
    for p in entry["specfold"]:
        for key in ("accuracy", "tokens_per_second", "tps_vs_vanilla", "nfe_per_sample", "fold_ratio"):
            assert key in p
    assert "fold_ratio" not in entry["spiffy"][0]

    with pytest.raises(ValueError, match="max_new_tokens"):
        run_sweep(model, "budget", ["synth-math"], [2], out, **{**TINY, "max_new_tokens": 16})


def test_cli_delta_sweep_then_plot(text_ckpt: Path, tmp_path: Path, capsys):
    out = tmp_path / "delta.jsonl"
    argv = ["sweep", "delta", "--model", str(text_ckpt), "--tasks", "synth-math", "--limit", "1", "--grid", "0,0.3",
            "--max-new-tokens", "8", "--block-size", "8", "--threshold", "1", "--out", str(out), "--json"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    entry = summary["tasks"]["synth-math"]
    assert summary["kind"] == "delta" and summary["grid"] == [0.0, 0.3]
    assert [p["delta"] for p in entry["specfold"]] == [0.0, 0.3]
    assert [p["budget"] for p in entry["spiffy"]] == [7]
    recs = {r["label"]: r for r in read_records(out)}
    assert recs["specfold[budget=7,delta=0.0]"]["token_ids"] == recs["vanilla"]["token_ids"]  # δ = 0 is lossless

    fig = tmp_path / "fig4.svg"
    assert main(["plot", "delta", "--records", str(out), "--out", str(fig)]) == 0
    assert json.loads(capsys.readouterr().out)["figure"] == str(fig)
    assert fig.read_text().lstrip().startswith("<?xml")


def test_cli_sweep_refuses_fixing_the_swept_parameter(text_ckpt: Path, capsys):
    code = main(["sweep", "budget", "--model", str(text_ckpt), "--tasks", "synth-math", "--budget", "3"])
    assert code == 2 and "varies B" in capsys.readouterr().err


def test_sweep_compile_reaches_every_method(text_ckpt: Path, tmp_path: Path, monkeypatch, capsys):
    """``sweep --compile`` compiles every grid point's method (it used to be accepted and ignored); the labels and
    resume keys do not change with it."""
    import specfold.eval.sweep as sweep

    on, off = sweep_methods("delta", [0.1, 0.3], compile=True), sweep_methods("delta", [0.1, 0.3])
    assert all(m.compiled for m in on) and not any(m.compiled for m in off)
    assert [(m.label, m.params) for m in on] == [(m.label, m.params) for m in off]
    seen, original = {}, sweep.run_sweep

    def run(*args, **kwargs):  # what the CLI passes, then the sweep itself eager (compiling is test_compiled's)
        seen["compile"] = kwargs["compile"]
        return original(*args, **{**kwargs, "compile": False})

    monkeypatch.setattr(sweep, "run_sweep", run)
    argv = ["sweep", "delta", "--model", str(text_ckpt), "--tasks", "synth-math", "--limit", "1", "--grid", "0.2",
            "--max-new-tokens", "8", "--block-size", "8", "--out", str(tmp_path / "d.jsonl"), "--compile"]
    assert main(argv) == 0 and seen["compile"] is True
    assert main([*argv[:-1], "--no-compile", "--overwrite"]) == 0 and seen["compile"] is False
    capsys.readouterr()
