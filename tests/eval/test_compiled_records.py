"""Eval records and summaries of a compiled run: the graphs and seconds compiling cost (the warm-up's on the
method's first record), the tokens of the eager run. Compiled with dynamo's eager backend (the same graphs and
counts without inductor's C++ build: ~5 s of CPU for the two-layer checkpoint's batch-1 forward)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specfold.config import MethodConfig
from specfold.eval.harness import EvalPlan, run_eval, summarize
from specfold.model.loading import load_model

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.slow  # 103 s wall on the loaded AVX2 EPYC (load 12): tracing the forward twice (K >= 2, K = 1)
def test_compiled_eval_reports_its_compile_and_keeps_the_tokens(text_ckpt: Path, monkeypatch):
    from specfold.engine import compiled

    monkeypatch.setattr(compiled, "BACKEND", "eager")
    model = load_model(text_ckpt, dtype="fp32")
    kw = {"limit": 2, "max_new_tokens": 16, "block_size": 16}
    eager = run_eval(model, EvalPlan(["synth-math"], [MethodConfig("vanilla", compile=False)], **kw), None)
    recs = run_eval(model, EvalPlan(["synth-math"], [MethodConfig("vanilla", compile=True)], **kw), None)
    assert [r["token_ids"] for r in recs] == [r["token_ids"] for r in eager]
    assert recs[0]["compiled_graphs"] > 0 and recs[0]["compile_seconds"] > 0  # the warm-up compiled
    assert not any("compiled_graphs" in r for r in eager)
    row = summarize(recs)["synth-math"]["vanilla"]
    assert row["compiled_graphs"] == sum(r.get("compiled_graphs", 0) for r in recs) and row["compile_seconds"] > 0
    assert "compile_seconds" not in summarize(eager)["synth-math"]["vanilla"]


def test_batch_one_record_keeps_a_decodes_compile_out_of_its_seconds(text_ckpt: Path, monkeypatch):
    """A batch-1 decode whose pass compiled a new graph (2 s, faked): its record's seconds are the decode's without
    the compile, which is reported in compile_seconds beside the warm-up's (faked alike)."""
    from dataclasses import replace

    from specfold.engine.stats import FoldStats
    from specfold.eval import harness

    real = harness.decode

    def compiling(*args, **kwargs):
        result = real(*args, **kwargs)
        stats = replace(FoldStats(), compiled_graphs=1, compile_seconds=2.0)
        return replace(result, seconds=result.seconds + 2.0, engine_stats=stats)

    model = load_model(text_ckpt, dtype="fp32")
    plan = EvalPlan(["synth-math"], [MethodConfig("vanilla", compile=False)], limit=1, max_new_tokens=8, block_size=8)
    plain = run_eval(model, plan, None)[0]
    monkeypatch.setattr(harness, "decode", compiling)
    rec = run_eval(model, plan, None)[0]
    assert rec["compile_seconds"] == 4.0 and rec["compiled_graphs"] == 2  # the warm-up's and the decode's
    assert 0 < rec["seconds"] < 1.0 and rec["wall_seconds"] == rec["seconds"]
    assert rec["token_ids"] == plain["token_ids"]
