"""``specfold calibrate``: a draft graph from vanilla trajectories."""

from __future__ import annotations

import argparse
import json
import sys

from specfold.cli.common import (
    UsageError,
    add_cache_arg,
    add_decode_args,
    add_model_args,
    add_quota_args,
    check_outputs,
    load_from_args,
    non_negative_float,
    positive_int,
    progress_bar,
)
from specfold.decoding.calibration import DEFAULT_OBJECTIVE, OBJECTIVES


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "calibrate",
        help="calibrate a draft graph from vanilla trajectories",
        description="Decode calibration prompts vanilla, record each real transition as a draft formula, and "
        "select B parent-closed nodes maximising the drafts accepted per verification pass (replayed offline on "
        "the recorded trajectories). Prints the expected acceptance in-sample and held out (cross-validation over "
        "prompts); writes the graph, its counts (OUT stem + .counts.json) and its paths (OUT stem + .paths.json), "
        "from which any B / depth cap / objective is re-selected.",
    )
    p.add_argument("--out", required=True, help="graph JSON to write")
    p.add_argument("--samples", type=positive_int, default=50, help="calibration prompts (default 50)")
    p.add_argument(
        "--data-dir",
        default=None,
        help="real models: read 25 MBPP-train + 25 MATH-train from DIR/mbpp and DIR/math; "
        "default: the synthetic suite's calibration split (embedded model)",
    )
    p.add_argument("--count-depth", type=positive_int, default=8, help="longest formulas counted (default 8)")
    p.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    p.add_argument("--budget", type=positive_int, default=7, help="draft budget B (default 7)")
    p.add_argument("--depth", type=positive_int, default=None, help="cap on the graph depth")
    p.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default=DEFAULT_OBJECTIVE,
        help="selection objective: acceptance (drafts accepted per pass, default), counts (a pass at every step), "
        "spiffy (degree-1 accumulation, for comparison)",
    )
    p.add_argument("--folds", type=positive_int, default=5, help="cross-validation folds for the held-out estimate")
    p.add_argument(
        "--draft-cost",
        type=non_negative_float,
        default=0.0,
        help="time one draft branch adds to a verification pass, relative to a one-branch pass (0: branches are "
        "free, as on a GPU at these shapes; the shipped embedded graph uses 0.2 for a CPU, where "
        "scripts/pass_scaling.py measures the cost per branch). Above 0 the graph gets a "
        "drafting policy: per number of eligible masks, only the nodes whose expected passes saved exceed their "
        "cost are drafted (lossless either way)",
    )
    p.add_argument(
        "--split",
        choices=["calib", "train"],
        default="calib",
        help="synthetic suite only: the calibration split (72 prompts) or, for more prompts, the train split's "
        "stream from --seed (never the test split; default calib)",
    )
    p.add_argument("--seed", type=int, default=1000, help="train-split stream for --split train (default 1000)")
    add_model_args(p)
    add_decode_args(p)
    add_quota_args(p)
    add_cache_arg(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from specfold.api import decode_config_for, encode_prompt, record_traces
    from specfold.decoding.calibration import BudgetError, calibrate, counts_to_json
    from specfold.io import atomic_outputs

    out = Path(args.out)
    check_outputs(("--out", out))
    counts_path = out.with_name(out.stem + ".counts.json")
    paths_path = out.with_name(out.stem + ".paths.json")
    check_outputs(("--out (counts)", counts_path), ("--out (paths)", paths_path))
    if args.data_dir and args.split != "calib":
        raise UsageError(
            "--split applies to the synthetic suite; with --data-dir the calibration prompts are MBPP-train and "
            "MATH-train"
        )
    model = load_from_args(args)
    if args.data_dir:
        from specfold.eval.benchmarks import calibration_prompts

        half = args.samples // 2
        samples = calibration_prompts(Path(args.data_dir), n_mbpp=args.samples - half, n_math=half)
        source = f"{args.samples - half} MBPP-train + {half} MATH-train from {args.data_dir}"
    elif args.split == "train":
        import itertools

        from specfold.eval.tasks.synthetic import TASKS, iter_train

        samples = list(itertools.islice(iter_train(None, args.seed), args.samples))
        source = f"synthetic suite, train split, stream seed {args.seed} (" + ", ".join(TASKS) + " in turn)"
    else:
        from specfold.eval.tasks.synthetic import TASKS, load_split

        per_task = [load_split(t, "calib") for t in TASKS]
        samples = [s for group in zip(*per_task, strict=False) for s in group][: args.samples]
        source = "synthetic suite, calib split (" + ", ".join(TASKS) + ")"
    if len(samples) < args.samples:
        raise UsageError(f"only {len(samples)} calibration prompts available, asked for {args.samples}")
    cfg = decode_config_for(model, args.max_new_tokens, args.threshold, args.block_size, args.small_block_size,
                            steps=args.steps, strategy=args.strategy, cache=args.cache)
    prompts = [encode_prompt(model, s.prompt, chat=not args.no_chat) for s in samples]
    bar = progress_bar(len(prompts), "calibrate")
    traces = record_traces(model, prompts, cfg, progress=lambda i: bar.update(1))
    bar.close()
    provenance = {
        "samples": len(prompts),
        "source": source,
        "threshold": cfg.threshold,
        "block_size": cfg.block_size,
        "small_block_size": cfg.small_block_size,
        "max_new_tokens": cfg.max_new_tokens,
    }
    if cfg.cache is not None:
        provenance["cache"] = cfg.cache
    try:
        graph, paths = calibrate(
            traces, args.budget, args.depth, args.objective, args.count_depth, folds=args.folds, model=model.name,
            provenance=provenance, draft_cost=args.draft_cost,
        )
    except BudgetError as err:
        raise UsageError(f"{err} (--samples {args.samples}, --budget {args.budget})") from None
    counts = paths.counts()
    # the three files together or none of them (a full disk must not leave a graph without its counts and paths)
    with atomic_outputs(counts_path, paths_path, out) as (counts_tmp, paths_tmp, graph_tmp):
        counts_tmp.write_text(json.dumps(counts_to_json(counts), indent=1) + "\n")
        paths.to_json(paths_tmp)
        graph.to_json(graph_tmp)
    acc = graph.provenance["acceptance"]
    held = acc["held_out"]
    print(
        f"expected accepted drafts per pass: {acc['in_sample']['accepted_per_pass']:.3f} in-sample, "
        + (f"{held['accepted_per_pass']:.3f} held out ({acc['folds']}-fold)" if held else "no held-out estimate")
        + f"; passes saved {acc['in_sample']['passes_saved']:.1%} in-sample"
        + (f", {held['passes_saved']:.1%} held out" if held else "")
        + f"; drafts per pass {acc['in_sample']['drafted_per_pass']:.2f}"
        + (f" (drafting policy for draft cost {args.draft_cost:g})" if graph.policy else ""),
        file=sys.stderr,
    )
    print(
        json.dumps(
            {
                "graph": str(out),
                "counts": str(counts_path),
                "paths": str(paths_path),
                "objective": args.objective,
                "budget": graph.budget,
                "depth_cap": graph.depth_cap,
                "nodes": graph.strings()[1:],
                "observations": sum(counts.values()),
                "accepted_per_pass": acc["in_sample"]["accepted_per_pass"],
                "held_out_accepted_per_pass": held["accepted_per_pass"] if held else None,
                "held_out_passes_saved": held["passes_saved"] if held else None,
                "drafted_per_pass": acc["in_sample"]["drafted_per_pass"],
                "draft_cost": args.draft_cost,
            }
        )
    )
    return 0
