"""``eval --batch-size R``: the same records (fields, samples, tokens) as batch 1."""

from __future__ import annotations

from pathlib import Path

from specfold.api import load_model
from specfold.eval.harness import EvalPlan, MethodSpec, record_key, run_eval


def test_batched_eval_writes_the_batch_one_records(text_ckpt: Path):
    model = load_model(text_ckpt, dtype="fp64")
    kw = dict(limit=5, max_new_tokens=16, block_size=8, threshold=0.5)
    specs = [MethodSpec("vanilla"), MethodSpec("spiffy", budget=3)]
    one = run_eval(model, EvalPlan(["synth-math"], specs, **kw), None)
    many = run_eval(model, EvalPlan(["synth-math"], specs, batch_size=3, **kw), None)
    assert [record_key(r) for r in many] == [record_key(r) for r in one]
    assert [sorted(r) for r in many] == [sorted(r) for r in one]
    assert [r["token_ids"] for r in many] == [r["token_ids"] for r in one]
    assert [r["nfe"] for r in many] == [r["nfe"] for r in one]
