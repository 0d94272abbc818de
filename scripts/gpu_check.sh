#!/usr/bin/env bash
# GPU check of the Triton backend: one command, one CUDA device, PyTorch + Triton + this repo only.
#
#   scripts/gpu_check.sh            # writes ${OUT:-.}/gpu_check.json and prints a short table
#
# 1. The kernel tests (tests/engine/test_kernel_*.py, test_triton_decode.py) on CUDA, TRITON_INTERPRET unset, and
#    the `-m gpu` tests (tests/engine/test_gpu.py: the shipped model's Triton decodes on CUDA) — if pytest is installed.
# 2. A layer-level kernel check at the real shapes (always): one folded layer at fast-dllm-v2-1.5b and nld-8b,
#    Triton vs the torch engine, both vs an fp32 torch reference (bf16: Triton's error ≤ 2× torch-bf16's + floor).
# 3. The layer benchmark: dense (torch, batched GEMMs) vs folded triton vs folded torch, B = 7, P = 512, bf16,
#    fold ratios 0.3 / 0.6 / 0.9.
# 4. End-to-end decoding on random-weight models at the full Fast-dLLM-v2-1.5B and NLD-8B shapes (built on the
#    GPU, bf16; no weights are downloaded or written), the embedded model's draft graph: vanilla, spiffy, specfold
#    (delta = 0.1, triton) eager and CUDA-graphed, and specfold at imposed fold ratios 0.3 / 0.6 / 0.9
#    (FoldConfig.imposed_fold: a pass at a known fold ratio) eager and graphed — tokens/s side by side, fold ratio,
#    host syncs per pass
#    (dispatch syncs + tolist/numpy reads of one verification pass, K = 8, P = 512), and whether spiffy/specfold
#    produced vanilla's tokens (spiffy must; specfold at delta = 0.1 need not).
# Meant to run unattended in a few minutes on one H200. Exits non-zero, after writing the report, on any test
# failure, kernel mismatch or a graphed pass that differs from the eager one.
set -euo pipefail
cd "$(dirname "$0")/.."
unset TRITON_INTERPRET
export PYTHONPATH=src
PY="${PYTHON:-python}"
OUT_DIR="${OUT:-.}"
mkdir -p "$OUT_DIR"

tests_rc=0
if "$PY" -c "import pytest" 2>/dev/null; then
    timeout 300 "$PY" -m pytest -q -p no:cacheprovider -m "gpu or not slow" tests/engine/test_kernel_gate.py \
        tests/engine/test_kernel_qkv.py tests/engine/test_kernel_attention.py tests/engine/test_kernel_backend.py \
        tests/engine/test_sync_free.py tests/engine/test_cuda_graphs.py tests/engine/test_triton_decode.py || tests_rc=$?
    # -m gpu replaces the default `-m 'not slow'` (the file is named so that collection needs no test-only packages)
    timeout 300 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_gpu.py \
        || { rc=$?; [ "$tests_rc" -ne 0 ] || tests_rc=$rc; }
else
    echo "gpu_check: pytest not installed, kernel test files skipped (the layer check still covers every kernel)" >&2
    tests_rc=-1
fi

"$PY" - "$OUT_DIR/gpu_check.json" "$tests_rc" <<'PYEOF'
import json
import sys

import torch

from specfold.bench.layer import SHAPES, bench_layer, default_parents, make_layer
from specfold.config import RopeConfig
from specfold.engine.folded_layer import folded_layer
from specfold.engine.layer_types import FoldConfig, LayerContext
from specfold.engine.plan import gate_and_compact
from specfold.engine.triton_backend import folded_layer_triton, plan_layer
from specfold.model.rope import Rotary

out_path, tests_rc = sys.argv[1], int(sys.argv[2])
assert torch.cuda.is_available(), "gpu_check needs a CUDA device"
dev = "cuda"
SHAPE_NAMES = ["fast-dllm-v2-1.5b", "nld-8b"]
FOLDS = [0.3, 0.6, 0.9]
B, N, P = 7, 32, 512


def layer_check(name: str, dtype: torch.dtype, fold_ratio: float = 0.6) -> dict:
    """One folded layer (imposed folds, ffn="paper"): triton and torch at ``dtype`` vs torch at fp32."""
    sh = SHAPES[name]
    k = B + 1
    gen = torch.Generator().manual_seed(0)
    par = torch.tensor(default_parents(B), device=dev)
    h = torch.randn(k, N, sh.hidden, generator=gen)
    for i in range(1, k):
        h[i] = h[par[i]] + 0.05 * torch.randn(N, sh.hidden, generator=gen)
    fold = (torch.rand(k, N, generator=gen) < fold_ratio).to(dev)
    fold[0] = False
    pk = torch.randn(sh.kv_heads, P, sh.head_dim, generator=gen)
    pv = torch.randn(sh.kv_heads, P, sh.head_dim, generator=gen)
    outs = {}
    for tag, dt, backend in (("ref", torch.float32, "torch"), ("torch", dtype, "torch"), ("triton", dtype, "triton")):
        layer = make_layer(sh, dt, dev, seed=0)
        cos, sin, _ = Rotary(RopeConfig(theta=1e6), sh.head_dim).tables(torch.arange(P, P + N), dt)
        ctx = LayerContext(cos=cos.to(dev), sin=sin.to(dev), qscale=None, scale=sh.head_dim**-0.5, parents=par)
        cfg = FoldConfig(delta=0.0, ffn="paper", attention="correct", backend=backend, dense_fallback=False)
        hh = h.to(device=dev, dtype=dt).reshape(k * N, -1)
        plan_fn, layer_fn = (gate_and_compact, folded_layer) if backend == "torch" else (plan_layer, folded_layer_triton)
        with torch.inference_mode():
            plan = plan_fn(hh.view(k, N, -1), par, 0.0, fold=fold)
            o = layer_fn(layer, hh, plan, ctx, pk.to(dev, dt), pv.to(dev, dt), cfg)[0]
        outs[tag] = o.float()
    err_triton = (outs["triton"] - outs["ref"]).abs().max().item()
    err_torch = (outs["torch"] - outs["ref"]).abs().max().item()
    scale = outs["ref"].abs().max().item()
    limit = 2.0 * err_torch + 1e-4 * scale if dtype != torch.float32 else 1e-3 * scale
    return {"shape": name, "dtype": str(dtype).removeprefix("torch."), "err_triton": err_triton,
            "err_torch": err_torch, "limit": limit, "ok": bool(err_triton <= limit)}


checks = [layer_check(s, dt) for s in SHAPE_NAMES for dt in (torch.float32, torch.bfloat16)]
bench = []
for s in SHAPE_NAMES:
    for f in FOLDS:
        kw = dict(branches=B, block=N, prefix=P, dtype=torch.bfloat16, repeats=20, warmup=3, device=dev)
        rt = bench_layer(s, f, backend="triton", **kw)
        rp = bench_layer(s, f, backend="torch", **kw)
        bench.append({
            "shape": s, "fold_ratio": f, "realised_fold_ratio": rt.realised_fold_ratio,
            "dense_ms": 1e3 * rt.dense_seconds, "folded_triton_ms": 1e3 * rt.folded_seconds,
            "folded_torch_ms": 1e3 * rp.folded_seconds, "triton_over_dense": rt.ratio,
            "torch_over_dense": rp.folded_seconds / rt.dense_seconds, "flop_limit_ratio": rt.flop_limit_ratio,
            "dense_spread_ms": 1e3 * rt.dense_spread, "folded_triton_spread_ms": 1e3 * rt.folded_spread,
        })



# ---- 4. end-to-end decoding at the full shapes -------------------------------------------------------------------
import gc
from pathlib import Path

from torch.overrides import TorchFunctionMode

from specfold.bench.ops import count_ops
from specfold.config import DecodeConfig, ModelConfig
from specfold.decoding.decoder import decode
from specfold.decoding.draft_graph import DraftGraph
from specfold.decoding.speculative import GraphDrafter
from specfold.engine.dense import DenseVerifier
from specfold.engine.folded import FoldedVerifier
from specfold.engine.cuda_graphs import GraphedVerifier
from specfold.model.loading import LoadedModel
from specfold.model.random_checkpoint import random_config
from specfold.model.transformer import DLLM

FULL = {  # the published configs' shapes (bench.layer.SHAPES), as random_config takes them
    "fast-dllm-v2-1.5b": ("fast_dllm_v2", dict(vocab_size=151936, hidden_size=1536, num_heads=12, num_kv_heads=2,
                                               num_layers=28, intermediate_size=8960)),
    "nld-8b": ("nld", dict(vocab_size=131072, hidden_size=4096, num_heads=32, num_kv_heads=8, num_layers=34,
                           intermediate_size=14336)),
}
GRAPH = DraftGraph.load(Path("src/specfold/assets/embedded/draft_graph.json"))
PROMPT, NEW_TOKENS, DELTA = 256, 64, 0.1


class _HostReads(TorchFunctionMode):  # tolist/numpy reach no dispatcher op on CPU and only a copy on CUDA
    def __init__(self):
        super().__init__()
        self.reads = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.reads += func in (torch.Tensor.tolist, torch.Tensor.numpy)
        return func(*args, **(kwargs or {}))


def host_syncs(fn) -> int:
    mode = _HostReads()
    with mode:
        ops = count_ops(fn)
    return ops.syncs + mode.reads


def full_model(name: str) -> LoadedModel:
    """random_model's initialisation, drawn on the GPU (an 8B model is too slow to draw on the CPU or write)."""
    family, shape = FULL[name]
    v = shape["vocab_size"]
    cfg = ModelConfig.from_dict(random_config(family, mask_token_id=v - 1, eos_token_id=v - 2, **shape))
    with torch.device(dev):
        net = DLLM(cfg)
    gen = torch.Generator(device=dev).manual_seed(0)
    with torch.no_grad():
        for pname, p in net.named_parameters():
            r = torch.randn(p.shape, generator=gen, device=dev)
            if "norm" in pname:
                p.copy_(1.0 + 0.1 * r)
            elif pname.endswith("bqkv"):
                p.copy_(0.1 * r)
            elif pname in ("embed", "head"):
                p.copy_(r)
            else:
                p.copy_(0.05 * r * (p.shape[-1] / 96) ** -0.5 * 2)
            del r
    net = net.to(torch.bfloat16).eval()
    return LoadedModel(net=net, config=cfg, tokenizer=None, mask_id=v - 1, stop_id=None, path=Path(name))


def pass_syncs(model: LoadedModel, verifier) -> int:
    """Host syncs of one verification pass, K = 8 branches (the embedded graph's B = 7), P = 512."""
    net = model.net
    gen = torch.Generator().manual_seed(1)
    cache = net.new_cache(1024)
    net(torch.randint(0, 1000, (1, 512), generator=gen).to(dev), cache, mask="causal", write_cache=True)
    par = torch.tensor(default_parents(B), device=dev)
    states = torch.full((B + 1, N), model.mask_id, dtype=torch.long)
    states[:, :8] = torch.randint(0, 1000, (8,), generator=gen)
    for i in range(1, B + 1):
        states[i, 8 + i] = i
    states = states.to(dev)
    verifier.verify(cache, states, par)  # compile / capture outside the count
    return host_syncs(lambda: verifier.verify(cache, states, par))


decodes = []
for name in SHAPE_NAMES:
    model = full_model(name)
    net = model.net
    dcfg = DecodeConfig(max_new_tokens=NEW_TOKENS, threshold=0.9, block_size=model.config.block_size,
                        small_block_size=model.config.default_small_block_size)
    prompt = torch.randint(0, 1000, (PROMPT,), generator=torch.Generator().manual_seed(2)).tolist()
    eager = FoldedVerifier(net, delta=DELTA, backend="triton", attention="correct", cost=None, dense_fallback=False)
    methods = {
        "vanilla": (DenseVerifier(net), None),
        "spiffy": (DenseVerifier(net), GRAPH),
        "specfold": (eager, GRAPH),
        "specfold_graphed": (GraphedVerifier(eager), GRAPH),
    }
    for ratio in FOLDS:  # the same decode with the fold ratio fixed (random weights rarely fold at δ = 0.1)
        imposed = FoldedVerifier(net, cfg=FoldConfig(delta=0.0, ffn="paper", attention="correct", backend="triton",
                                                     dense_fallback=False, imposed_fold=ratio), cost=None)
        methods[f"specfold_fold{ratio}"] = (imposed, GRAPH)
        methods[f"specfold_fold{ratio}_graphed"] = (GraphedVerifier(imposed), GRAPH)
    syncs = {m: pass_syncs(model, v) for m, (v, _) in methods.items()}
    runs = {m: [] for m in methods}
    tokens = {}
    for rep in range(3):  # rep 0 warms up (Triton compiles, graphs are captured); medians of reps 1-2, interleaved
        for m, (v, g) in methods.items():
            drafter = None if g is None else GraphDrafter(g, model.mask_id, dcfg.small_block_size, None, device=dev)
            res = decode(model, prompt, dcfg, verifier=v, drafter=drafter)
            if rep:
                runs[m].append(res)
            tokens[m] = res.token_ids
    row = {"shape": name, "dtype": "bfloat16", "prompt": PROMPT, "new_tokens": NEW_TOKENS, "delta": DELTA}
    for m, rs in runs.items():
        secs = sorted(r.seconds for r in rs)[len(rs) // 2]
        r = rs[-1]
        row[m] = {"tokens_per_s": r.generated_tokens / secs, "seconds": secs, "nfe": r.nfe,
                  "accepted_drafts": r.accepted_drafts, "fold_ratio": r.engine_stats.fold_ratio(),
                  "syncs_per_pass": syncs[m], "same_tokens_as_vanilla": tokens[m] == tokens["vanilla"]}
    row["graphed_equals_eager"] = all(tokens[f"{m}_graphed"] == tokens[m] for m in methods
                                      if f"{m}_graphed" in methods)
    decodes.append(row)
    del model, net, methods, eager
    gc.collect()
    torch.cuda.empty_cache()

ok = (all(c["ok"] for c in checks) and tests_rc in (0, -1) and all(d["graphed_equals_eager"] for d in decodes)
      and all(d["spiffy"]["same_tokens_as_vanilla"] for d in decodes))
report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
          "triton": __import__("triton").__version__, "kernel_tests_rc": tests_rc, "layer_checks": checks,
          "layer_bench": bench, "decode": decodes, "ok": ok}
with open(out_path, "w") as fh:
    json.dump(report, fh, indent=2)

print(f"{'shape':<20}{'dtype':<10}{'err triton':>12}{'err torch':>12}{'limit':>12}  ok")
for c in checks:
    print(f"{c['shape']:<20}{c['dtype']:<10}{c['err_triton']:>12.3g}{c['err_torch']:>12.3g}{c['limit']:>12.3g}  {c['ok']}")
print(f"\n{'shape':<20}{'fold':>6}{'dense ms':>10}{'triton ms':>11}{'torch ms':>10}{'tri/dense':>10}{'limit':>8}")
for b in bench:
    print(f"{b['shape']:<20}{b['fold_ratio']:>6.1f}{b['dense_ms']:>10.3f}{b['folded_triton_ms']:>11.3f}"
          f"{b['folded_torch_ms']:>10.3f}{b['triton_over_dense']:>10.3f}{b['flop_limit_ratio']:>8.3f}")
print(f"\n{'shape':<20}{'method':<18}{'tok/s':>9}{'nfe':>6}{'fold':>7}{'syncs/pass':>11}  same as vanilla")
for d in decodes:
    for m in [k for k in d if isinstance(d[k], dict)]:
        r = d[m]
        fr = "-" if r["fold_ratio"] is None else f"{r['fold_ratio']:.2f}"
        print(f"{d['shape']:<20}{m:<18}{r['tokens_per_s']:>9.1f}{r['nfe']:>6}{fr:>7}{r['syncs_per_pass']:>11}"
              f"  {r['same_tokens_as_vanilla']}")
print(f"\nreport: {out_path}")
if not ok:
    print("gpu_check: KERNEL MISMATCH, test failure or graphed != eager (see above and the report)", file=sys.stderr)
    sys.exit(1)
PYEOF
