"""Pass benchmark: one whole verification pass (embedding, ``L`` layers, LM head), dense vs folded, with real gate
decisions and a per-part breakdown.

Dims: ``B`` draft branches, ``K = B + 1`` branches, ``N`` block length, ``P`` prefix length, ``L`` layers, ``V``
vocabulary.

Used by ``specfold bench pass``. A random-weight model of a named shape (:data:`~specfold.bench.layer.SHAPES`,
``L`` layers, vocabulary ``V``) verifies ``K`` block states against a random prefix cache of ``P`` rows: the main
state has its first small block unmasked, and each draft is its parent plus one or two more positions of the next
small block with random tokens (a binary draft tree, as :func:`~specfold.bench.layer.default_parents`). The gate
decides at ``δ`` as in decoding, so the fold ratio is what this model gives, reported beside the times. Dense
(:class:`~specfold.engine.dense.DenseVerifier`) and folded (:class:`~specfold.engine.folded.FoldedVerifier`, default
settings) passes are timed interleaved after a warm-up (medians); then one folded pass runs under the profiler,
whose ``specfold::<part>`` ranges (:data:`~specfold.engine.profiling.PARTS`) give the breakdown, and one under
:class:`~specfold.bench.ops.OpCounter` for the framework ops and host syncs per layer.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

from specfold.bench.layer import SHAPES, default_parents, model_config
from specfold.bench.ops import count_ops
from specfold.engine.cost import LayerCost
from specfold.engine.dense import DenseVerifier
from specfold.engine.folded import FoldedVerifier
from specfold.engine.pass_measure import measure_pass
from specfold.engine.profiling import PARTS
from specfold.model.random_checkpoint import random_model
from specfold.timing import interleaved, timed_call


@dataclass
class PassBenchResult:
    shape: str
    layers: int
    vocab: int
    branches: int
    block: int
    prefix: int
    dtype: str
    delta: float
    fold_ratio: float  # attention gate: folded ÷ draft (branch, position, layer) triples
    ffn_fold_ratio: float  # FFN gate
    dense_layers: int  # layers the cost rule ran densely
    dense_seconds: float  # median
    folded_seconds: float  # median
    ratio: float  # folded / dense
    parts: dict[str, float]  # seconds per part of one profiled folded pass (+ "other")
    ops_per_layer: float  # framework ops one folded pass dispatches, per layer
    syncs_per_layer: float  # of those, ops that wait for a host value
    repeats: int
    threads: int
    imposed_fold: float | None = None  # the fold ratio imposed on every layer (None: the gate's decisions at δ)
    rows_seconds: float | None = None  # median of the rows limit (with an imposed ratio): see bench_pass
    rows_ratio: float | None = None  # folded / rows limit
    # with compile=True: the compiled folded pass (engine/compiled.py CompiledFold) and the compiled dense forward
    # (the dense pass and the rows limit through it), timed in the same interleaved rounds
    compiled_seconds: float | None = None  # median of the compiled folded pass
    compiled_dense_seconds: float | None = None
    compiled_rows_seconds: float | None = None
    compiled_rows_ratio: float | None = None  # compiled folded / compiled rows limit
    compile_seconds: float | None = None  # the warm-up passes that compiled (folded and dense forwards)
    compiled_graphs: int | None = None
    # the per-pass rule's constants on this machine (engine/cost.py PassCost, measured once per process): one dense
    # layer over its calibration rows, and G, the bookkeeping one folded layer adds
    rule_dense_layer_seconds: float | None = None
    rule_gate_seconds: float | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def draft_states(k: int, n: int, parents: list[int], vocab: int, mask_id: int, gen: torch.Generator) -> torch.Tensor:
    """``[K, N]``: main = first quarter unmasked; each draft = its parent + 1–2 positions of the next quarter."""
    states = torch.full((k, n), mask_id, dtype=torch.long)
    first = n // 4
    states[0, :first] = torch.randint(0, vocab - 1, (first,), generator=gen)
    for i in range(1, k):
        states[i] = states[parents[i]]
        extra = int(torch.randint(1, 3, (1,), generator=gen))
        pos = first + torch.randint(0, first, (extra,), generator=gen)
        states[i, pos] = torch.randint(0, vocab - 1, (extra,), generator=gen)
    return states


EMBEDDED = "embedded"  # the shipped model itself (its weights, all its layers), not a random one


def bench_pass(
    shape: str,
    delta: float,
    layers: int = 4,
    vocab: int | None = None,
    branches: int = 7,
    block: int = 32,
    prefix: int = 512,
    dtype: torch.dtype = torch.bfloat16,
    repeats: int = 5,
    seed: int = 0,
    device: str = "cpu",
    threads: int | None = None,
    compile: bool = False,
    **fold_settings,
) -> PassBenchResult:
    """Time dense vs folded verification passes side by side (module docstring). ``vocab`` defaults to the shape's
    real vocabulary; ``fold_settings`` go to :class:`~specfold.engine.layer_types.FoldConfig`. ``shape="embedded"``:
    the shipped model (its weights and all its layers; ``layers`` and ``vocab`` ignored).

    With ``imposed_fold`` in ``fold_settings`` every layer folds that share of its draft rows, and the *rows limit*
    is timed beside: the dense pass over only as many branch blocks as a folded layer recomputes rows
    (``N + (1 − f)·(K − 1)·N``, rounded to blocks) plus the LM head over the other rows — the arithmetic folding
    cannot avoid, without its bookkeeping.

    ``compile``: also the compiled folded pass, the compiled dense pass and the compiled rows limit, in the same
    interleaved rounds (their first calls, which compile, are timed apart and reported as ``compile_seconds``)."""
    if shape not in SHAPES and shape != EMBEDDED:
        raise ValueError(f"unknown shape {shape!r}; available: {', '.join([*SHAPES, EMBEDDED])}")
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        real_vocab = None if shape == EMBEDDED else vocab or SHAPES[shape].vocab
        return _bench_pass(shape, delta, layers, real_vocab, branches, block, prefix, dtype, repeats, seed, device,
                           compile, fold_settings)
    finally:
        torch.set_num_threads(previous)


@torch.inference_mode()
def _bench_pass(shape, delta, layers, vocab, branches, block, prefix, dtype, repeats, seed, device, compile,
                settings):
    k, n = branches + 1, block
    if shape == EMBEDDED:
        from specfold.model.loading import load_model

        loaded = load_model(None, dtype=dtype, device=device)
        net, mask_id = loaded.net, loaded.mask_id
        layers, vocab = len(net.layers), net.cfg.vocab_size
    else:
        net = random_model(model_config(SHAPES[shape], layers, vocab), seed=seed).to(device=device, dtype=dtype)
        mask_id = vocab - 1
    gen = torch.Generator().manual_seed(seed + 1)
    cache = net.new_cache(prefix + n)
    cache.k[:, :, :prefix] = torch.randn(cache.k[:, :, :prefix].shape, generator=gen).to(dtype)
    cache.v[:, :, :prefix] = torch.randn(cache.v[:, :, :prefix].shape, generator=gen).to(dtype)
    cache.commit(prefix)
    parent_list = default_parents(branches)
    states = draft_states(k, n, parent_list, vocab, mask_id, gen).to(device)
    parents = torch.tensor(parent_list, device=device)
    dense, folded = DenseVerifier(net), FoldedVerifier(net, delta, **settings)
    run_dense = lambda: dense.verify(cache, states, parents)
    run_folded = lambda: folded.verify(cache, states, parents)
    runs = {"dense": run_dense, "folded": run_folded}
    imposed = settings.get("imposed_fold")
    if imposed is not None:
        kr = max(1, min(k, round(1 + (1.0 - imposed) * (k - 1))))  # branch blocks of recomputed rows per layer
        rest = torch.randn(k - kr, n, net.cfg.hidden_size, generator=gen).to(device=device, dtype=dtype)

        def run_rows() -> None:
            dense.verify(cache, states[:kr], parents[:kr])
            if k > kr:
                net.logits(rest)

        runs["rows"] = run_rows
    compiled: dict[str, float | int] = {}
    if compile:
        from specfold.engine.compiled import graphs_compiled

        cdense, cfolded = DenseVerifier(net, compile=True), FoldedVerifier(net, delta, compile=True, **settings)
        runs["compiled_dense"] = lambda: cdense.verify(cache, states, parents)
        runs["compiled"] = lambda: cfolded.verify(cache, states, parents)
        if imposed is not None:
            def run_crows() -> None:
                cdense.verify(cache, states[:kr], parents[:kr])
                if k > kr:
                    net.logits(rest)

            runs["compiled_rows"] = run_crows
        before = graphs_compiled()
        t0 = time.perf_counter()
        for name in ("compiled_dense", "compiled", "compiled_rows"):
            if name in runs:
                runs[name]()
        compiled = {"compile_seconds": time.perf_counter() - t0, "compiled_graphs": graphs_compiled() - before}
    # interleaved so that background load hits all alike
    t = interleaved(runs, repeats, warmup=1, device=device)

    stats = run_folded().stats
    for _ in range(2):  # NOTE: the process's first profile charges the profiler's start-up to the first part entered
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            total = timed_call(run_folded, device)
    parts = {name: 0.0 for name in PARTS}
    for ev in prof.key_averages():
        if ev.key.startswith("specfold::"):
            parts[ev.key.removeprefix("specfold::")] += ev.cpu_time_total * 1e-6
    parts["other"] = max(0.0, total - sum(parts.values()))
    counter = count_ops(run_folded)
    d_med, f_med = t["dense"].median, t["folded"].median
    rule = measure_pass(net, folded.cost) if isinstance(folded.cost, LayerCost) else None
    med = {name: t[name].median for name in ("compiled", "compiled_dense", "compiled_rows") if name in t}
    crows = med["compiled"] / med["compiled_rows"] if "compiled_rows" in med else None
    return PassBenchResult(
        shape=shape, layers=layers, vocab=vocab, branches=branches, block=block, prefix=prefix,
        dtype=str(dtype).removeprefix("torch."), delta=delta, fold_ratio=stats.fold_ratio() or 0.0,
        ffn_fold_ratio=stats.fold_ratio("ffn") or 0.0, dense_layers=stats.dense_layers,
        dense_seconds=d_med, folded_seconds=f_med, ratio=f_med / d_med, parts=parts,
        ops_per_layer=counter.total / layers, syncs_per_layer=counter.syncs / layers, repeats=repeats,
        threads=torch.get_num_threads(), imposed_fold=imposed,
        rows_seconds=t["rows"].median if "rows" in t else None,
        rows_ratio=f_med / t["rows"].median if "rows" in t else None,
        compiled_seconds=med.get("compiled"), compiled_dense_seconds=med.get("compiled_dense"),
        compiled_rows_seconds=med.get("compiled_rows"), compiled_rows_ratio=crows,
        compile_seconds=compiled.get("compile_seconds"), compiled_graphs=compiled.get("compiled_graphs"),
        rule_dense_layer_seconds=None if rule is None else rule.dense_seconds,
        rule_gate_seconds=None if rule is None else rule.gate_seconds,
    )
