"""Run untrusted Python (a program plus its tests) in a separate, resource-limited process.

Nothing is ever executed in the calling process. Each call writes ``solution.py`` and ``tests.py`` into a
fresh temporary directory and starts ``sys.executable -I -c DRIVER`` there (isolated mode: no
``PYTHON*`` variables, no user site, the cwd not on ``sys.path``), in its own session so a timeout
kills the whole process group. ``preexec_fn`` sets address-space, CPU-time, file-size and core limits.
The driver executes the program, then the tests, in one namespace (``__name__ == "solution"``, so
``if __name__ == "__main__"`` blocks do not run), and reports through its exit code:

    passed   every statement ran (exit 0 *and* a per-run nonce printed after the tests)
    failed   an ``AssertionError`` was raised by the tests
    error    anything else: syntax error, an exception in the program or the tests, ``sys.exit``,
             a memory or file-size limit, a missing nonce (e.g. ``os._exit(0)`` in the program)
    timeout  the wall-clock limit was reached (the process group is killed)

The nonce reaches the driver on stdin, which is read and closed before untrusted code runs, so a
program cannot fake success by exiting early. There is no network isolation (none is needed by the
tasks; run inside a container without network for hostile code).

    >>> run_program("def f(x):\\n    return x + 1", "assert f(1) == 2").passed
    True
"""

from __future__ import annotations

import os
import resource
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Status = Literal["passed", "failed", "timeout", "error"]

DEFAULT_TIMEOUT_S = 5.0
DEFAULT_MEMORY_MB = 1024
MAX_OUTPUT_BYTES = 4 << 20  # RLIMIT_FSIZE: stdout/stderr files and anything the program writes
TAIL_CHARS = 2000

# Unusual codes, so an interpreter crash (exit 1) is not read as a failed assert.
_EXIT_FAILED = 17  # AssertionError in the tests
_EXIT_ERROR = 18  # any other exception

_DRIVER = r"""
import os, sys, traceback
FAILED, ERROR = {failed}, {error}
nonce = sys.stdin.readline().strip()
sys.stdin.close()
def main():
    with open("solution.py", encoding="utf-8") as f:
        program = f.read()
    with open("tests.py", encoding="utf-8") as f:
        tests = f.read()
    ns = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        exec(compile(program, "solution.py", "exec"), ns)
    except BaseException:
        traceback.print_exc()
        return ERROR
    try:
        exec(compile(tests, "tests.py", "exec"), ns)
    except AssertionError:
        traceback.print_exc()
        return FAILED
    except BaseException:
        traceback.print_exc()
        return ERROR
    return 0
rc = main()
try:
    sys.stdout.flush()
    sys.stderr.flush()
except BaseException:
    rc = rc or ERROR
if rc == 0:
    os.write(1, ("\n" + nonce + "\n").encode())
os._exit(rc)
""".replace("{failed}", str(_EXIT_FAILED)).replace("{error}", str(_EXIT_ERROR))


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one sandboxed run. ``passed`` is ``status == "passed"``."""

    passed: bool
    status: Status
    returncode: int | None  # None on timeout; negative = killed by that signal
    stderr_tail: str
    stdout_tail: str
    duration_s: float


def _limits(memory_mb: int, cpu_s: int) -> Callable[[], None]:
    def apply() -> None:
        mem = memory_mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_OUTPUT_BYTES, MAX_OUTPUT_BYTES))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def _tail(path: Path) -> str:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 4 * TAIL_CHARS))
        return f.read().decode("utf-8", errors="replace")[-TAIL_CHARS:]


def run_program(
    program: str,
    tests: str = "",
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    memory_mb: int = DEFAULT_MEMORY_MB,
) -> SandboxResult:
    """Run ``program`` then ``tests`` (Python source) in a fresh sandboxed interpreter."""
    nonce = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="specfold-sandbox-") as tmp:
        root = Path(tmp)
        (root / "solution.py").write_text(program, encoding="utf-8")
        (root / "tests.py").write_text(tests, encoding="utf-8")
        out_path, err_path = root / ".stdout", root / ".stderr"
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
        start = time.perf_counter()
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-c", _DRIVER],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=err,
                cwd=root,
                env=env,
                start_new_session=True,
                preexec_fn=_limits(memory_mb, int(timeout_s) + 1),
            )
            returncode: int | None
            try:
                proc.communicate((nonce + "\n").encode(), timeout=timeout_s)
                returncode = proc.returncode
            except subprocess.TimeoutExpired:
                returncode = None
            finally:
                # The group also holds anything the program forked; the leader may already be gone.
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                proc.wait()
        duration = time.perf_counter() - start
        stdout_tail, stderr_tail = _tail(out_path), _tail(err_path)

    if returncode is None:
        status: Status = "timeout"
    elif returncode == 0 and stdout_tail.rstrip("\n").endswith(nonce):
        status = "passed"
    elif returncode == _EXIT_FAILED:
        status = "failed"
    else:
        status = "error"
    if status == "passed":
        stdout_tail = stdout_tail.rstrip("\n").removesuffix(nonce).rstrip("\n")
    return SandboxResult(status == "passed", status, returncode, stderr_tail, stdout_tail, duration)
