"""scripts/gpu_check.sh cannot rot: its Python part runs here on the CPU (``--dry-run``: Triton's interpreter, tiny
shapes of both families, the embedded model) with the same code path as on a GPU, and its report must say ok —
the Triton layers agree with the torch engine (fp32 within 1e-3 and the same fold statistics; bf16 by the
FlashAttention rule), every decode method gives vanilla's tokens, and the compile table of one shape has no
violation. The layers section runs a 1-layer model here (``--layers 1``; the GPU run keeps 2): every kernel still
runs in it. Measured on the 2-core AVX2 EPYC under a load of ~14: 56 s of CPU (was 68 s with 2 layers), about half of
it the compile child (one shape, bf16, sm_90); 5 min of wall time under that load."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

REPO = Path(__file__).resolve().parents[2]


def test_gpu_check_dry_run(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), env.get("PYTHONPATH", "")) if p)
    out = tmp_path / "gpu_check.json"
    # one layer (the GPU run: 2): every kernel still runs and is compared, in half the interpreter's time
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check.py"), "--dry-run", "--layers", "1", "--out",
                        str(out)], capture_output=True, text=True, env=env, cwd=REPO, timeout=900)
    assert out.exists(), p.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["errors"] == {}, report["errors"]
    assert report["mode"] == "dry-run" and set(report["sections"]) == {"layers", "decode", "compile"}
    layers = report["sections"]["layers"]
    assert {(r["shape"], r["case"]) for r in layers} == {(s, c) for s in ("tiny-fd", "tiny-nld")
                                                         for c in ("delta0", "imposed0.6")}
    for r in layers:
        assert r["fp32_err_triton"] <= r["fp32_limit"] and r["fp32_same_fold_stats"], r
        assert r["bf16_err_triton"] <= r["bf16_limit"], r  # NaN fails here too
    imposed = [r for r in layers if r["case"] == "imposed0.6"]
    assert all(0.3 < r["fold_ratio_triton"] for r in imposed)  # rows did fold: the correction kernel ran
    decode = report["sections"]["decode"]["methods"]
    assert set(decode) == {"vanilla", "spiffy", "specfold_torch", "specfold_triton"}
    assert all(m["same_tokens_as_vanilla"] for m in decode.values())
    compiled = report["sections"]["compile"]["rows"]
    assert compiled and all(r["compiled"] and not r["violations"] for r in compiled)
    assert report["ok"] and p.returncode == 0, p.stderr[-2000:]
