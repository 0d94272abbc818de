"""Layer benchmark: one transformer layer, dense verification vs the folded layer at an imposed fold ratio.

Dims: ``B`` draft branches, ``K = B + 1`` branches, ``N`` block length, ``P`` prefix length, ``E`` hidden,
``Hq``/``Hkv`` heads, ``D`` head dim, ``F`` FFN size, ``f`` fold ratio.

Used by ``specfold bench layer``. One layer of a named shape gets random weights; every draft (branch, position)
folds with probability ``f`` (the main branch never folds), drawn once before timing. Three executions are timed
side by side, interleaved (A B C A B C …), after a warm-up; the median and the spread (max − min) are reported:

* *dense*: one batched layer over all ``K`` branches (the same pieces as :meth:`DLLM.forward`);
* *folded*: :func:`~specfold.engine.plan.gate_and_compact` (ρ is computed and paid for, then the imposed mask
  replaces Eq. 5) followed by :func:`~specfold.engine.folded_layer.folded_layer` in the default engine settings (cost
  rule on, attention ``auto``; the imposed mask governs the FFN too, ``ffn="paper"``), or the same two steps on the
  Triton kernels (``backend="triton"``); dense is always torch;
* *rows*: the measured limit — the same layer's arithmetic on the ``R`` recomputed rows packed contiguously
  beforehand (QKV + attention + FFN on ``R`` rows, o_proj on all ``K·N`` rows, no gate, no gathers).
  ``rows_limit_ratio = rows / dense`` is what a folded layer with free bookkeeping would take.

FLOP limit (multiply-adds per row; ``R`` = recomputed rows = ``N + (1 − f̂)·B·N`` with ``f̂`` the realised fold
ratio of the drawn mask)::

    qkv = E·(Hq + 2·Hkv)·D     attn = 2·Hq·D·(P + N)     o = Hq·D·E     ffn = 3·E·F
    dense  = K·N·(qkv + attn + o + ffn)
    folded = R·(qkv + attn + ffn) + K·N·o + Σ_{corrected rows} 4·|Δ|·Hq·D
    flop_limit_ratio = folded / dense

The last term is Eq. 8's work: for each of ``|Δ|`` positions a score and a value row, for both the removed
(source) and the added (branch) key. Gate, compaction, gathers and the o_proj rows the engine can skip (folded
rows with ``Δ = ∅``) are not in the limit.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import torch

from specfold.bench.shapes import SHAPES, LayerShape  # noqa: F401  (the one table of shapes; re-exported)
from specfold.config import ModelConfig, RopeConfig
from specfold.engine.cost import LayerCost, measure_machine
from specfold.engine.folded_layer import folded_layer
from specfold.engine.gate import BranchGraph
from specfold.engine.layer_types import BACKENDS, FoldConfig, LayerContext
from specfold.engine.plan import correction_plan, gate_and_compact
from specfold.model.attention import attend_fused
from specfold.model.rope import Rotary
from specfold.model.transformer import Layer
from specfold.timing import interleaved


@dataclass
class LayerBenchResult:
    shape: str
    fold_ratio: float  # requested f
    realised_fold_ratio: float  # fraction of draft (branch, position) pairs folded in the drawn mask
    branches: int
    block: int
    prefix: int
    dtype: str
    dense_seconds: float  # median
    folded_seconds: float  # median
    dense_spread: float  # max - min over repeats
    folded_spread: float
    ratio: float  # folded / dense
    rows_limit_ratio: float  # rows / dense: the layer's arithmetic on the packed recomputed rows only
    rows_seconds: float  # median
    flop_limit_ratio: float
    attention_plan: str  # what the cost rule chose for the attention part (dense / direct / correct)
    repeats: int
    threads: int
    # with compile=True, timed in the same interleaved rounds: the compiled folded layer (engine/compiled.py
    # CompiledFold) and the rows limit under torch.compile
    compiled_seconds: float | None = None
    compiled_rows_seconds: float | None = None
    compiled_rows_ratio: float | None = None  # compiled folded / compiled rows limit
    compile_seconds: float | None = None  # their first calls, which compiled

    def as_dict(self) -> dict[str, float | int | str]:
        return asdict(self)


def default_parents(branches: int) -> list[int]:
    """A binary draft tree (``par(i) = (i − 1) // 2``): siblings and chains, depth ⌈log2(B + 1)⌉."""
    return [-1] + [(i - 1) // 2 for i in range(1, branches + 1)]


def model_config(shape: LayerShape, layers: int = 1, vocab: int = 16) -> ModelConfig:
    """A model config of ``shape`` (plain RoPE, θ = 10⁶) with ``layers`` layers and ``vocab`` entries."""
    return ModelConfig(
        family=shape.family_name, model_type="bench", vocab_size=vocab, qk_norm=shape.family_name == "sdar",
        hidden_size=shape.hidden, intermediate_size=shape.ffn, num_layers=layers, num_heads=shape.heads,
        num_kv_heads=shape.kv_heads, head_dim=shape.head_dim, rms_norm_eps=1e-6, max_position_embeddings=4096,
        qkv_bias=shape.qkv_bias, tie_word_embeddings=False, rope=RopeConfig(theta=1e6),
    )


def make_layer(shape: LayerShape, dtype: torch.dtype, device: str, seed: int) -> Layer:
    gen = torch.Generator().manual_seed(seed)
    layer = Layer(model_config(shape))
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (p.shape[-1] ** -0.5 if p.ndim == 2 else 0.1) + (p.ndim == 1))
    return layer.to(device=device, dtype=dtype).eval()


def dense_layer(
    layer: Layer,
    h: torch.Tensor,  # [K*N, E]
    ctx: LayerContext,
    prefix_k: torch.Tensor,  # [Hkv, P, D]
    prefix_v: torch.Tensor,  # [Hkv, P, D]
    k: int,
) -> torch.Tensor:
    """The dense verifier's layer over all ``K`` branches (as in :meth:`DLLM.forward`). Returns ``[K*N, E]``."""
    n = ctx.cos.shape[0]
    q, kk, v = layer.qkv(h, ctx.cos.repeat(k, 1), ctx.sin.repeat(k, 1), None)
    o = attend_fused(q.view(k, n, layer.hq, layer.d), prefix_k, prefix_v, kk.view(k, n, layer.hkv, layer.d),
                     v.view(k, n, layer.hkv, layer.d), None, ctx.scale)
    h = h + layer.attn_out(o.to(h.dtype).reshape(k * n, layer.hq, layer.d))
    return h + layer.ffn(h)


def rows_layer(
    layer: Layer,
    packed: torch.Tensor,  # [R, E] the recomputed rows' inputs, packed beforehand
    cos: torch.Tensor,  # [R, D]
    sin: torch.Tensor,  # [R, D]
    scale: float,
    prefix_k: torch.Tensor,  # [Hkv, P, D]
    prefix_v: torch.Tensor,  # [Hkv, P, D]
    o_all: torch.Tensor,  # [K*N, Hq*D] preallocated attention outputs of every row
    n: int,
) -> torch.Tensor:
    """The rows limit: QKV, attention (over the prefix and ``N`` block keys) and FFN on the ``R`` packed rows,
    o_proj on all ``K·N`` rows; no gate, no gathers. Returns ``[R, E]``."""
    r = packed.shape[0]
    q, kk, v = layer.qkv(packed, cos, sin, None)
    o = attend_fused(q.view(1, r, layer.hq, layer.d), prefix_k, prefix_v, kk[:n].view(1, n, layer.hkv, layer.d),
                     v[:n].view(1, n, layer.hkv, layer.d), None, scale)
    o_all[:r] = o.to(o_all.dtype).reshape(r, -1)  # (MHA: o is a strided view)
    h1 = packed + layer.attn_out(o_all.view(o_all.shape[0], layer.hq, layer.d))[:r]
    return h1 + layer.ffn(h1)


def flop_limit_ratio(
    shape: LayerShape, k: int, n: int, prefix: int, recomputed: int, delta_sizes: torch.Tensor  # [C] |Δ| per row
) -> float:
    """The module docstring's formula."""
    e, hq, hkv, d, f = shape.hidden, shape.heads, shape.kv_heads, shape.head_dim, shape.ffn
    qkv, attn, o, ffn = e * (hq + 2 * hkv) * d, 2 * hq * d * (prefix + n), hq * d * e, 3 * e * f
    dense = k * n * (qkv + attn + o + ffn)
    folded = recomputed * (qkv + attn + ffn) + k * n * o + 4 * int(delta_sizes.sum()) * hq * d
    return folded / dense


def bench_layer(
    shape: str,
    fold_ratio: float,
    branches: int = 7,
    block: int = 32,
    prefix: int = 512,
    dtype: torch.dtype = torch.bfloat16,
    repeats: int = 5,
    backend: str = "torch",
    warmup: int = 1,
    seed: int = 0,
    device: str = "cpu",
    threads: int | None = None,
    compile: bool = False,
) -> LayerBenchResult:
    """Time one dense and one folded layer step side by side (see the module docstring). ``threads`` sets torch's
    CPU threads for the run (restored after); on a CPU shared with other jobs, 1 thread gives stable timings.
    ``compile``: also the compiled folded layer and the compiled rows limit (torch backend)."""
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _bench_layer(shape, fold_ratio, branches, block, prefix, dtype, repeats, backend, warmup, seed, device,
                            compile)
    finally:
        torch.set_num_threads(previous)


@dataclass
class LayerCase:
    """The three executions :func:`bench_layer` times, on one drawn input (each returns the layer's output rows):
    ``dense()`` ``[K*N, E]``, ``folded()`` ``[K*N, E]``, ``rows()`` ``[R, E]`` (the recomputed rows, in order; the
    first ``N`` are the main branch's). ``fold`` ``[K, N]`` is the imposed mask."""

    dense: Callable[[], torch.Tensor]
    folded: Callable[[], torch.Tensor]
    rows: Callable[[], torch.Tensor]
    fold: torch.Tensor
    flop_limit_ratio: float
    attention_plan: str
    compiled: Callable[[], torch.Tensor] | None = None  # the compiled folded layer (compile=True)
    compiled_rows: Callable[[], torch.Tensor] | None = None  # the rows limit under torch.compile


def layer_case(
    shape: str,
    fold_ratio: float,
    branches: int = 7,
    block: int = 32,
    prefix: int = 512,
    dtype: torch.dtype = torch.bfloat16,
    backend: str = "torch",
    seed: int = 0,
    device: str = "cpu",
    compile: bool = False,
) -> LayerCase:
    """One layer of ``shape`` with random weights, its input, the imposed fold mask, and the three executions (five
    with ``compile``)."""
    if shape not in SHAPES:
        raise ValueError(f"unknown layer shape {shape!r}; available: {', '.join(SHAPES)}")
    if backend not in BACKENDS:
        raise ValueError(f"unknown folded backend {backend!r}; available: {', '.join(BACKENDS)}")
    if not 0.0 <= fold_ratio <= 1.0:
        raise ValueError(f"fold ratio must be in [0, 1], got {fold_ratio}")
    sh = SHAPES[shape]
    k, n = branches + 1, block
    layer = make_layer(sh, dtype, device, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    parents = torch.tensor(default_parents(branches), device=device)
    # Drafts' inputs are their parent's plus a small perturbation (the imposed mask decides folding anyway).
    h = torch.randn(k, n, sh.hidden, generator=gen)
    for i in range(1, k):
        h[i] = h[parents[i]] + 0.05 * torch.randn(n, sh.hidden, generator=gen)
    h = h.to(device=device, dtype=dtype).reshape(k * n, sh.hidden)
    fold = (torch.rand(k, n, generator=gen) < fold_ratio).to(device)
    fold[0] = False
    recomputed = (~fold).reshape(-1).nonzero().squeeze(1)
    pk = torch.randn(sh.kv_heads, prefix, sh.head_dim, generator=gen).to(device=device, dtype=dtype)
    pv = torch.randn(sh.kv_heads, prefix, sh.head_dim, generator=gen).to(device=device, dtype=dtype)
    cos, sin, _ = Rotary(RopeConfig(theta=1e6), sh.head_dim).tables(torch.arange(prefix, prefix + n), dtype)
    ctx = LayerContext(cos=cos.to(device), sin=sin.to(device), qscale=None, scale=sh.head_dim**-0.5, parents=parents)
    cfg = FoldConfig(delta=0.0, ffn="paper", backend=backend)  # the imposed mask governs the FFN too
    cost = LayerCost.of(sh.hidden, sh.heads, sh.kv_heads, sh.head_dim, sh.ffn, measure_machine(device, dtype).op_macs)

    def run_dense() -> torch.Tensor:
        return dense_layer(layer, h, ctx, pk, pv, k)

    plan_fn, layer_fn = gate_and_compact, folded_layer
    if backend == "triton":  # imported only here: the torch paths never need Triton
        from specfold.engine.triton_backend import folded_layer_triton as layer_fn
        from specfold.engine.triton_backend import plan_layer as plan_fn

    def run_folded() -> torch.Tensor:
        plan = plan_fn(h.view(k, n, -1), parents, 0.0, fold=fold)
        return layer_fn(layer, h, plan, ctx, pk, pv, cfg, False, cost)[0]

    packed = h[recomputed].contiguous()  # [R, E]
    pos = recomputed % n
    cos_r, sin_r = ctx.cos[pos].contiguous(), ctx.sin[pos].contiguous()
    o_all = torch.zeros(k * n, sh.heads * sh.head_dim, dtype=dtype, device=device)

    def run_rows() -> torch.Tensor:
        return rows_layer(layer, packed, cos_r, sin_r, ctx.scale, pk, pv, o_all, n)

    run_compiled = run_crows = None
    if compile:
        from specfold.engine.compiled import BACKEND, CompiledFold

        cctx = replace(ctx, graph=BranchGraph.of(parents))
        plan_c, layer_c = CompiledFold().steps(cctx)
        rows_c = torch.compile(rows_layer, dynamic=True, backend=BACKEND)

        def run_compiled() -> torch.Tensor:
            plan = plan_c(h.view(k, n, -1), cctx.graph, 0.0, fold)
            return layer_c(layer, h, plan, cctx, pk, pv, cfg)[0]

        def run_crows() -> torch.Tensor:
            return rows_c(layer, packed, cos_r, sin_r, ctx.scale, pk, pv, o_all, n)

    plan = gate_and_compact(h.view(k, n, -1), parents, 0.0, fold=fold)
    fix = correction_plan(plan)
    chosen = cost.attention_plan(k * n, n, prefix, plan.rows.numel(), fix.corrected.numel())
    return LayerCase(
        dense=run_dense, folded=run_folded, rows=run_rows, fold=fold,
        flop_limit_ratio=flop_limit_ratio(sh, k, n, prefix, plan.rows.numel(), fix.delta.sum(dim=1)),
        attention_plan=chosen if backend == "torch" else "correct", compiled=run_compiled, compiled_rows=run_crows,
    )


@torch.inference_mode()
def _bench_layer(
    shape: str,
    fold_ratio: float,
    branches: int,
    block: int,
    prefix: int,
    dtype: torch.dtype,
    repeats: int,
    backend: str,
    warmup: int,
    seed: int,
    device: str,
    compile: bool = False,
) -> LayerBenchResult:
    case = layer_case(shape, fold_ratio, branches, block, prefix, dtype, backend, seed, device, compile)
    runs = {"dense": case.dense, "folded": case.folded, "rows": case.rows}
    compile_seconds = None
    if case.compiled is not None:
        runs["compiled"], runs["compiled_rows"] = case.compiled, case.compiled_rows
        t0 = time.perf_counter()
        case.compiled(), case.compiled_rows()
        compile_seconds = time.perf_counter() - t0
    # interleaved so that background load hits all alike
    t = interleaved(runs, repeats, warmup, device)
    dense, folded, rows = t["dense"], t["folded"], t["rows"]
    med = {name: t[name].median for name in ("compiled", "compiled_rows") if name in t}
    return LayerBenchResult(
        shape=shape, fold_ratio=fold_ratio, realised_fold_ratio=float(case.fold[1:].float().mean()),
        branches=branches, block=block, prefix=prefix, dtype=str(dtype).removeprefix("torch."),
        dense_seconds=dense.median, folded_seconds=folded.median, dense_spread=dense.spread,
        folded_spread=folded.spread, ratio=folded.median / dense.median, rows_limit_ratio=rows.median / dense.median,
        rows_seconds=rows.median, flop_limit_ratio=case.flop_limit_ratio, attention_plan=case.attention_plan,
        repeats=repeats, threads=torch.get_num_threads(), compiled_seconds=med.get("compiled"),
        compiled_rows_seconds=med.get("compiled_rows"),
        compiled_rows_ratio=med["compiled"] / med["compiled_rows"] if med else None, compile_seconds=compile_seconds,
    )
