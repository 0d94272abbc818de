"""``specfold eval``: accuracy, NFE and tokens/s of methods side by side on tasks."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

from specfold.cli.common import (
    add_batch_arg,
    add_cache_arg,
    add_decode_args,
    add_method_args,
    add_model_args,
    add_overwrite_arg,
    add_quota_args,
    check_outputs,
    choose_compile,
    evalplus_samples,
    load_from_args,
    method_config,
    positive_int,
    progress_bar,
)


def launcher_shard(num_shards: int, shard_id: int, out: str | None) -> tuple[int, int, str | None]:
    """Under a launcher (torchrun: ``WORLD_SIZE`` > 1, ``RANK``) with the default single shard, this process is
    shard ``RANK`` of ``WORLD_SIZE`` and writes ``OUT`` as ``STEM.rankR-of-W.SUFFIX`` (merge them with
    ``specfold merge``); explicit ``--num-shards``/``--shard-id`` win."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 or num_shards != 1:
        return num_shards, shard_id, out
    rank = int(os.environ.get("RANK", "0"))
    if out is not None:
        path = Path(out)
        out = str(path.with_name(f"{path.stem}.rank{rank}-of-{world}{path.suffix}"))
    return world, rank, out

def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "eval",
        help="accuracy, NFE and tokens/s of methods side by side on tasks",
        description="Decode task samples with each method (side by side, same sample), score them, "
        "append one JSON record per (sample, method) to --out (a rerun resumes), and print the "
        "Table-1 summary; with --json the last stdout line is the summary as JSON.",
    )
    p.add_argument(
        "--tasks",
        required=True,
        type=lambda t: [x for x in t.split(",") if x],
        help="comma-separated: synth-math, synth-code, synth-if, gsm8k, math500, math, humaneval, mbpp, ifeval",
    )
    p.add_argument("--split", default="test", help="split of the tasks (default test)")
    p.add_argument("--limit", type=positive_int, default=None, help="first N samples of each task")
    p.add_argument("--data-dir", default=None, help="directory with the benchmarks' original files (DIR/gsm8k/...)")
    p.add_argument("--out", default=None, help="JSONL file of per-sample records (appended; reruns resume)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line (last line of stdout)")
    p.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    p.add_argument("--num-shards", type=positive_int, default=1, help="split the samples across processes")
    p.add_argument("--shard-id", type=int, default=0, help="this process's shard (0-based)")
    add_batch_arg(p)
    p.add_argument(
        "--evalplus-out",
        default=None,
        help="also write EvalPlus samples of the code tasks (one file per method when several ran)",
    )
    add_overwrite_arg(p)
    add_model_args(p)
    add_decode_args(p)
    add_quota_args(p)
    add_cache_arg(p)
    add_method_args(p, "methods")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specfold.eval.harness import EvalPlan, check_plan, format_table, load_task, run_eval, summarize
    from specfold.eval.records import check_records_output

    specs = [
        method_config(args, name, delta=d)
        for name in args.methods
        for d in (args.delta or [None] if name == "specfold" else [None])
    ]
    num_shards, shard_id, out = launcher_shard(args.num_shards, args.shard_id, args.out)
    check_outputs(("--out", out), ("--evalplus-out", args.evalplus_out))
    plan = EvalPlan(
        tasks=args.tasks,
        methods=specs,
        split=args.split,
        limit=args.limit,
        data_dir=Path(args.data_dir) if args.data_dir else None,
        max_new_tokens=args.max_new_tokens,
        threshold=args.threshold,
        block_size=args.block_size,
        small_block_size=args.small_block_size,
        steps=args.steps,
        strategy=args.strategy,
        cache=args.cache,
        num_shards=num_shards,
        shard_id=shard_id,
        chat=not args.no_chat,
        batch_size=args.batch_size,
    )
    check_plan(plan)  # before loading: a task or method twice, a shard outside the shards
    for task in plan.tasks:  # a missing benchmark (no --data-dir, no hub) fails now, not after loading the model
        load_task(task, plan.split, 1, plan.data_dir)
    if args.compile is None:  # compile when the run is long enough to repay it
        samples = sum(len(load_task(task, plan.split, plan.limit, plan.data_dir).samples) for task in plan.tasks)
        choose_compile(args, samples * len(specs) * plan.max_new_tokens // num_shards)
        plan.methods = specs = [replace(spec, compile=args.compile) for spec in specs]
    if out is not None:
        check_records_output(out)  # anything but eval records is refused here, the file unchanged
    model = load_from_args(args)
    bar = None

    def progress(p) -> None:
        nonlocal bar
        if bar is None:
            bar = progress_bar(p.total, "eval")
        bar.set_postfix_str(" ".join(f"{k} {v:.0f} tok/s" for k, v in p.tokens_per_second.items()), refresh=False)
        bar.update(p.done - bar.n)

    records = run_eval(model, plan, Path(out) if out else None, progress, overwrite=args.overwrite)
    if bar is not None:
        bar.close()
    summary = summarize(records)
    print(format_table(summary), file=sys.stderr if args.json else sys.stdout)
    if args.evalplus_out:
        from specfold.eval.evalplus import write_evalplus

        samples = evalplus_samples(args.tasks, args.split, plan.data_dir)
        written = write_evalplus(records, Path(args.evalplus_out), samples)
        print("evalplus samples: " + ", ".join(f"{k} -> {v}" for k, v in written.items()), file=sys.stderr)
    if args.json:
        print(json.dumps(summary))
    return 0
