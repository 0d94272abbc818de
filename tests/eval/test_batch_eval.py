"""``eval --batch-size R``: the same records (fields, samples, tokens) as batch 1."""

from __future__ import annotations

from pathlib import Path

from specfold.api import load_model
from specfold.eval.harness import EvalPlan, MethodSpec, record_key, run_eval


def test_batched_eval_writes_the_batch_one_records(text_ckpt: Path):
    model = load_model(text_ckpt, dtype="fp64")
    kw = dict(limit=5, max_new_tokens=16, block_size=8, threshold=0.5)
    specs = [MethodSpec("vanilla"), MethodSpec("spiffy", budget=3), MethodSpec("specfold", budget=3, delta=0.0)]
    one = run_eval(model, EvalPlan(["synth-math"], specs, **kw), None)
    many = run_eval(model, EvalPlan(["synth-math"], specs, batch_size=3, **kw), None)
    assert [record_key(r) for r in many] == [record_key(r) for r in one]
    assert [sorted(r) for r in many] == [sorted(r) for r in one]
    assert [r["token_ids"] for r in many] == [r["token_ids"] for r in one]
    assert [r["nfe"] for r in many] == [r["nfe"] for r in one]
    assert [r["accepted_drafts"] for r in many] == [r["accepted_drafts"] for r in one]
    vanilla = {r["sample_id"]: r["token_ids"] for r in one if r["method"] == "vanilla"}
    assert all(r["token_ids"] == vanilla[r["sample_id"]] for r in many)  # lossless methods: vanilla's tokens
    assert all(r["wall_seconds"] == r["seconds"] for r in one)


def test_batched_summary_counts_the_batch_wall_time_once(text_ckpt: Path):
    """At batch R the records' wall-time shares sum to the batch's wall time: throughput = tokens ÷ that sum,
    while latency stays the mean per-request seconds."""
    import time

    from specfold.eval.harness import summarize

    model = load_model(text_ckpt, dtype="fp64")
    plan = EvalPlan(["synth-math"], [MethodSpec("vanilla")], batch_size=3, limit=6, max_new_tokens=16, block_size=8,
                    threshold=0.5)
    t0 = time.perf_counter()
    recs = run_eval(model, plan, None)
    elapsed = time.perf_counter() - t0
    wall = sum(r["wall_seconds"] for r in recs)
    assert len({r["wall_seconds"] for r in recs}) == 1 and 0 < wall < elapsed
    assert sum(r["seconds"] for r in recs) > wall  # requests overlap in the batch
    row = summarize(recs)["synth-math"]["vanilla"]
    assert row["tokens_per_second"] == sum(r["generated_tokens"] for r in recs) / wall
    assert row["latency_seconds"] == sum(r["seconds"] for r in recs) / 6
