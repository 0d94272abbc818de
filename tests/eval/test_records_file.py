"""An eval output is checked before anything in it changes, held by one writer at a time, and never gets a record
twice; readers (merge, plot) count the lines they skip instead of dropping them without a word."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specfold.api import load_model
from specfold.cli import main
from specfold.config import MethodConfig
from specfold.eval.harness import EvalPlan, run_eval
from specfold.eval.records import RecordsWriter, read_records, scan_records
from specfold.validation import ValidationError

RECORD = {"task": "synth-math", "method": "vanilla", "sample_id": "0", "token_ids": [1]}


def plan(**kw) -> EvalPlan:
    base = dict(tasks=["synth-math"], methods=[MethodConfig("vanilla")], limit=1, max_new_tokens=8, block_size=8,
                threshold=1.0)
    return EvalPlan(**{**base, **kw})


FOREIGN = {
    "text without final newline": b"my notes\nthe last line has no newline",
    "one text line": b"just one line, no newline",
    "binary": bytes(range(256)) * 8,
    "other JSONL": b'{"a": 1}\n{"b": 2}\n{"c": 3',
    "records then text": json.dumps(RECORD).encode() + b"\nsome text\n",
}


@pytest.mark.parametrize("name", list(FOREIGN))
def test_a_file_that_is_not_records_is_refused_byte_identical(text_ckpt: Path, tmp_path: Path, name: str):
    model = load_model(text_ckpt)
    out = tmp_path / "notes.txt"
    out.write_bytes(FOREIGN[name])
    for overwrite in (False, True):
        with pytest.raises(ValidationError, match="not .*records file"):
            run_eval(model, plan(), out, overwrite=overwrite)
        assert out.read_bytes() == FOREIGN[name]


def test_cli_refuses_a_foreign_out_before_loading_with_one_line(tmp_path: Path, capsys):
    out = tmp_path / "notes.txt"
    out.write_bytes(FOREIGN["text without final newline"])
    code = main(["eval", "--model", str(tmp_path / "no-such-model"), "--tasks", "synth-math", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "not a records file" in err  # before the missing model
    assert out.read_bytes() == FOREIGN["text without final newline"]


def test_a_torn_record_is_cut_and_a_whole_unterminated_one_kept(tmp_path: Path):
    out = tmp_path / "r.jsonl"
    out.write_text(json.dumps(RECORD) + "\n" + json.dumps(RECORD)[:20])
    with RecordsWriter(out) as w:
        assert w.existing == [RECORD]
    assert out.read_text() == json.dumps(RECORD) + "\n"
    out.write_text(json.dumps(RECORD))  # killed between the record and its newline
    with RecordsWriter(out) as w:
        assert w.existing == [RECORD]
        w.append({**RECORD, "sample_id": "1"})
    assert [r["sample_id"] for r in read_records(out)] == ["0", "1"]


def test_a_second_writer_is_refused_with_one_line(text_ckpt: Path, tmp_path: Path):
    out = tmp_path / "r.jsonl"
    out.write_text(json.dumps(RECORD) + "\n")
    before = out.read_bytes()
    with RecordsWriter(out):  # the first writer holds the lock for its whole run
        with pytest.raises(ValidationError, match="being written by another") as info:
            run_eval(load_model(text_ckpt), plan(), out)
        assert "\n" not in str(info.value)
        assert out.read_bytes() == before
    with RecordsWriter(out):  # released when the first one closed
        pass


def test_a_second_writer_process_is_refused(text_ckpt: Path, tmp_path: Path):
    import subprocess
    import sys

    out = tmp_path / "r.jsonl"
    with RecordsWriter(out):
        proc = subprocess.run(
            [sys.executable, "-m", "specfold.cli", "eval", "--model", str(text_ckpt), "--tasks", "synth-math",
             "--limit", "1", "--max-new-tokens", "8", "--block-size", "8", "--out", str(out)],
            capture_output=True, text=True, timeout=120,
        )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "being written by another" in proc.stderr
    assert out.read_bytes() == b""


@pytest.mark.parametrize(
    "kw, what",
    [
        (dict(tasks=["synth-math", "synth-math"]), "task 'synth-math' is listed twice"),
        (dict(methods=[MethodConfig("vanilla"), MethodConfig("vanilla")]), "method 'vanilla' is listed twice"),
    ],
)
def test_a_task_or_method_twice_is_refused(text_ckpt: Path, tmp_path: Path, kw, what):
    out = tmp_path / "r.jsonl"
    with pytest.raises(ValueError, match=what):
        run_eval(load_model(text_ckpt), plan(**kw), out)
    assert not out.exists() or out.read_bytes() == b""


def test_cli_tasks_twice_is_one_line(tmp_path: Path, capsys):
    code = main(["eval", "--tasks", "synth-math,synth-math", "--out", str(tmp_path / "r.jsonl")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "listed twice" in err


def test_scan_counts_corrupt_lines_and_a_torn_tail(tmp_path: Path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(RECORD) + "\nnot json\n" + json.dumps(RECORD) + '\n[1, 2]\n{"task": "syn')
    scan = scan_records(path)
    assert len(scan.records) == 2 and scan.corrupt == [2, 4] and scan.torn
    assert "2 corrupt line(s) skipped (line 2, 4)" in scan.describe(path) and "torn" in scan.describe(path)


def test_merge_reports_corrupt_lines_by_count(tmp_path: Path, capsys):
    a, b, out = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "m.jsonl"
    a.write_text(json.dumps(RECORD) + "\n{corrupt\n" + json.dumps({**RECORD, "sample_id": "2"}) + "\n")
    b.write_text(json.dumps({**RECORD, "sample_id": "1"}) + "\n")
    assert main(["merge", str(a), str(b), "--out", str(out), "--json"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out)["skipped_lines"] == {str(a): 1}
    assert f"{a}: 1 corrupt line(s) skipped (line 2)" in cap.err
    assert len(read_records(out)) == 3
