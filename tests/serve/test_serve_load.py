"""`scripts/serve_load.py` in its small mode: every request answered exactly once, with eval's tokens.

The script starts its own `specfold serve` subprocess and runs `specfold eval` on the same prompts; these tests
read its JSON line. The last one makes requests time out, so the accounting must report them lost.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "serve_load.py"


def load_test(*args: str) -> tuple[int, dict]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    return proc.returncode, json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("args", "requests", "endpoint"),
    [(("--clients", "3", "--requests-per-client", "2"), 6, "chat"),
     (("--clients", "2", "--requests-per-client", "1", "--endpoint", "completions"), 2, "completions")],
    ids=["chat", "completions-token-ids"],
)
def test_every_request_is_answered_once_with_evals_tokens(args, requests, endpoint):
    rc, r = load_test(*args, "--max-tokens", "48")
    assert rc == 0, r
    assert (r["requests"], r["answered"], r["lost"], r["duplicates"]) == (requests, requests, 0, 0)
    assert r["endpoint"] == endpoint and r["errors"] == [] and r["ok"] is True
    assert r["text_matches_tokens"] == requests  # the streamed deltas concatenate to the text of the token ids
    assert r["server_counters"] == {"submitted": requests + 1, "finished": requests + 1, "cancelled": 0,
                                    "failed": 0, "rejected": 0}  # + the warm-up request
    assert r["server_exit"] == 0
    # vanilla through the server = vanilla through `specfold eval --batch-size` on the same samples
    assert r["token_agreement"] == r["prompt_tokens_agreement"] == requests
    assert r["generated_tokens"] == r["eval_generated_tokens"] > 0
    assert sum(r["finish_reasons"].values()) == requests
    assert 0 < r["ttft_p50_s"] <= r["latency_p50_s"] <= r["latency_p95_s"] <= r["latency_max_s"] <= r["wall_s"]
    # the two throughputs compare like with like: the same tokens, each over its own wall time (no speed asserted)
    assert r["server_tokens_per_second"] * r["wall_s"] == pytest.approx(r["generated_tokens"])
    assert r["eval_tokens_per_second"] * r["eval_decode_s"] == pytest.approx(r["eval_generated_tokens"])


def test_requests_cut_by_the_timeout_count_as_lost():
    rc, r = load_test("--clients", "2", "--requests-per-client", "2", "--timeout", "0.01", "--no-eval")
    assert rc == 1 and r["ok"] is False
    assert (r["requests"], r["answered"], r["lost"], r["duplicates"]) == (4, 0, 4, 0)
    assert sorted(e.split(":")[0] for e in r["errors"]) == ["c0r0", "c0r1", "c1r0", "c1r1"]
    assert r["server_exit"] == 0  # SIGTERM with streams just dropped: still a clean exit
