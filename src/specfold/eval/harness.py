"""Evaluation harness: decode task samples with several methods side by side, score them, summarise.

One record per (sample, method) is appended to a JSONL file as soon as it exists, so a killed run resumes where it
stopped: a record whose key (task, method, method parameters, sample id) is already in the file is not redone.
Each record carries its provenance (model hash, dtype, device, decoding parameters, graph and task-data hashes, …;
:mod:`specfold.eval.provenance`) and a file written with other settings is refused rather than reused.
Methods run one after another on the same sample, so machine noise hits them alike (STYLE: compare side by side).

Summary per task and method: accuracy, NFE per sample, generated tokens per forward, tokens/s (total generated
tokens ÷ total wall-clock decode seconds: throughput, which at ``batch_size`` R > 1 counts the batch's wall time
once), latency (mean seconds from a request's admission to its finish), accepted drafts per verification pass,
fold ratio — and, relative to vanilla when it ran, the NFE and tokens/s ratios of the paper's Table 1.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from specfold.api import Method, decode_config_for, encode_prompt, prepare_method
from specfold.config import DecodeConfig, MethodConfig
from specfold.decoding.core import BatchRequest, Decoder, GenerationResult, cache_rows_needed, check_prompt
from specfold.decoding.decoder import decode
from specfold.engine.stats import FoldStats
from specfold.eval.provenance import check_resume, graph_hash, run_provenance, sample_hash
from specfold.eval.records import RecordsWriter, read_records, repair_tail
from specfold.io import check_output_path
from specfold.model.loading import LoadedModel

SYNTHETIC_PREFIX = "synth-"

__all__ = [
    "EvalPlan", "Progress", "format_table", "load_task", "read_records", "record_key", "repair_tail", "run_eval",
    "summarize",
]


class EvalSample(Protocol):
    task: str
    sample_id: str
    prompt: str


@dataclass
class TaskSource:
    samples: list[Any]
    score: Callable[[Any, str], bool]


def load_task(task: str, split: str = "test", limit: int | None = None, data_dir: Path | None = None) -> TaskSource:
    """Samples and scorer of a synthetic task (``synth-*``) or a real benchmark (``gsm8k``, ``math500``, …)."""
    if task.startswith(SYNTHETIC_PREFIX):
        from specfold.eval.tasks.synthetic import load_split, score

        return TaskSource(load_split(task, split, limit), score)
    from specfold.eval.benchmarks import BENCHMARKS, load_benchmark, score_benchmark

    if task not in BENCHMARKS:
        from specfold.eval.tasks.synthetic import TASKS

        raise ValueError(f"unknown task {task!r}; choose from {', '.join((*TASKS, *BENCHMARKS))}")
    return TaskSource(load_benchmark(task, data_dir, split=split, limit=limit), score_benchmark)


def record_key(rec: dict[str, Any]) -> str:
    return json.dumps([rec["task"], rec["method"], rec.get("params", {}), rec["sample_id"]], sort_keys=True)


def _key(task: str, spec: MethodConfig, sample: Any) -> str:
    return record_key({"task": task, "method": spec.method.value, "params": spec.params, "sample_id": sample.sample_id})


@dataclass
class EvalPlan:
    tasks: Sequence[str]
    methods: Sequence[MethodConfig]  # run side by side; records carry each one's label and params
    split: str = "test"
    limit: int | None = None
    data_dir: Path | None = None
    max_new_tokens: int = 256
    threshold: float = 0.9
    block_size: int | None = None
    small_block_size: int | None | str = "auto"
    steps: int | None = None  # a quota rule's passes per block (SDAR; refused for other families)
    strategy: str | None = None  # a quota rule's strategy (SDAR; refused for other families)
    cache: str | None = None  # LLaDA / Dream: Fast-dLLM v1's cache (none / prefix / dual; refused for other families)
    num_shards: int = 1
    shard_id: int = 0
    chat: bool = True
    batch_size: int = 1  # requests of a method decoded together (decode_batch, every method)
    sweep: dict[str, Any] | None = None  # a sweep's kind and fixed B / δ (part of every record's provenance)


@dataclass
class Progress:
    done: int
    total: int
    method: str
    tokens_per_second: dict[str, float] = field(default_factory=dict)


def check_plan(plan: EvalPlan) -> None:
    """ValueError for a plan that would write a record twice (a task or method listed twice) or names no shard."""
    if not 0 <= plan.shard_id < plan.num_shards:
        raise ValueError(f"shard id {plan.shard_id} is outside 0..{plan.num_shards - 1}")
    for what, items in (("task", list(plan.tasks)), ("method", list(plan.methods))):
        twice = next((x for i, x in enumerate(items) if x in items[:i]), None)
        if twice is not None:
            name = twice.label if isinstance(twice, MethodConfig) else twice
            raise ValueError(f"{what} {name!r} is listed twice; it would write every record twice")


def run_eval(
    model: LoadedModel,
    plan: EvalPlan,
    out: Path | None,
    progress: Callable[[Progress], None] | None = None,
    overwrite: bool = False,
) -> list[dict[str, Any]]:
    """Evaluate; append new records to ``out`` (resuming), and return all records of this plan (old and new).

    ``out`` is held by this run alone (an advisory lock: a second writer is refused) and must hold eval records
    only: anything else is refused before the file changes (:class:`~specfold.eval.records.RecordsWriter`). Every
    record carries its provenance (:mod:`specfold.eval.provenance`); an ``out`` holding records made with other
    settings is refused (:class:`~specfold.eval.provenance.ProvenanceMismatch`) unless ``overwrite``, which starts
    ``out`` afresh. Each record is appended as soon as its request finishes, at batch 1 and in a batch."""
    check_plan(plan)
    if out is not None:
        check_output_path(out)
    cfg = decode_config_for(model, plan.max_new_tokens, plan.threshold, plan.block_size, plan.small_block_size,
                            steps=plan.steps, strategy=plan.strategy, cache=plan.cache)
    prepared = {spec: prepare_method(model, spec, cfg) for spec in plan.methods}
    sources = {task: load_task(task, plan.split, plan.limit, plan.data_dir) for task in plan.tasks}
    work = [
        (task, sample, spec)
        for task in plan.tasks
        for i, sample in enumerate(sources[task].samples)
        if i % plan.num_shards == plan.shard_id
        for spec in plan.methods
    ]
    run_fields = run_provenance(model, cfg, plan)
    items = {
        _key(task, spec, sample): {"graph_hash": graph_hash(prepared[spec].graph), "task_data": sample_hash(sample)}
        for task, sample, spec in work
    }
    writer = RecordsWriter(out, overwrite).open() if out is not None else None
    try:
        if writer is not None:
            check_resume(out, writer.existing, run_fields, items, record_key)
        done = {record_key(r): r for r in (writer.existing if writer is not None else [])}
        warm = _warm_up(model, cfg, prepared)  # what each method's warm-up compiled: on its first new record
        totals: dict[str, list[float]] = {}
        finished = [sum(_key(task, spec, sample) in done for task, sample, spec in work)]

        def keep(key: str, spec: MethodConfig, rec: dict[str, Any]) -> None:
            compiled = warm.pop(spec, None)
            if compiled is not None and compiled.compiled_graphs:
                rec["compiled_graphs"] = rec.get("compiled_graphs", 0) + compiled.compiled_graphs
                rec["compile_seconds"] = rec.get("compile_seconds", 0.0) + compiled.compile_seconds
            rec["provenance"] = {**run_fields, **items[key]}
            done[key] = rec
            if writer is not None:
                writer.append(rec)
            tot = totals.setdefault(spec.label, [0.0, 0.0])
            tot[0] += rec["generated_tokens"]
            tot[1] += rec["wall_seconds"]
            finished[0] += 1
            if progress is not None:
                tps = {k: (v[0] / v[1] if v[1] else 0.0) for k, v in totals.items()}
                progress(Progress(finished[0], len(work), spec.label, tps))

        def batched(key: str, task: str, sample: Any, spec: MethodConfig, result: GenerationResult, wall: float):
            score = sources[task].score
            keep(key, spec, _run_one(model, cfg, prepared[spec], spec, task, sample, score, plan.chat, (result, wall)))

        _decode_batched(model, cfg, plan, prepared, work, done, batched)
        for task, sample, spec in work:  # batch 1 (a batch has decoded its requests already)
            key = _key(task, spec, sample)
            if key not in done:
                rec = _run_one(model, cfg, prepared[spec], spec, task, sample, sources[task].score, plan.chat)
                keep(key, spec, rec)
        return [done[_key(task, spec, sample)] for task, sample, spec in work]
    finally:
        if writer is not None:
            writer.close()


def _warm_up(
    model: LoadedModel, cfg: DecodeConfig, methods: Mapping[MethodConfig, Method]
) -> dict[MethodConfig, FoldStats]:
    """One short decode per method so that first-call overheads (and compiling, with ``compile``) stay out of the
    timings; returns each method's statistics of it (its ``compiled_graphs`` and ``compile_seconds``)."""
    ids = list(range(4, 12))
    ids = [i for i in ids if i not in (model.mask_id, model.stop_id)] or [0]
    short = DecodeConfig(
        max_new_tokens=cfg.block_size,
        threshold=cfg.threshold,
        block_size=cfg.block_size,
        small_block_size=cfg.small_block_size,
    )
    return {spec: decode(model, ids, short, verifier=m.verifier, drafter=m.drafter).engine_stats
            for spec, m in methods.items()}


def _decode_batched(
    model, cfg, plan: EvalPlan, prepared, work, done, on_result: Callable[..., None]
) -> None:
    """With ``plan.batch_size > 1``: the pending samples of each method decoded through one continuous batch
    (:class:`~specfold.decoding.core.Decoder`), each handed to ``on_result(key, task, sample, spec, result, wall)``
    as soon as it finishes, so that a kill loses only the requests still in the batch. ``wall``: the batch's
    wall-clock seconds since the previous request(s) finished, split among the requests finishing in this step, so
    that the shares sum to the batch's decode time (``on_result``'s own time, scoring and writing, left out)."""
    if plan.batch_size <= 1:
        return
    for spec, method in prepared.items():
        pending = [(_key(task, s, sample), task, sample) for task, sample, s in work if s == spec]
        pending = [p for p in pending if p[0] not in done]
        if not pending:
            continue
        prompts = [check_prompt(model, encode_prompt(model, sample.prompt, plan.chat), cfg) for _, _, sample in pending]
        capacity = max(cache_rows_needed(p.numel(), cfg) for p in prompts)
        decoder = Decoder(model, cfg, method, min(plan.batch_size, len(prompts)), capacity=capacity)
        for i, prompt in enumerate(prompts):
            decoder.submit(BatchRequest(i, prompt))
        last = time.perf_counter()
        while not decoder.idle:
            ended = [e for e in decoder.step() if e.result is not None]
            if not ended:
                continue
            share = (time.perf_counter() - last) / len(ended)
            for event in ended:
                key, task, sample = pending[event.request_id]
                on_result(key, task, sample, spec, event.result, share)
            last = time.perf_counter()


def _run_one(
    model, cfg, method: Method, spec: MethodConfig, task, sample, score, chat,
    batched: tuple[GenerationResult, float] | None = None,
) -> dict[str, Any]:
    ids = encode_prompt(model, sample.prompt, chat)
    if batched is None:
        result = decode(model, ids, cfg, verifier=method.verifier, drafter=method.drafter)
        wall = result.seconds
    else:
        result, wall = batched
    text = model.tokenizer.decode(result.token_ids, skip_special_tokens=True)
    stats = result.engine_stats
    # NOTE: at batch 1 a pass that met a new shape compiled inside this decode; like the warm-up's, that one-off cost
    # is reported in compile_seconds and kept out of the timings (throughput is the decode's). A batch's compile is
    # spread over its requests' wall shares, so batched timings keep it.
    compiling = stats.compile_seconds if stats.compiled_graphs and batched is None else 0.0
    rec: dict[str, Any] = {
        "task": task,
        "method": spec.method.value,
        "label": spec.label,
        "params": spec.params,
        "sample_id": sample.sample_id,
        "correct": bool(score(sample, text)),
        "nfe": result.nfe,
        "nfe_denoise": result.nfe_denoise,
        "generated_tokens": result.generated_tokens,
        "seconds": result.seconds - compiling,
        "wall_seconds": wall - compiling,
        "accepted_drafts": result.accepted_drafts,
        "boundary_drafts": result.boundary_drafts,
        "token_ids": result.token_ids,
        "prompt_tokens": len(ids),
        "text": text,
    }
    if stats.compiled_graphs:  # graphs this request's passes compiled (the warm-up's go on a method's first record)
        rec["compiled_graphs"] = stats.compiled_graphs
        rec["compile_seconds"] = stats.compile_seconds
    if stats.draft_triples:
        rec["fold_ratio"] = stats.fold_ratio()
        rec["ffn_fold_ratio"] = stats.fold_ratio("ffn")
        flat = stats.to_dict()
        for key in ("draft_triples", "folded_triples", "ffn_folded_triples", "dense_layers", "dense_passes", "layers",
                    "guard_fallbacks"):
            rec[key] = flat[key]
    return rec


def summarize(records: Iterable[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{task: {method_label: {accuracy, nfe_per_sample, tokens_per_forward, tokens_per_second, …}}}``."""
    groups: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for r in records:
        groups.setdefault(r["task"], {}).setdefault(r.get("label", r["method"]), []).append(r)
    summary: dict[str, dict[str, dict[str, Any]]] = {}
    for task, by_method in groups.items():
        summary[task] = {}
        for label, recs in by_method.items():
            n = len(recs)
            tokens = sum(r["generated_tokens"] for r in recs)
            seconds = sum(r["seconds"] for r in recs)  # per-request latency (admission to finish)
            wall = sum(r.get("wall_seconds", r["seconds"]) for r in recs)  # = seconds at batch 1
            nfe = sum(r["nfe"] for r in recs)
            passes = sum(r.get("nfe_denoise", r["nfe"]) for r in recs)
            row: dict[str, Any] = {
                "n": n,
                "accuracy": sum(bool(r["correct"]) for r in recs) / n,
                "nfe_per_sample": nfe / n,
                "tokens_per_forward": tokens / nfe if nfe else 0.0,
                "tokens_per_second": tokens / wall if wall else 0.0,  # total throughput
                "latency_seconds": seconds / n,
                "generated_tokens_per_sample": tokens / n,
            }
            compiled = sum(r.get("compile_seconds", 0.0) for r in recs)
            if compiled:  # the method's compile (warm-up included), apart from its decode seconds
                row["compile_seconds"] = compiled
                row["compiled_graphs"] = sum(r.get("compiled_graphs", 0) for r in recs)
            if recs[0]["method"] != "vanilla":
                row["accepted_per_step"] = sum(r.get("accepted_drafts", 0) for r in recs) / passes if passes else 0.0
                row["boundary_drafts_per_sample"] = sum(r.get("boundary_drafts", 0) for r in recs) / n
            draft = sum(r.get("draft_triples", 0.0) for r in recs)
            if draft:
                row["fold_ratio"] = sum(r.get("folded_triples", 0.0) for r in recs) / draft
                row["ffn_fold_ratio"] = sum(r.get("ffn_folded_triples", 0.0) for r in recs) / draft
                layers = sum(r.get("layers", 0.0) for r in recs)
                if layers:
                    row["dense_layer_share"] = sum(r.get("dense_layers", 0.0) for r in recs) / layers
                row["guard_fallbacks"] = sum(r.get("guard_fallbacks", 0.0) for r in recs)
            summary[task][label] = row
        base = summary[task].get("vanilla")
        if base:
            for row in summary[task].values():
                nfe0 = base["nfe_per_sample"]
                row["nfe_vs_vanilla"] = row["nfe_per_sample"] / nfe0 if nfe0 else None
                row["tps_vs_vanilla"] = (
                    row["tokens_per_second"] / base["tokens_per_second"] if base["tokens_per_second"] else None
                )
    return summary


def format_table(summary: dict[str, dict[str, dict[str, Any]]]) -> str:
    """The paper's Table 1 as text: per task and method, accuracy, NFE and TPS (absolute and vs vanilla), and the
    fold ratios at the attention gate (``fold``) and at the FFN gate (``ffn``)."""
    tw = max([4] + [len(task) for task in summary])  # columns as wide as the longest task and method names
    mw = max([6] + [len(label) for rows in summary.values() for label in rows])
    head = (
        f"{'task':<{tw}} {'method':<{mw}} {'acc':>6} {'NFE':>7} {'NFE×':>6} {'tok/s':>8} {'TPS×':>6} "
        f"{'tok/fwd':>7} {'acc/step':>8} {'fold':>5} {'ffn':>5}"
    )
    lines = [head, "-" * len(head)]

    def fmt(row: dict[str, Any], key: str, width: int) -> str:
        v = row.get(key)
        return f"{v:>{width}.2f}" if isinstance(v, (int, float)) else "-".rjust(width)

    for task, rows in summary.items():
        for label, r in rows.items():
            lines.append(
                f"{task:<{tw}} {label:<{mw}} {100 * r['accuracy']:>5.1f}% {r['nfe_per_sample']:>7.1f} "
                f"{fmt(r, 'nfe_vs_vanilla', 6)} {r['tokens_per_second']:>8.1f} {fmt(r, 'tps_vs_vanilla', 6)} "
                f"{r['tokens_per_forward']:>7.2f} {fmt(r, 'accepted_per_step', 8)} {fmt(r, 'fold_ratio', 5)} "
                f"{fmt(r, 'ffn_fold_ratio', 5)}"
            )
    return "\n".join(lines)
