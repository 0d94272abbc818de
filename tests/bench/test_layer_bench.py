"""``specfold bench layer``: the fields it reports, its FLOP limit checked against the formula worked out by hand, and
that the three executions it times compute the layer they stand for (fp64). Timings are not asserted: they belong to
the benchmark's readers (how they are taken is ``tests/bench/test_timing.py``'s)."""

from __future__ import annotations

import json

import pytest
import torch

from specfold.bench.layer import SHAPES, LayerShape, bench_layer, flop_limit_ratio, layer_case
from specfold.cli import main

FIELDS = {"shape", "fold_ratio", "realised_fold_ratio", "branches", "block", "prefix", "dtype", "dense_seconds",
          "folded_seconds", "dense_spread", "folded_spread", "ratio", "flop_limit_ratio", "repeats", "threads"}


def test_flop_limit_of_a_tiny_shape_by_hand():
    shape = LayerShape(hidden=4, heads=2, kv_heads=1, head_dim=3, ffn=5, qkv_bias=False, vocab=16, layers=1)
    # per row: qkv 4·(2 + 2)·3 = 48, attention 2·2·3·(6 + 2) = 96, o 2·3·4 = 24, ffn 3·4·5 = 60
    # dense: K·N = 3·2 rows of everything = 6·228 = 1368
    # folded: 4 recomputed rows of qkv + attention + ffn = 4·204 = 816, o on all 6 rows = 144, and Eq. 8 for
    # corrected rows with |Δ| = 1 and 2: 4·(1 + 2)·Hq·D = 4·3·6 = 72; total 1032
    got = flop_limit_ratio(shape, k=3, n=2, prefix=6, recomputed=4, delta_sizes=torch.tensor([1, 2]))
    assert got == pytest.approx(1032 / 1368, rel=1e-12)
    assert flop_limit_ratio(shape, 3, 2, 6, 6, torch.tensor([], dtype=torch.long)) == 1.0  # nothing folded


# fast-dllm-v2-1.5b (E 1536, Hq 12, Hkv 2, D 128, F 8960) with B = 2 branches, N = 4, P = 8, per row:
QKV, ATTN, OPROJ, FFN = 1536 * 16 * 128, 2 * 12 * 128 * (8 + 4), 12 * 128 * 1536, 3 * 1536 * 8960
K, N, B = 3, 4, 2
DENSE = K * N * (QKV + ATTN + OPROJ + FFN)


def test_bench_layer_json_fields_and_limits(capsys):
    argv = ["bench", "layer", "--shape", "fast-dllm-v2-1.5b", "--fold-ratio", "1", "--branches", str(B), "--block",
            str(N), "--prefix", "8", "--repeats", "2", "--threads", "1", "--dtype", "fp32", "--json"]
    assert main(argv) == 0
    [r] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert FIELDS <= r.keys()
    assert (r["shape"], r["fold_ratio"], r["branches"], r["block"], r["prefix"], r["dtype"], r["repeats"],
            r["threads"]) == ("fast-dllm-v2-1.5b", 1.0, B, N, 8, "float32", 2, 1)
    assert r["dense_seconds"] > 0 and r["folded_seconds"] > 0 and r["dense_spread"] >= 0 <= r["folded_spread"]
    # every draft row folds: only the main branch's N rows are recomputed, no context changes (Δ = ∅), o on all
    assert r["realised_fold_ratio"] == 1.0
    assert r["flop_limit_ratio"] == pytest.approx((N * (QKV + ATTN + FFN) + K * N * OPROJ) / DENSE, rel=1e-12)


TINY = LayerShape(hidden=16, heads=4, kv_heads=2, head_dim=4, ffn=24, qkv_bias=True, vocab=16, layers=1)


@pytest.mark.parametrize("fold", [0.0, 0.5])
def test_limit_of_a_drawn_mask_is_within_the_hand_bounds(monkeypatch, fold):
    monkeypatch.setitem(SHAPES, "tiny", TINY)
    b, n, p = 6, 8, 5
    r = bench_layer("tiny", fold, branches=b, block=n, prefix=p, dtype=torch.float32, repeats=1)
    qkv, attn, o, ffn = 16 * 8 * 4, 2 * 4 * 4 * (p + n), 4 * 4 * 16, 3 * 16 * 24
    dense = (b + 1) * n * (qkv + attn + o + ffn)
    f = r.realised_fold_ratio
    assert f * b * n == pytest.approx(round(f * b * n))  # a fraction of the B·N draft rows
    # R = N + (1 − f̂)·B·N recomputed rows, plus Eq. 8's 4·|Δ|·Hq·D for each folded row with |Δ| ≤ N
    lower = ((n + (1 - f) * b * n) * (qkv + attn + ffn) + (b + 1) * n * o) / dense
    upper = lower + f * b * n * 4 * n * 4 * 4 / dense
    if fold == 0.0:
        assert f == 0.0 and r.flop_limit_ratio == 1.0
    else:
        assert 0.2 < f < 0.8 and lower < r.flop_limit_ratio <= upper  # some folded rows' context changed


@pytest.mark.parametrize("fold", [0.0, 0.5, 1.0])
def test_the_timed_executions_compute_the_layer(monkeypatch, fold):
    """What is timed is what the figures claim: the folded layer with nothing folded is the dense layer (up to
    reassociation), the main branch never folds, and the *rows* limit computes the main branch's rows as dense does
    (its other rows are a timing proxy: they attend to the main branch's block keys)."""
    monkeypatch.setitem(SHAPES, "tiny", TINY)
    n = 8
    case = layer_case("tiny", fold, branches=6, block=n, prefix=5, dtype=torch.float64)
    with torch.no_grad():
        dense, folded, rows = case.dense(), case.folded(), case.rows()
    assert not case.fold[0].any()
    torch.testing.assert_close(folded[:n], dense[:n], rtol=0, atol=1e-12)
    torch.testing.assert_close(rows[:n], dense[:n], rtol=0, atol=1e-12)
    assert rows.shape[0] == int((~case.fold).sum())
    if fold == 0.0:
        torch.testing.assert_close(folded, dense, rtol=0, atol=1e-12)


@pytest.mark.parametrize("argv, message", [
    (["--shape", "gpt-9"], "unknown layer shape 'gpt-9'"),
    (["--fold-ratio", "1.5"], "fold ratio must be in [0, 1]"),
])
def test_bench_layer_bad_input_is_one_line(capsys, argv, message):
    assert main(["bench", "layer", *argv, "--repeats", "1", "--dtype", "fp32"]) == 2  # no --dtype auto note
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
