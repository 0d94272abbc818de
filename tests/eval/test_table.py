"""Table 1: ``summarize`` and ``format_table`` against numbers worked out by hand from a small record file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specfold.eval.harness import format_table, read_records, summarize


def _rec(task, method, label, sample, correct, nfe, nfe_denoise, tokens, seconds, **extra):
    rec = {"task": task, "method": method, "sample_id": f"{task}/test/{sample:05d}", "correct": correct, "nfe": nfe,
           "nfe_denoise": nfe_denoise, "generated_tokens": tokens, "seconds": seconds, **extra}
    if label is not None:
        rec["label"] = label
    return rec


SPEC = "specfold[delta=0.1]"
RECORDS = [
    _rec("synth-math", "vanilla", "vanilla", 0, True, 10, 8, 20, 1.0),
    _rec("synth-math", "specfold", SPEC, 0, True, 6, 4, 20, 0.5, accepted_drafts=3, boundary_drafts=1,
         draft_triples=100.0,
         folded_triples=50.0, ffn_folded_triples=60.0, guard_fallbacks=1.0),
    _rec("synth-math", "spiffy", None, 0, False, 9, 6, 27, 1.8, accepted_drafts=3),  # no label: the method names it
    _rec("synth-math", "vanilla", "vanilla", 1, False, 14, 12, 28, 3.0),
    _rec("synth-math", "specfold", SPEC, 1, True, 6, 4, 28, 1.5, accepted_drafts=5, draft_triples=300.0,
         folded_triples=100.0, ffn_folded_triples=100.0, guard_fallbacks=2.0),
    # a task without vanilla (no ratios), a record without nfe_denoise (its NFE are the passes), zero seconds
    {k: v for k, v in _rec("synth-code", "specfold", SPEC, 0, True, 5, 0, 10, 0.0, accepted_drafts=10).items()
     if k != "nfe_denoise"},
]

# By hand. synth-math vanilla: 1 of 2 correct; NFE (10 + 14) / 2 = 12; tokens 48 over 24 forwards = 2 per forward,
# over 4 s = 12 tok/s. specfold: 2 of 2; NFE 6; 48 / 12 = 4 tok/fwd; 48 / 2 s = 24 tok/s; accepted 8 over 8
# denoise passes = 1; 1 boundary draft over 2 samples = 0.5;
# folded 150 of 400 draft triples = 0.375 (FFN gate: 160 of 400 = 0.4); guard 1 + 2.
# spiffy: NFE 9, 27 / 9 = 3 tok/fwd,
# 27 / 1.8 = 15 tok/s, 3 accepted over 6 passes. Ratios to vanilla: NFE 6 / 12, 9 / 12; tok/s 24 / 12, 15 / 12.
# synth-code specfold: 10 accepted over 5 passes (no nfe_denoise: the NFE), 0 s -> 0 tok/s. Latency: mean seconds
# per sample (2.0, 1.0, 1.8, 0.0). No record has wall_seconds (batch 1): throughput uses seconds.
WANT = {
    "synth-math": {
        "vanilla": {"n": 2, "accuracy": 0.5, "nfe_per_sample": 12.0, "tokens_per_forward": 2.0,
                    "tokens_per_second": 12.0, "latency_seconds": 2.0, "generated_tokens_per_sample": 24.0,
                    "nfe_vs_vanilla": 1.0,
                    "tps_vs_vanilla": 1.0},
        SPEC: {"n": 2, "accuracy": 1.0, "nfe_per_sample": 6.0, "tokens_per_forward": 4.0, "tokens_per_second": 24.0,
               "latency_seconds": 1.0, "generated_tokens_per_sample": 24.0, "accepted_per_step": 1.0,
               "boundary_drafts_per_sample": 0.5, "fold_ratio": 0.375, "ffn_fold_ratio": 0.4,
               "guard_fallbacks": 3.0, "nfe_vs_vanilla": 0.5, "tps_vs_vanilla": 2.0},
        "spiffy": {"n": 1, "accuracy": 0.0, "nfe_per_sample": 9.0, "tokens_per_forward": 3.0,
                   "tokens_per_second": 15.0, "latency_seconds": 1.8, "generated_tokens_per_sample": 27.0,
                   "accepted_per_step": 0.5, "boundary_drafts_per_sample": 0.0,
                   "nfe_vs_vanilla": 0.75, "tps_vs_vanilla": 1.25},
    },
    "synth-code": {
        SPEC: {"n": 1, "accuracy": 1.0, "nfe_per_sample": 5.0, "tokens_per_forward": 2.0, "tokens_per_second": 0.0,
               "latency_seconds": 0.0, "generated_tokens_per_sample": 10.0, "accepted_per_step": 2.0,
               "boundary_drafts_per_sample": 0.0},
    },
}

# The same numbers as text: accuracy in %, NFE and tok/s to one decimal, ratios and tok/fwd to two, "-" where a
# column does not apply; the task and method columns are as wide as the longest name (10 and 19).
TABLE = """\
task       method                 acc     NFE   NFE×    tok/s   TPS× tok/fwd acc/step  fold   ffn
-------------------------------------------------------------------------------------------------
synth-math vanilla              50.0%    12.0   1.00     12.0   1.00    2.00        -     -     -
synth-math specfold[delta=0.1] 100.0%     6.0   0.50     24.0   2.00    4.00     1.00  0.38  0.40
synth-math spiffy                0.0%     9.0   0.75     15.0   1.25    3.00     0.50     -     -
synth-code specfold[delta=0.1] 100.0%     5.0      -      0.0      -    2.00     2.00     -     -"""


@pytest.fixture
def records(tmp_path: Path) -> list[dict]:
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    return read_records(path)


def test_summary_equals_the_numbers_worked_out_by_hand(records):
    got = summarize(records)
    assert list(got) == list(WANT)  # tasks, and methods within a task, in the order of the records
    for task, rows in WANT.items():
        assert list(got[task]) == list(rows)
        for label, want in rows.items():
            assert got[task][label] == pytest.approx(want, rel=1e-12), (task, label)


def test_table_text(records):
    table = format_table(summarize(records))
    assert table == TABLE
    assert len({len(line) for line in table.splitlines()}) == 1  # every row as wide as the header
