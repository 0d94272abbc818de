"""``eval --batch-size R``: the same records (fields, samples, tokens) as batch 1."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from specfold.api import load_model
from specfold.config import MethodConfig
from specfold.eval.harness import EvalPlan, read_records, record_key, run_eval


def test_batched_eval_writes_the_batch_one_records(text_ckpt: Path):
    model = load_model(text_ckpt, dtype="fp64")
    kw = dict(limit=5, max_new_tokens=16, block_size=8, threshold=0.5)
    specs = [MethodConfig("vanilla"), MethodConfig("spiffy", budget=3), MethodConfig("specfold", budget=3, delta=0.0)]
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


def test_batched_records_share_the_batch_wall_time(text_ckpt: Path):
    """At batch R the records' wall-time shares sum to the batch's decode time (each the time since the previous
    request finished, split among those finishing together), each keeps its own per-request seconds and batch 1's
    tokens. (How fast that is belongs to ``specfold bench batch``.)"""
    model = load_model(text_ckpt, dtype="fp64")
    kw = dict(limit=6, max_new_tokens=16, block_size=8, threshold=0.5)
    one = run_eval(model, EvalPlan(["synth-math"], [MethodConfig("vanilla")], **kw), None)
    t0 = time.perf_counter()
    recs = run_eval(model, EvalPlan(["synth-math"], [MethodConfig("vanilla")], batch_size=3, **kw), None)
    elapsed = time.perf_counter() - t0
    assert [r["token_ids"] for r in recs] == [r["token_ids"] for r in one]
    assert all(r["wall_seconds"] >= 0 for r in recs) and 0 < sum(r["wall_seconds"] for r in recs) < elapsed
    assert sum(r["wall_seconds"] for r in recs) >= max(r["seconds"] for r in recs)  # the batch outlasts each request
    assert all(r["seconds"] > 0 for r in recs)


def test_batched_eval_appends_each_record_as_its_request_finishes(text_ckpt: Path, tmp_path: Path):
    """A kill in the middle of a batched eval keeps the records of the requests that had finished: each is on disk
    before the next request ends (here: the file is read at every progress report), and a resume completes the set."""
    model = load_model(text_ckpt, dtype="fp64")
    kw = dict(limit=6, max_new_tokens=16, block_size=8, threshold=0.5, batch_size=3)
    out = tmp_path / "batched.jsonl"
    seen: list[int] = []

    class Killed(Exception):
        pass

    def watch(p) -> None:
        seen.append(len(read_records(out)))
        if p.done == 4:
            raise Killed

    with pytest.raises(Killed):
        run_eval(model, EvalPlan(["synth-math"], [MethodConfig("vanilla")], **kw), out, watch)
    assert seen == [1, 2, 3, 4]  # written one by one, not after the whole decode
    assert len(read_records(out)) == 4
    full = run_eval(model, EvalPlan(["synth-math"], [MethodConfig("vanilla")], **kw), out)
    assert len(read_records(out)) == 6 == len({record_key(r) for r in read_records(out)}) == len(full)


def test_summary_counts_the_batch_wall_time_once():
    """Throughput = tokens ÷ the sum of the records' wall-time shares (the batch's wall time, once), while latency
    stays the mean per-request seconds; at batch 1 (no ``wall_seconds``) both come from ``seconds``."""
    from specfold.eval.harness import summarize

    def rec(tokens: int, seconds: float, wall: float | None) -> dict:
        r = {"task": "t", "method": "vanilla", "correct": True, "nfe": 4, "generated_tokens": tokens,
             "seconds": seconds}
        return r if wall is None else {**r, "wall_seconds": wall}

    batched = summarize([rec(10, 1.0, 0.5), rec(20, 2.0, 0.5), rec(30, 3.0, 0.5)])["t"]["vanilla"]
    assert batched["tokens_per_second"] == 60 / 1.5  # not 60 / 6.0: the three requests overlapped in one batch
    assert batched["latency_seconds"] == 2.0
    single = summarize([rec(10, 1.0, None), rec(20, 2.0, None), rec(30, 3.0, None)])["t"]["vanilla"]
    assert (single["tokens_per_second"], single["latency_seconds"]) == (60 / 6.0, 2.0)
