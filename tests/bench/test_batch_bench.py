"""bench batch: its figures are consistent with the decodes it ran (not timings), in fp64 on a tiny model."""

from __future__ import annotations

import json

import pytest
import torch

from specfold.api import load_model, prepare_method
from specfold.bench.batch import BatchBenchConfig, bench_batch, random_shape_model
from specfold.config import DecodeConfig, MethodConfig
from specfold.decoding.decoder import decode


def test_points_match_the_batch_one_decodes(fd_ckpt):
    model = load_model(fd_ckpt, dtype="fp64")
    n = model.config.block_size
    cfg = DecodeConfig(block_size=n, small_block_size=n // 2, threshold=0.5, max_new_tokens=n)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 200, (t,), generator=g).tolist() for t in (3, n, n + 5)]
    methods = {"vanilla": prepare_method(model, MethodConfig(), cfg)}
    points = bench_batch(model, prompts, cfg, methods, BatchBenchConfig((1, 2), repeats=2))
    assert [(p.method, p.batch_size) for p in points] == [("vanilla", 1), ("vanilla", 2)]
    alone = [decode(model, p, cfg) for p in prompts]
    for p in points:
        assert p.requests == 3 and p.repeats == 2 and p.agreement == 1.0  # fp64: the batch is batch 1, exactly
        assert p.generated_tokens == sum(r.generated_tokens for r in alone)
        assert p.nfe == sum(r.nfe for r in alone) and p.accepted_drafts == 0 and p.fold_ratio is None
        assert 0 < p.latency_p50 <= p.latency_p95 <= p.wall_seconds  # the wall covers the whole queue
    with pytest.raises(ValueError, match="batch sizes must be positive"):
        BatchBenchConfig((0,))


def test_random_shape_model_has_the_shape():
    model = random_shape_model("nld-8b", layers=1, vocab=64, dtype=torch.float32)
    c = model.config
    assert (c.hidden_size, c.num_heads, c.num_kv_heads, c.intermediate_size, c.num_layers, c.vocab_size) == (
        4096, 32, 8, 14336, 1, 64)
    assert (model.mask_id, model.stop_id) == (63, 62)
    with pytest.raises(ValueError, match="unknown shape"):
        random_shape_model("gpt-5", layers=1)


def test_cli_bench_batch_json(capsys):
    from specfold.cli import main

    assert main(["bench", "batch", "--prompts", "2", "--batch-sizes", "1,2", "--methods", "vanilla,spiffy",
                 "--max-new-tokens", "8", "--dtype", "fp32", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["method"], r["batch_size"]) for r in rows] == [("vanilla", 1), ("spiffy", 1), ("vanilla", 2),
                                                                ("spiffy", 2)]
    assert all(r["requests"] == 2 and r["model"] == "embedded" for r in rows)
    by = {(r["method"], r["batch_size"]): r for r in rows}
    assert by["spiffy", 1]["generated_tokens"] == by["vanilla", 1]["generated_tokens"]  # lossless: same tokens


def test_cli_bench_batch_without_batch_one(capsys):
    """Without R = 1 in the grid there is no batch-1 decode to agree with: agreement is null in the JSON (valid
    JSON, no NaN) and '-' in the table, as is 'vs R=1'."""
    from specfold.cli import main

    args = ["bench", "batch", "--prompts", "2", "--batch-sizes", "2", "--methods", "vanilla", "--max-new-tokens", "8",
            "--dtype", "fp32"]
    assert main([*args, "--json"]) == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert row["batch_size"] == 2 and row["agreement"] is None
    assert main(args) == 0
    line = capsys.readouterr().out.splitlines()[-1].split()
    assert line[:2] == ["2", "vanilla"] and line[3] == "-" and line[-1] == "-"


def test_cli_bench_batch_eager_and_compiled(capsys, monkeypatch):
    """--eager-and-compiled runs each method eager and compiled in the same rounds: JSON points name the method and
    say which (``compiled``), the compiled twin decodes the eager tokens (same generated tokens and NFE), the table
    adds 'vs eager'; with --compile or --no-compile as well it is refused in one line. (Dynamo's eager backend: the
    same graphs without inductor's C++ build.)"""
    import specfold.engine.compiled as compiled
    from specfold.cli import main

    monkeypatch.setattr(compiled, "BACKEND", "eager")
    args = ["bench", "batch", "--prompts", "2", "--batch-sizes", "1,2", "--methods", "vanilla,specfold",
            "--max-new-tokens", "8", "--dtype", "fp32", "--eager-and-compiled"]
    assert main([*args, "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["method"], r["compiled"], r["batch_size"]) for r in rows] == [
        (m, c, b) for b in (1, 2) for m in ("vanilla", "specfold") for c in (False, True)]
    by = {(r["method"], r["compiled"], r["batch_size"]): r for r in rows}
    for m in ("vanilla", "specfold"):
        for b in (1, 2):
            eager, comp = by[m, False, b], by[m, True, b]
            assert (comp["generated_tokens"], comp["nfe"]) == (eager["generated_tokens"], eager["nfe"])
    assert main(args) == 0
    out = capsys.readouterr().out.splitlines()
    header = next(line for line in out if line.split()[:2] == ["R", "method"])
    assert header.split()[-2:] == ["vs", "eager"]
    assert any(line.split()[:2] == ["1", "specfold+compile"] for line in out)
    assert main([*args, "--no-compile"]) == 2
    assert "--eager-and-compiled runs both" in capsys.readouterr().err
