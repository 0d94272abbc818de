"""``specfold sweep``: sweep delta, draft budget B or depth cap D (paper Fig. 4/5/8)."""

from __future__ import annotations

import argparse
import json
import sys

from specfold.cli.common import (
    UsageError,
    add_batch_arg,
    add_cache_arg,
    add_decode_args,
    add_method_args,
    add_model_args,
    add_overwrite_arg,
    add_quota_args,
    check_outputs,
    choose_compile,
    load_from_args,
    method_config,
    number_list,
    positive_int,
    progress_bar,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "sweep",
        help="sweep delta, draft budget B or depth cap D (paper Fig. 4/5/8)",
        description="Run vanilla, spiffy and specfold over a grid (delta: SpecFold at every delta, B = 7; budget: "
        "spiffy and specfold at every B, each with its own graph from the calibration counts beside the model; "
        "depth: every depth cap of the B = 7 graph). Records go to --out (one file per sweep; a rerun resumes); "
        "with --json the last stdout line is the summary per task and grid point.",
    )
    p.add_argument("kind", choices=["delta", "budget", "depth"], help="the swept parameter")
    p.add_argument(
        "--tasks",
        required=True,
        type=lambda t: [x for x in t.split(",") if x],
        help="comma-separated tasks (as for eval)",
    )
    p.add_argument(
        "--grid",
        type=number_list,
        default=None,
        help="comma-separated values (default: delta 0.01,0.02,0.05,0.1,0.2,0.3,0.4,0.5,0.6,0.7; budget 2..8; "
        "depth 1..4)",
    )
    add_method_args(
        p, None, ("budget", "delta", "backend", "ffn", "attention"),
        help={"budget": "B of the delta and depth sweeps (default 7)",
              "delta": "delta of budget/depth sweeps, in [0, 1] (0.1)"},
    )
    p.add_argument("--split", default="test", help="split of the tasks (default test)")
    p.add_argument("--limit", type=positive_int, default=None, help="first N samples of each task")
    p.add_argument("--data-dir", default=None, help="directory with the benchmarks' original files")
    p.add_argument("--out", default=None, help="JSONL records (default sweep_KIND.jsonl; a rerun resumes)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line (last line of stdout)")
    p.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    p.add_argument("--num-shards", type=positive_int, default=1, help="split the samples across processes")
    p.add_argument("--shard-id", type=int, default=0, help="this process's shard (0-based)")
    add_batch_arg(p)
    add_overwrite_arg(p)
    add_model_args(p)
    add_decode_args(p)
    add_quota_args(p)
    add_cache_arg(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from specfold.eval.harness import load_task
    from specfold.eval.sweep import check_grid, format_sweep, run_sweep, sweep_methods, sweep_summary

    if args.kind == "budget" and args.budget is not None:
        raise UsageError("a budget sweep varies B itself; use --grid to choose the values")
    if args.kind == "delta" and args.delta is not None:
        raise UsageError("a delta sweep varies delta itself; use --grid to choose the values")
    out = Path(args.out or f"sweep_{args.kind}.jsonl")
    check_outputs(("--out", out))
    from specfold.eval.records import check_records_output

    check_records_output(out)  # anything but eval records is refused here, the file unchanged
    if args.grid is not None:
        check_grid(args.kind, args.grid)
    data_dir = Path(args.data_dir) if args.data_dir else None
    samples = sum(len(load_task(task, args.split, args.limit, data_dir).samples) for task in args.tasks)
    points = len(sweep_methods(args.kind, args.grid, args.budget, args.delta))
    choose_compile(args, samples * points * args.max_new_tokens // max(args.num_shards, 1))
    model = load_from_args(args)
    bar = None

    def progress(p) -> None:
        nonlocal bar
        if bar is None:
            bar = progress_bar(p.total, f"sweep {args.kind}")
        bar.set_postfix_str(p.method, refresh=False)
        bar.update(p.done - bar.n)

    records = run_sweep(
        model,
        args.kind,
        args.tasks,
        args.grid,
        out,
        progress,
        budget=args.budget,
        delta=args.delta,
        fold=method_config(args, "specfold").fold,  # its backend, FFN reuse and attention (δ is the sweep's)
        compile=args.compile,
        overwrite=args.overwrite,
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
        num_shards=args.num_shards,
        shard_id=args.shard_id,
        batch_size=args.batch_size,
        chat=not args.no_chat,
    )
    if bar is not None:
        bar.close()
    summary = sweep_summary(records, args.kind)
    summary["records"] = str(out)
    print(format_sweep(summary), file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(summary))
    return 0
