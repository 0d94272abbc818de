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
