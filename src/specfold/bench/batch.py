"""Batch benchmark: total throughput and per-request latency of :func:`~specfold.decoding.decoder.decode_batch` over
a grid of batch sizes, methods side by side.

Used by ``specfold bench batch``. Every grid point decodes the same prompts: a queue of ``len(prompts)`` requests
streams through a continuous batch of at most ``R``. Points run interleaved — for each repeat, for each ``R``,
every method — so machine noise hits them alike; a point's figures are the medians over its repeats. Per point:
total throughput (generated tokens ÷ wall seconds of the whole queue), per-request latency (admission to finish:
p50, p95, mean), NFE and accepted drafts summed over the requests, the fold ratio, and ``agreement``: the fraction
of requests whose tokens equal that method's batch-1 tokens (1.0 by construction at ``R = 1``; exact equality is
the fp64 tests' claim, this measures it at the benchmark's dtype).

:func:`random_shape_model` builds the "real layer shape" model of the batch benchmark: random weights at a named
shape of :data:`~specfold.bench.layer.SHAPES` with a few layers (and, optionally, a smaller vocabulary), so the
GEMMs are in the weight-streaming regime of the real model while a run still fits on a CPU.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch

from specfold.config import DecodeConfig
from specfold.decoding.core import GenerationResult
from specfold.decoding.decoder import decode_batch
from specfold.engine.stats import FoldStats
from specfold.model.loading import LoadedModel
from specfold.timing import percentile, timed


@dataclass(frozen=True)
class BatchBenchConfig:
    batch_sizes: tuple[int, ...] = (1, 4, 8, 16)
    repeats: int = 1  # interleaved repeats of the whole grid; figures are medians over them

    def __post_init__(self) -> None:
        if not self.batch_sizes or any(b <= 0 for b in self.batch_sizes):
            raise ValueError(f"batch sizes must be positive integers, got {list(self.batch_sizes)}")
        if self.repeats <= 0:
            raise ValueError(f"repeats must be positive, got {self.repeats}")


@dataclass(frozen=True)
class BatchPoint:
    method: str
    batch_size: int
    requests: int
    generated_tokens: int
    wall_seconds: float  # median over repeats: the whole queue, first admission to last finish
    wall_spread: float  # max - min over repeats
    tokens_per_second: float  # generated_tokens / wall_seconds: total throughput
    latency_p50: float  # per-request seconds (admission to finish), of the median-wall repeat; interpolated
    latency_p95: float
    latency_mean: float
    nfe: int  # summed over the requests
    accepted_drafts: int
    fold_ratio: float | None  # attention gate, over every request's passes; None without folding
    agreement: float | None  # fraction of requests with the method's batch-1 tokens; None without R = 1 in the grid
    repeats: int
    # LLaDA / Dream windows (specfold.decoding.sequence): the fold ratio at the block's rows and at the rows around
    # it (the masked suffix; without a cache also the prompt and finished blocks); None without window passes
    fold_ratio_block: float | None = None
    fold_ratio_context: float | None = None
    dense_passes: int = 0  # passes with drafts the per-pass rule ran dense (median-wall repeat)
    compiled_graphs: int = 0  # graphs torch.compile built for this method in the whole run (warm-up included)
    compile_seconds: float = 0.0  # and the wall seconds of the passes that built them

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class BatchBenchProgress:
    done: int
    total: int
    method: str
    batch_size: int
    tokens_per_second: float


def bench_batch(
    model: LoadedModel,
    prompts: Sequence[Sequence[int]],
    cfg: DecodeConfig,
    methods: dict[str, object],  # name -> a method (``verifier``/``drafter`` attributes, e.g. api.Method)
    bench: BatchBenchConfig,
    progress: Callable[[BatchBenchProgress], None] | None = None,
) -> list[BatchPoint]:
    """The grid's points in (batch size, method) order. Each method first decodes a warm-up batch of the largest
    ``R`` (first calls, and the kernels a CPU GEMM library builds per shape, stay out of the timings)."""
    if not prompts:
        raise ValueError("the batch benchmark needs at least one prompt")
    top = max(bench.batch_sizes)
    compiled: dict[str, FoldStats] = {}  # per method, what its passes compiled (the warm-up pays nearly all of it)
    for name, m in methods.items():
        warm = decode_batch(model, [list(p) for p in prompts[:top]], cfg, m, max_batch=top)
        compiled[name] = sum((x.engine_stats for x in warm), FoldStats())
    runs: dict[tuple[str, int], list[tuple[float, list[GenerationResult]]]] = {}
    total, done = bench.repeats * len(bench.batch_sizes) * len(methods), 0
    for _ in range(bench.repeats):
        for r in bench.batch_sizes:
            for name, m in methods.items():
                queue = [list(p) for p in prompts]
                results, wall = timed(partial(decode_batch, model, queue, cfg, m, max_batch=r), model.net.device)
                runs.setdefault((name, r), []).append((wall, results))
                compiled[name] = sum((x.engine_stats for x in results), compiled[name])
                done += 1
                if progress is not None:
                    tokens = sum(x.generated_tokens for x in results)
                    progress(BatchBenchProgress(done, total, name, r, tokens / wall))
    points = []
    for r in bench.batch_sizes:
        for name in methods:
            reps = sorted(runs[name, r], key=lambda x: x[0])
            wall, results = reps[len(reps) // 2]
            base = runs[name, 1][0][1] if 1 in bench.batch_sizes else None
            lat = [x.seconds for x in results]
            stats = sum((x.engine_stats for x in results), FoldStats())
            tokens = sum(x.generated_tokens for x in results)
            agree = (sum(a.token_ids == b.token_ids for a, b in zip(results, base, strict=True)) / len(results)
                     if base is not None else None)
            block, context = stats.window_fold_ratios()
            points.append(BatchPoint(
                method=name, batch_size=r, requests=len(results), generated_tokens=tokens, wall_seconds=wall,
                wall_spread=reps[-1][0] - reps[0][0], tokens_per_second=tokens / wall,
                latency_p50=percentile(lat, 50), latency_p95=percentile(lat, 95),
                latency_mean=statistics.fmean(lat), nfe=sum(x.nfe for x in results),
                accepted_drafts=sum(x.accepted_drafts for x in results),
                fold_ratio=stats.fold_ratio(), agreement=agree, fold_ratio_block=block, fold_ratio_context=context,
                repeats=len(reps), dense_passes=stats.dense_passes,
                compiled_graphs=compiled[name].compiled_graphs, compile_seconds=compiled[name].compile_seconds,
            ))
    return points


def random_shape_model(
    shape: str, layers: int, vocab: int | None = None, dtype: torch.dtype = torch.bfloat16, seed: int = 0
) -> LoadedModel:
    """Random weights at ``shape`` (:data:`~specfold.bench.layer.SHAPES`) with ``layers`` layers and ``vocab``
    entries (default: the shape's real vocabulary); the last two ids are mask and stop."""
    from specfold.bench.layer import SHAPES
    from specfold.model.families import config_from_dict
    from specfold.model.random_checkpoint import random_config, random_model

    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose one of {', '.join(SHAPES)}")
    s = SHAPES[shape]
    v = vocab or s.vocab
    family = s.family_name
    cfg = config_from_dict(random_config(
        family, vocab_size=v, hidden_size=s.hidden, num_heads=s.heads, num_kv_heads=s.kv_heads, num_layers=layers,
        intermediate_size=s.ffn, mask_token_id=v - 1, eos_token_id=v - 2, head_dim=s.head_dim,
    ))
    net = random_model(cfg, seed=seed).to(dtype).eval()
    return LoadedModel(net=net, config=cfg, tokenizer=None, mask_id=v - 1, stop_id=v - 2,
                       path=Path(f"random:{shape}:{layers}L"))


def shape_graph(block_size: int, budget: int = 7):
    """The draft graph for a ``--shape`` model: the embedded model's, or — for a block shorter than its position
    ranks (SDAR's blocks of 4) — ``budget`` nodes re-selected from the embedded calibration counts whose formulas
    stay within the block."""
    from specfold.decoding.calibration import counts_from_json, graph_from_counts
    from specfold.decoding.draft_graph import DraftGraph
    from specfold.model.embedded import EMBEDDED_DIR

    graph = DraftGraph.load(EMBEDDED_DIR / "draft_graph.json")
    if max(r for q in graph.nodes for step in q for r, _ in step) <= block_size:
        return graph
    counts = counts_from_json(json.loads((EMBEDDED_DIR / "draft_graph.counts.json").read_text()))
    fit = {q: c for q, c in counts.items() if all(r <= block_size for step in q for r, _ in step)}
    return graph_from_counts(fit, budget)


def held_out_prompts(
    model: LoadedModel, tasks: Sequence[str], count: int, vocab: int | None = None
) -> list[list[int]]:
    """``count`` test prompts spread over ``tasks`` (round robin), through the chat template; with ``vocab``, ids
    folded into ``[0, vocab - 2)`` (a random model's ids, the last two being mask and stop)."""
    from specfold.api import encode_prompt
    from specfold.eval.harness import load_task

    per_task = -(-count // len(tasks))
    samples = [load_task(t, "test", per_task).samples for t in tasks]
    queue = [s[i] for i in range(per_task) for s in samples if i < len(s)][:count]
    if len(queue) < count:
        raise ValueError(f"tasks {','.join(tasks)} hold {len(queue)} test prompts, fewer than the {count} asked for")
    ids = [encode_prompt(model, s.prompt, True) for s in queue]
    return ids if vocab is None else [[t % (vocab - 2) for t in p] for p in ids]
