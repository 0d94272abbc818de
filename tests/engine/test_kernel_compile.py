"""Every Triton kernel compiles for sm_80 and sm_90 at every supported shape, in bf16 and fp32, within the limits.

What the interpreter never checks, checked without a GPU: ``specfold bench kernels --compile-only`` records the
folded layer's launches on meta tensors (the launchers' own tile / warp / stage choice) and compiles each with the
ptxas in the triton wheel. Asserted per (kernel, shape, dtype, arch): it compiles; shared memory within the
per-block maximum (A100 163 KiB, H100 227 KiB); registers × threads within a block's register file; no spill
beyond :data:`specfold.bench.kernels.SPILL_ALLOWANCE` (per kernel and dtype, each with its reason). Also: every
``_*_kernel`` of ``specfold.engine.kernels`` is in the report, so a new kernel cannot skip the check.

The compile runs once per session in a subprocess (the test session runs the kernels in the interpreter, which
compiles nothing; ``TRITON_INTERPRET`` is unset for the child): the launches are recorded once for both
architectures, each distinct compile (launches that Triton would specialise identically are compiled once for all
shapes: 98 of the 360 rows of 9 shapes) runs once, in one worker process per core, the fp32 ones first. Measured
on the 2-core AVX2 EPYC: 4 min of CPU in all (LLVM and ptxas, the fp32 FMA dots the most; as with the former two
processes, one per architecture: the distinct compiles are the cost), so about 2 min of wall time on two free cores;
12 min under a load of 7-13.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

pytest.importorskip("triton")

from specfold.bench.kernels import ARCHS, REGISTERS_PER_BLOCK, _ptxas_report, spill_allowance  # noqa: E402
from specfold.bench.shapes import SHAPES  # noqa: E402

DTYPES = ("bf16", "fp32")
KERNEL_MODULES = ("gate", "resolve", "qkv", "attention", "correction", "ffn")
COMPILE_TIMEOUT_S = 900


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    src = os.path.join(os.path.dirname(__file__), "..", "..", "src")
    env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(src), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


@pytest.fixture(scope="module")
def table() -> list[dict]:
    """The JSON lines of `specfold bench kernels --compile-only --json` for every shape, dtype and arch."""
    t0 = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-m", "specfold.cli", "bench", "kernels", "--compile-only", "--arch", ",".join(ARCHS),
         "--dtype", ",".join(DTYPES), "--json"],
        capture_output=True, text=True, env=_child_env(), timeout=COMPILE_TIMEOUT_S,
    )
    # exit 1 = a kernel broke a limit (the tests below say which); anything else is a crash of the command
    assert p.returncode in (0, 1), f"bench kernels crashed (exit {p.returncode}):\n{p.stderr[-3000:]}"
    rows = [json.loads(line) for line in p.stdout.splitlines() if line.strip()]
    print(f"compile table: {len(rows)} rows in {time.perf_counter() - t0:.0f} s")
    return rows


def _kernel_names() -> set[str]:
    """The ``_<op>_kernel`` functions of every kernel module (helpers such as ``_attend_tile`` are not launched)."""
    import importlib

    names = set()
    for mod in KERNEL_MODULES:
        m = importlib.import_module(f"specfold.engine.kernels.{mod}")
        names |= {n.removeprefix("_").removesuffix("_kernel") for n in vars(m) if n.startswith("_")
                  and n.endswith("_kernel")}
    return names


def test_every_kernel_shape_dtype_arch_is_in_the_table(table):
    kernels = {r["kernel"] for r in table}
    assert {k.split("[")[0] for k in kernels} == _kernel_names()
    seen = {(r["kernel"], r["shape"], r["dtype"], r["arch"]) for r in table}
    want = {(k, s, d, a) for k in kernels for s in SHAPES for d in DTYPES for a in ARCHS}
    assert seen == want, f"missing: {sorted(want - seen)[:5]}"
    assert len(table) == len(seen)  # one object per (kernel, shape, dtype, arch)
    fields = {"kernel", "shape", "dtype", "arch", "compiled", "error", "registers", "spills", "shared_bytes",
              "num_warps", "num_stages"}
    assert all(fields <= r.keys() for r in table)


def test_every_kernel_compiles(table):
    failed = [(r["kernel"], r["shape"], r["dtype"], r["arch"], r["error"]) for r in table if not r["compiled"]]
    assert not failed, failed[:3]


def test_shared_memory_within_the_per_block_limit(table):
    over = [(r["kernel"], r["shape"], r["dtype"], r["arch"], r["shared_bytes"]) for r in table
            if r["compiled"] and r["shared_bytes"] > ARCHS[r["arch"]][1]]
    assert not over, over[:3]


def test_registers_fit_and_nothing_spills(table):
    for r in table:
        if not r["compiled"]:
            continue
        where = (r["kernel"], r["shape"], r["dtype"], r["arch"])
        assert 0 < r["registers"] <= 255, where
        assert r["registers"] * 32 * r["num_warps"] <= REGISTERS_PER_BLOCK, where
        assert r["spills"] <= spill_allowance(r["kernel"], r["dtype"]), (where, r["spills"], r["spill_loads"])
        assert r["violations"] == []


def test_ptxas_report_parsing():
    log = ("ptxas info    : Compiling entry function 'k' for 'sm_90'\nptxas info    : Function properties for k\n"
           "    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n"
           "ptxas info    : Used 168 registers, used 1 barriers, 1024 bytes smem, 480 bytes cmem[0]\n")
    assert _ptxas_report(log) == {"registers": 168, "spills": 4, "spill_loads": 12, "stack_bytes": 8, "smem": 1024}


def test_cli_refuses_the_interpreter():
    env = {**_child_env(), "TRITON_INTERPRET": "1"}
    p = subprocess.run([sys.executable, "-m", "specfold.cli", "bench", "kernels", "--compile-only", "--json"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 2 and "TRITON_INTERPRET" in p.stderr and p.stdout == ""
