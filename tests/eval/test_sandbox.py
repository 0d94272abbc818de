"""Sandbox: each status, the limits, isolation, and that a timeout kills the whole process group."""

from __future__ import annotations

import os
import time
from pathlib import Path

from specfold.eval.sandbox import run_program

GOOD = "def f(x):\n    return x + 1\n"


def test_passed() -> None:
    r = run_program(GOOD, "assert f(1) == 2\nassert f(-1) == 0")
    assert r.passed and r.status == "passed" and r.returncode == 0
    assert r.duration_s < 5


def test_program_output_is_kept_without_nonce() -> None:
    r = run_program(GOOD + "print('hello')", "assert f(0) == 1")
    assert r.status == "passed"
    assert r.stdout_tail == "hello"


def test_failed_assert() -> None:
    r = run_program(GOOD, "assert f(1) == 2\nassert f(2) == 4")
    assert not r.passed and r.status == "failed"
    assert "AssertionError" in r.stderr_tail and "tests.py" in r.stderr_tail


def test_exception_in_tests_is_error() -> None:
    r = run_program("def f(x):\n    return 1 // x\n", "assert f(1) == 1\nassert f(0) == 0")
    assert r.status == "error" and not r.passed
    assert "ZeroDivisionError" in r.stderr_tail


def test_syntax_error_and_top_level_raise() -> None:
    assert run_program("def f(x) return x", "assert f(1) == 1").status == "error"
    r = run_program("raise ValueError('boom')", "")
    assert r.status == "error" and "ValueError: boom" in r.stderr_tail


def test_assert_in_program_body_is_error_not_failed() -> None:
    assert run_program("assert False", "").status == "error"


def test_early_exit_cannot_fake_a_pass() -> None:
    assert run_program("import sys\nsys.exit(0)", "assert False").status == "error"
    assert run_program("import os\nos._exit(0)", "assert False").status == "error"
    # The nonce is read and stdin closed before the program runs.
    assert run_program("import sys\nprint(sys.stdin.read())", "").status == "error"


def test_main_block_does_not_run() -> None:
    r = run_program("if __name__ == '__main__':\n    raise SystemExit(3)\n", "")
    assert r.status == "passed"


def test_timeout() -> None:
    start = time.perf_counter()
    r = run_program("def f():\n    while True:\n        pass\n", "f()", timeout_s=1.0)
    assert r.status == "timeout" and not r.passed and r.returncode is None
    assert time.perf_counter() - start < 4


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    state = next(line for line in status.splitlines() if line.startswith("State:"))
    return "Z" not in state.split()[1]  # an unreaped zombie is dead


def test_timeout_kills_forked_children() -> None:
    program = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    r = run_program(program, "", timeout_s=1.5)
    assert r.status == "timeout"
    child = int(r.stdout_tail.split()[0])
    deadline = time.time() + 2
    while _alive(child) and time.time() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def test_memory_limit() -> None:
    r = run_program("x = bytearray(1 << 30)", "", memory_mb=256)
    assert r.status == "error" and "MemoryError" in r.stderr_tail


def test_isolated_interpreter_in_temp_cwd() -> None:
    program = (
        "import os, sys\n"
        "open('scratch.txt', 'w').write('x')\n"
        "CWD = os.getcwd()\n"
        "FLAGS = (sys.flags.isolated, sys.flags.ignore_environment)\n"
    )
    tests = "assert 'specfold-sandbox-' in CWD\nassert FLAGS == (1, 1)\nassert '' not in __import__('sys').path"
    r = run_program(program, tests)
    assert r.status == "passed", r.stderr_tail
    assert not Path("scratch.txt").exists()


def test_environment_is_not_inherited(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("SPECFOLD_SECRET_FOR_TEST", "1")
    r = run_program("import os", "assert 'SPECFOLD_SECRET_FOR_TEST' not in os.environ")
    assert r.status == "passed"
    assert os.environ["SPECFOLD_SECRET_FOR_TEST"] == "1"
