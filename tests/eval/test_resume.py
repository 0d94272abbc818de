"""A killed eval resumes: no duplicates, no lost records, a torn last line tolerated and cut."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specfold.api import load_model
from specfold.config import MethodConfig
from specfold.eval.harness import EvalPlan, read_records, record_key, repair_tail, run_eval

KILL_AFTER = 3


class Killed(Exception):
    pass


def plan() -> EvalPlan:
    return EvalPlan(
        tasks=["synth-math"],
        methods=[MethodConfig("vanilla"), MethodConfig("spiffy", budget=3)],
        limit=3,
        max_new_tokens=8,
        block_size=8,
        threshold=1.0,
    )


def by_key(records: list[dict]) -> dict[str, list[int]]:
    return {record_key(r): r["token_ids"] for r in records}


def test_killed_run_resumes_to_the_single_run_set(text_ckpt: Path, tmp_path: Path):
    model = load_model(text_ckpt)
    single = run_eval(model, plan(), tmp_path / "single.jsonl")
    assert len(single) == 6

    out = tmp_path / "killed.jsonl"

    def die(p) -> None:
        if p.done == KILL_AFTER:
            raise Killed

    with pytest.raises(Killed):
        run_eval(model, plan(), out, die)
    first_lines = out.read_text().splitlines()
    assert len(first_lines) == KILL_AFTER
    with open(out, "a") as f:  # killed in the middle of writing the next record
        f.write(json.dumps(single[KILL_AFTER])[:40])

    resumed = run_eval(model, plan(), out)
    lines = out.read_text().splitlines()
    assert lines[:KILL_AFTER] == first_lines  # done records are not redone
    assert all(json.loads(line) for line in lines)  # the torn fragment is gone, no record glued to it
    on_disk = read_records(out)
    assert len(on_disk) == len({record_key(r) for r in on_disk}) == 6
    assert by_key(on_disk) == by_key(resumed) == by_key(single)

    again = run_eval(model, plan(), out)  # a finished run has nothing left to do
    assert out.read_text().splitlines() == lines and by_key(again) == by_key(single)


def test_repair_tail(tmp_path: Path):
    path = tmp_path / "r.jsonl"
    repair_tail(path)  # missing file: nothing to do
    path.write_text('{"a": 1}\n{"b": ')
    repair_tail(path)
    assert path.read_text() == '{"a": 1}\n'
    path.write_text('{"a"')
    repair_tail(path)
    assert path.read_text() == ""
    path.write_text('{"a": 1}\n')
    repair_tail(path)
    assert path.read_text() == '{"a": 1}\n'
