"""One ``specfold serve`` subprocess (embedded model, 127.0.0.1, a free port) shared by a test module."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")
import httpx  # noqa: E402

SRC = Path(__file__).resolve().parents[2] / "src"
LONG_PROMPT = "Tell me a story."  # without the chat template the embedded model writes > 1500 tokens, no stop


@dataclass
class Server:
    proc: subprocess.Popen
    url: str

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=10).json()

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM; the exit status."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(*args: str, timeout: float = 90.0) -> Server:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "specfold.cli", "serve", "--port", str(port), "--log-level", "warning", *args]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"specfold serve exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return Server(proc, url)
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("specfold serve did not answer /health in time")


@pytest.fixture(scope="module")
def server():
    srv = start_server("--max-batch", "4")
    yield srv
    if srv.proc.poll() is None:
        assert srv.stop() == 0


@pytest.fixture(scope="session")
def model():
    from specfold.api import load_model

    return load_model(None)
