"""Faults end with one line: a full disk, a read-only path or a denied permission (``specfold: error: PATH:
reason``, exit 2), Ctrl-C (exit 130); a multi-file output is written all-or-nothing."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specfold.cli import main
from specfold.io import atomic_outputs

pytestmark = pytest.mark.usefixtures("one_thread")

RECORD = {"task": "synth-math", "method": "vanilla", "sample_id": "0", "token_ids": [1]}


def _fault(code: int):
    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code), str(args[0]) if args else None)

    return fail


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EACCES])
def test_an_os_error_is_one_line(tmp_path: Path, capsys, monkeypatch, code: int):
    import specfold.eval.merge as merge

    src = tmp_path / "a.jsonl"
    src.write_text(json.dumps(RECORD) + "\n")
    monkeypatch.setattr(merge, "atomic_write_text", _fault(code))
    assert main(["merge", str(src), "--out", str(tmp_path / "m.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("specfold: error: ") and os.strerror(code) in err
    assert "Traceback" not in err and "[Errno" not in err


def test_atomic_outputs_are_all_or_nothing(tmp_path: Path):
    a, b, c = tmp_path / "g.counts.json", tmp_path / "g.paths.json", tmp_path / "g.json"
    a.write_text("old counts")  # an earlier calibration's file stays as it was
    with pytest.raises(OSError, match="No space"):
        with atomic_outputs(a, b, c) as (ta, tb, tc):
            ta.write_text("new counts")
            tb.write_text("new paths")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tc))  # the graph did not fit
    assert a.read_text() == "old counts" and not b.exists() and not c.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.counts.json"]  # no temporary file left behind
    with atomic_outputs(a, b, c) as (ta, tb, tc):
        for t, text in ((ta, "1"), (tb, "2"), (tc, "3")):
            t.write_text(text)
    assert [p.read_text() for p in (a, b, c)] == ["1", "2", "3"]


def test_calibrate_on_a_full_disk_writes_nothing(tmp_path: Path, capsys, monkeypatch):
    from specfold.decoding.acceptance import CalibrationPaths

    monkeypatch.setattr(CalibrationPaths, "to_json", _fault(errno.ENOSPC))
    out = tmp_path / "g.json"
    code = main(["calibrate", "--out", str(out), "--samples", "3", "--max-new-tokens", "8", "--threshold", "1.0",
                 "--budget", "3"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("specfold: error: ") and "No space left on device" in err[-1]
    assert list(tmp_path.iterdir()) == []  # not the graph without its companions, and no temporary files


def test_ctrl_c_on_eval_exits_130_and_keeps_what_was_written(tmp_path: Path):
    out = tmp_path / "r.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "specfold.cli", "--threads", "1", "eval", "--tasks", "synth-math", "--limit", "40",
         "--max-new-tokens", "16", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        # a pytest-xdist worker ignores SIGINT and a child inherits that (Python then installs no KeyboardInterrupt
        # handler): give the CLI the disposition a terminal gives it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and not (out.exists() and out.stat().st_size):
        time.sleep(0.1)  # until the first record is on disk
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "specfold: interrupted" and "Traceback" not in err
    lines = out.read_text().splitlines()
    assert lines and all(json.loads(line)["task"] == "synth-math" for line in lines)
