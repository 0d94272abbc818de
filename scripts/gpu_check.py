"""The Python part of scripts/gpu_check.sh: one JSON report on the Triton backend on a CUDA device.

    PYTHONPATH=src python3 scripts/gpu_check.py --out gpu_check.json          # on a GPU (what gpu_check.sh runs)
    TRITON_INTERPRET=1 PYTHONPATH=src python3 scripts/gpu_check.py --dry-run --out x.json   # CPU, tiny shapes (CI)

Needs only torch, triton, transformers and this repository (no pytest, no installs, no network): it runs on the GPU
image as it is. Sections, each timed, each recorded even when it fails (the report is written whatever happens):

1. ``layers`` — the kernels against the references: a 2-layer (``--layers``) random-weight model at real shapes
   (fast-dllm-v2-1.5b, nld-8b; dry run: tiny odd shapes of both families) verifies K = 8 branches of a 32-token
   block over a 512-token prefix (dry run: 8 and 8) with the Triton backend and the torch engine, at δ = 0 and at
   an imposed fold ratio of 0.6 (the correction kernel at work). fp32: Triton's logits within 1e-3 of the torch
   engine's, and the same fold statistics; bf16: Triton's error against the fp32 torch pass at most 2× the torch
   engine's bf16 error plus a floor (the FlashAttention rule). On a GPU, pass times (dense, folded torch, folded
   triton) beside them.
2. ``decode`` — the embedded model on the device: vanilla, spiffy and specfold δ = 0 (torch and triton backends),
   fp32, the same prompts: every method's tokens must equal vanilla's; tokens/s side by side (median of repeats).
3. ``compile`` — ``specfold bench kernels --compile-only --json`` (every kernel, shape, dtype, sm_80 / sm_90),
   one child process (its compiles spread over the cores), started first so that it compiles on the CPU while 1 and
   2 use the GPU; the dry run compiles one shape, bf16, sm_90.
4. ``pytest`` — on a GPU, when pytest is importable: the kernel test files and ``-m gpu`` tests on CUDA
   (informational: the image may have no pytest).

``ok`` is true when sections 1-3 pass. Exit status 0 when ok, 1 otherwise (after writing the report).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
BRANCH_PARENTS = [-1, 0, 1, 2, 3, 0, 5, 1]  # K = 8: chains and siblings
LOGIT_ATOL_FP32 = 1e-3
LOWP_FACTOR, LOWP_FLOOR = 2.0, 1e-2  # bf16: err_triton <= 2 * err_torch + floor * max|ref|


def log(msg: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def child_env() -> dict[str, str]:
    """The environment of a compiling child: the repo's src on the path, the interpreter off."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), env.get("PYTHONPATH", "")) if p)
    return env


# ---- 1. layers -------------------------------------------------------------------------------------------------
def random_net(shape, layers: int, vocab: int, device: str):
    """A random-weight DLLM at ``shape`` (:class:`specfold.bench.shapes.LayerShape`), fp32, on ``device``."""
    from specfold.model.families import config_from_dict
    from specfold.model.random_checkpoint import random_config, random_model

    family = "fast_dllm_v2" if shape.qkv_bias else "nld"
    cfg = config_from_dict(random_config(
        family, vocab_size=vocab, hidden_size=shape.hidden, num_heads=shape.heads, num_kv_heads=shape.kv_heads,
        num_layers=layers, intermediate_size=shape.ffn, mask_token_id=vocab - 1, eos_token_id=vocab - 2,
    ))
    return random_model(cfg, seed=0).to(device).eval(), cfg


def timed_ms(fns: dict, device: str, repeats: int) -> dict[str, float]:
    """Median ms of each ``fn()``: interleaved after one warm-up, the device synchronised (specfold.timing's rules)."""
    from specfold.timing import interleaved

    return {k: 1e3 * t.median for k, t in interleaved(fns, repeats, warmup=1, device=device).items()}


def layer_check(name: str, shape, device: str, prefix: int, n: int, repeats: int, layers: int = 2) -> list[dict]:
    import copy

    from specfold.engine.dense import DenseVerifier
    from specfold.engine.folded import FoldedVerifier
    from specfold.engine.layer_types import FoldConfig

    vocab = 512
    net32, cfg = random_net(shape, layers, vocab, device)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, vocab - 2, (1, prefix), generator=gen)
    parents = torch.tensor(BRANCH_PARENTS, device=device)
    states = torch.full((len(BRANCH_PARENTS), n), vocab - 1, dtype=torch.long)
    states[0, : n // 4] = torch.randint(0, vocab - 2, (n // 4,), generator=gen)
    for i in range(1, len(BRANCH_PARENTS)):  # each draft: its parent plus two more tokens
        states[i] = states[BRANCH_PARENTS[i]]
        states[i, torch.randint(n // 4, n, (2,), generator=gen)] = torch.randint(0, vocab - 2, (2,), generator=gen)
    states = states.to(device)
    nets = {"fp32": net32, "bf16": copy.deepcopy(net32).to(torch.bfloat16)}
    caches = {}
    for dt, net in nets.items():
        caches[dt] = net.new_cache(prefix + n)
        with torch.no_grad():
            net(prompt.to(device), caches[dt], mask="causal", write_cache=True)
    rows = []
    for label, extra in (("delta0", {}), ("imposed0.6", {"imposed_fold": 0.6, "ffn": "paper"})):
        def verifier(net, backend, extra=extra):
            fc = FoldConfig(delta=0.0, backend=backend, attention="correct", dense_fallback=False, **extra)
            return FoldedVerifier(net, cfg=fc, cost=None)

        out, stats = {}, {}
        for dt, net in nets.items():
            for backend in ("torch", "triton"):
                res = verifier(net, backend).verify(caches[dt], states, parents)
                out[(dt, backend)] = res.logits.float()
                st = res.stats
                stats[(dt, backend)] = st.to_dict() if hasattr(st, "to_dict") else dict(st)
        ref = out[("fp32", "torch")]
        scale = ref.abs().max().item()
        err = {k: (v - ref).abs().max().item() for k, v in out.items()}
        same_stats = stats[("fp32", "triton")] == stats[("fp32", "torch")]
        fp32_ok = err[("fp32", "triton")] <= LOGIT_ATOL_FP32 and same_stats
        limit = LOWP_FACTOR * err[("bf16", "torch")] + LOWP_FLOOR * scale
        row = {"shape": name, "case": label, "fp32_err_triton": err[("fp32", "triton")],
               "fp32_limit": LOGIT_ATOL_FP32, "fp32_same_fold_stats": same_stats,
               "bf16_err_triton": err[("bf16", "triton")], "bf16_err_torch": err[("bf16", "torch")],
               "bf16_limit": limit, "fold_ratio_triton": _fold_ratio(stats[("fp32", "triton")]),
               "ok": bool(fp32_ok and err[("bf16", "triton")] <= limit)}
        if label == "imposed0.6" and repeats:
            net = nets["bf16"]
            dense = DenseVerifier(net)
            runs = {"dense": dense, "folded_torch": verifier(net, "torch"), "folded_triton": verifier(net, "triton")}
            with torch.no_grad():
                row["bf16_pass_ms"] = timed_ms({k: lambda v=v: v.verify(caches["bf16"], states, parents)
                                                for k, v in runs.items()}, device, repeats)
        rows.append(row)
        log(f"layers {name} {label}: ok={row['ok']} fp32 err {row['fp32_err_triton']:.2e}, bf16 err "
            f"{row['bf16_err_triton']:.2e} (limit {limit:.2e})")
    return rows


def _fold_ratio(stats: dict) -> float | None:
    draft = stats.get("draft_triples")
    return stats["folded_triples"] / draft if draft else None


# ---- 2. decode -------------------------------------------------------------------------------------------------
def decode_check(device: str, prompts: list[str], max_new: int, repeats: int) -> dict:
    import specfold

    model = specfold.load_model(dtype="fp32", device=device)
    methods = {"vanilla": {}, "spiffy": {}, "specfold_torch": {"delta": 0.0, "backend": "torch"},
               "specfold_triton": {"delta": 0.0, "backend": "triton"}}
    tokens: dict[str, list] = {m: [] for m in methods}
    seconds: dict[str, list[float]] = {m: [] for m in methods}
    generated: dict[str, int] = {m: 0 for m in methods}
    nfe: dict[str, int] = {m: 0 for m in methods}
    for rep in range(repeats + 1):  # rep 0 warms up (Triton compiles); timings from the others, interleaved
        for m, opts in methods.items():
            method = m.split("_")[0]
            total = 0.0
            for i, p in enumerate(prompts):
                r = specfold.generate(model, p, method=method, max_new_tokens=max_new, **opts)
                total += r.seconds
                if rep == 0:
                    tokens[m].append(r.token_ids)
                    generated[m] += r.generated_tokens
                    nfe[m] += r.nfe
                elif r.token_ids != tokens[m][i]:
                    raise AssertionError(f"{m}: prompt {i} decoded differently on repeat {rep}")
            if rep or not repeats:
                seconds[m].append(total)
    out = {"prompts": len(prompts), "max_new_tokens": max_new, "dtype": "fp32", "methods": {}}
    for m in methods:
        secs = sorted(seconds[m])[len(seconds[m]) // 2]
        out["methods"][m] = {"tokens_per_s": generated[m] / secs if secs else None, "seconds": secs, "nfe": nfe[m],
                             "same_tokens_as_vanilla": tokens[m] == tokens["vanilla"]}
    out["ok"] = all(v["same_tokens_as_vanilla"] for v in out["methods"].values())
    log(f"decode: ok={out['ok']} " + ", ".join(f"{m} {v['nfe']} NFE" for m, v in out["methods"].items()))
    return out


# ---- 3. compile ------------------------------------------------------------------------------------------------
def start_compile(shapes: list[str], dtypes: str, archs: str) -> list[tuple[str, subprocess.Popen]]:
    """One ``bench kernels --compile-only`` child for all ``shapes``, started now: it compiles on the CPU cores (a
    worker process per core, each distinct compile once) while the GPU sections run."""
    label = ",".join(shapes)
    return [(label, subprocess.Popen([sys.executable, "-m", "specfold.cli", "bench", "kernels", "--compile-only",
                                      "--shape", label, "--dtype", dtypes, "--arch", archs, "--json"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
                                     cwd=REPO))]


def finish_compile(procs: list[tuple[str, subprocess.Popen]], timeout: float) -> dict:
    rows, errors = [], []
    deadline = time.perf_counter() + timeout
    for s, p in procs:
        try:
            out, err = p.communicate(timeout=max(1.0, deadline - time.perf_counter()))
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            errors.append(f"{s}: compile check timed out")
        if p.returncode not in (0, 1):
            errors.append(f"{s}: bench kernels exit {p.returncode}: {err[-1500:]}")
        rows += [json.loads(line) for line in out.splitlines() if line.strip()]
    bad = [r for r in rows if r.get("violations")]
    keep = ("kernel", "shape", "dtype", "arch", "compiled", "error", "registers", "spills", "shared_bytes",
            "num_warps", "num_stages", "violations")
    log(f"compile: {len(rows)} rows, {len(bad)} with violations, {len(errors)} errors")
    return {"rows": [{k: r.get(k) for k in keep} for r in rows], "errors": errors,
            "ok": not errors and not bad and bool(rows)}


# ---- 4. pytest -------------------------------------------------------------------------------------------------
def pytest_check(timeout: float) -> dict:
    try:
        import pytest  # noqa: F401
    except ImportError:
        return {"ran": False, "reason": "pytest is not installed here"}
    files = ["tests/engine/test_kernel_gate.py", "tests/engine/test_kernel_qkv.py",
             "tests/engine/test_kernel_attention.py", "tests/engine/test_kernel_backend.py", "tests/engine/test_gpu.py"]
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu or not slow", *files]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=child_env(), cwd=REPO)
    except subprocess.TimeoutExpired:
        return {"ran": True, "rc": None, "summary": f"timed out after {timeout:.0f} s"}
    tail = [ln for ln in p.stdout.splitlines() if ln.strip()][-15:]
    return {"ran": True, "rc": p.returncode, "summary": tail}


# ---- main ------------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="where the JSON report goes")
    ap.add_argument("--dry-run", action="store_true", help="CPU, Triton's interpreter, tiny shapes (what CI runs)")
    ap.add_argument("--layers", type=int, default=2,
                    help="layers of the random-weight model in the layers section (default 2; every kernel runs in "
                    "each layer, so 1 checks the same kernels: tests/engine/test_gpu_check_dry_run.py runs the dry run "
                    "with 1, half the interpreter's time)")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="a section that would start after this many seconds is skipped (default 420: the report "
                    "is written before gpu_check.sh's hard stop at 470 s)")
    args = ap.parse_args(argv)
    dry = args.dry_run
    interp = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    if dry and not interp:
        ap.error("--dry-run runs the kernels in Triton's interpreter: set TRITON_INTERPRET=1")
    if not dry and (interp or not torch.cuda.is_available()):
        ap.error("needs a CUDA device and TRITON_INTERPRET unset (or --dry-run)")
    device = "cpu" if dry else "cuda"
    import transformers
    import triton

    from specfold.bench.shapes import SHAPES, LayerShape

    report: dict = {
        "mode": "dry-run" if dry else "gpu",
        "device": torch.cuda.get_device_name() if not dry else platform.processor() or "cpu",
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
                     "transformers": transformers.__version__},
        "sections": {}, "seconds": {}, "errors": {},
    }
    if dry:
        layer_shapes = {"tiny-fd": LayerShape(96, 6, 2, 16, 160, True, 512, 2),
                        "tiny-nld": LayerShape(80, 4, 2, 20, 112, False, 512, 2)}
        prefix, block, repeats = 8, 8, 0
        prompts, max_new = ["What is 3 + 4?"], 8
        compile_args = (["fast-dllm-v2-1.5b"], "bf16", "sm_90")
    else:
        layer_shapes = {s: SHAPES[s] for s in ("fast-dllm-v2-1.5b", "nld-8b")}
        prefix, block, repeats = 512, 32, 5
        prompts, max_new = ["What is 3 + 4?", "Write a Python function that reverses a list.",
                            "Name three prime numbers.", "Sum the numbers from 1 to 10."], 64
        compile_args = (list(SHAPES), "bf16,fp32", "sm_80,sm_90")
    t_all = time.perf_counter()
    compiling = start_compile(*compile_args)
    sections = {
        "layers": lambda: [r for name, sh in layer_shapes.items()
                           for r in layer_check(name, sh, device, prefix, block, repeats, args.layers)],
        "decode": lambda: decode_check(device, prompts, max_new, 2 if not dry else 0),
        "compile": lambda: finish_compile(compiling, max(30.0, args.budget_s - (time.perf_counter() - t_all))),
    }
    if not dry:
        sections["pytest"] = lambda: pytest_check(150.0)
    for name, fn in sections.items():
        if time.perf_counter() - t_all > args.budget_s:
            report["errors"][name] = f"skipped: over the {args.budget_s:.0f} s budget"
            log(report["errors"][name])
            continue
        log(f"{name} ...")
        t0 = time.perf_counter()
        try:
            report["sections"][name] = fn()
        except Exception:  # the report records the failure; the other sections still run
            report["errors"][name] = traceback.format_exc()[-4000:]
            log(f"{name} FAILED:\n{report['errors'][name]}")
        report["seconds"][name] = round(time.perf_counter() - t0, 2)
    for _, p in compiling:  # a compile section skipped for time leaves its children running
        if p.poll() is None:
            p.kill()
    report["seconds"]["total"] = round(time.perf_counter() - t_all, 2)
    sec = report["sections"]
    report["ok"] = (not set(report["errors"]) - {"pytest"} and all(r["ok"] for r in sec.get("layers", [{"ok": False}]))
                    and sec.get("decode", {}).get("ok", False) and sec.get("compile", {}).get("ok", False))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    log(f"ok={report['ok']} in {report['seconds']['total']} s; report: {args.out}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
