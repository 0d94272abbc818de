"""Data-parallel eval: two CPU processes on disjoint shards, merged, equal the single-process run; merge reports
duplicates and conflicts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from specfold.api import load_model
from specfold.cli import main
from specfold.config import MethodConfig
from specfold.eval.harness import EvalPlan, read_records, record_key, run_eval

SHARDS = 2
LIMIT = 4
SHARD_TIMEOUT_S = 120
ONE_THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # tiny GEMMs; threads only spin on 2 cores


def shard_argv(ckpt: Path, out: Path, shard: int) -> list[str]:
    return [sys.executable, "-m", "specfold.cli", "eval", "--model", str(ckpt), "--tasks", "synth-math",
            "--limit", str(LIMIT), "--max-new-tokens", "16", "--block-size", "8", "--threshold", "1",
            "--methods", "vanilla,spiffy", "--budget", "3", "--num-shards", str(SHARDS), "--shard-id", str(shard),
            "--out", str(out), "--json"]


def test_two_processes_merge_to_the_single_run(text_ckpt: Path, tmp_path: Path, capsys):
    env = {**os.environ, **ONE_THREAD_ENV}
    outs = [tmp_path / f"shard{i}.jsonl" for i in range(SHARDS)]
    procs = [subprocess.Popen(shard_argv(text_ckpt, outs[i], i), env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(SHARDS)]
    model = load_model(text_ckpt)  # the single-process reference runs meanwhile
    single = run_eval(model, EvalPlan(["synth-math"], [MethodConfig("vanilla"), MethodConfig("spiffy", budget=3)],
                                      limit=LIMIT, max_new_tokens=16, block_size=8, threshold=1.0), None)
    for p in procs:
        _, err = p.communicate(timeout=SHARD_TIMEOUT_S)
        assert p.returncode == 0, err
    shard_ids = [{r["sample_id"] for r in read_records(o)} for o in outs]
    assert shard_ids[0] and shard_ids[1] and not shard_ids[0] & shard_ids[1]  # disjoint, both non-empty

    merged = tmp_path / "all.jsonl"
    assert main(["merge", *map(str, outs), "--out", str(merged), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["records"] == len(single) == 2 * LIMIT and report["conflicts"] == [] and report["duplicates"] == 0
    recs = read_records(merged)
    keys = [record_key(r) for r in recs]
    assert len(keys) == len(set(keys))
    assert {record_key(r): r["token_ids"] for r in recs} == {record_key(r): r["token_ids"] for r in single}


def test_merge_reports_duplicates_and_conflicts(tmp_path: Path, capsys):
    base = {"task": "t", "method": "vanilla", "label": "vanilla", "params": {}, "correct": True, "nfe": 3,
            "nfe_denoise": 2, "generated_tokens": 2, "text": "ab"}
    a = [dict(base, sample_id="s0", token_ids=[1, 2], seconds=0.1), dict(base, sample_id="s1", token_ids=[3, 4])]
    b = [dict(base, sample_id="s0", token_ids=[1, 2], seconds=0.2),  # same outcome, other timing: duplicate
         dict(base, sample_id="s1", token_ids=[3, 5]),  # different tokens: conflict
         dict(base, sample_id="s2", token_ids=[6])]
    for name, recs in (("a", a), ("b", b)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs) + '{"torn')
    out = tmp_path / "m.jsonl"
    code = main(["merge", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), "--out", str(out), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1
    assert (report["records"], report["duplicates"], len(report["conflicts"])) == (3, 1, 1)
    assert report["conflicts"][0]["sample_id"] == "s1" and report["conflicts"][0]["fields"] == ["token_ids"]
    assert [r["token_ids"] for r in read_records(out)] == [[1, 2], [3, 4], [6]]  # first kept
    assert main(["merge", str(tmp_path / "missing.jsonl"), "--out", str(out)]) == 2


def test_torchrun_two_processes_merge_to_the_single_run(text_ckpt: Path, tmp_path: Path, capsys):
    """``torchrun --nproc-per-node 2 -m specfold.cli eval`` shards by RANK / WORLD_SIZE; the merge equals one run."""
    torchrun = Path(sys.executable).with_name("torchrun")
    out = tmp_path / "run.jsonl"
    argv = shard_argv(text_ckpt, out, 0)
    at = argv.index("--num-shards")
    del argv[at : at + 4]  # no --num-shards / --shard-id: the launcher's RANK / WORLD_SIZE decide
    argv = [str(torchrun), "--nproc-per-node", str(SHARDS), "--master-port", "29531", *argv[1:], "--batch-size", "2"]
    env = {**os.environ, **ONE_THREAD_ENV, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=2 * SHARD_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-2000:]
    outs = [tmp_path / f"run.rank{r}-of-{SHARDS}.jsonl" for r in range(SHARDS)]
    assert all(read_records(o) for o in outs)
    model = load_model(text_ckpt)
    single = run_eval(model, EvalPlan(["synth-math"], [MethodConfig("vanilla"), MethodConfig("spiffy", budget=3)],
                                      limit=LIMIT, max_new_tokens=16, block_size=8, threshold=1.0), None)
    merged = tmp_path / "all.jsonl"
    assert main(["merge", *map(str, outs), "--out", str(merged), "--json"]) == 0
    capsys.readouterr()
    recs = read_records(merged)
    assert {record_key(r): r["token_ids"] for r in recs} == {record_key(r): r["token_ids"] for r in single}
