"""``specfold demo``: the embedded model on held-out problems, vanilla vs spiffy vs specfold."""

from __future__ import annotations

import argparse

from specfold.cli.common import (
    non_negative_float,
    positive_int,
    progress_bar,
)
from specfold.model.loading import DTYPES


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "demo",
        help="the main job: the embedded model on held-out problems, vanilla vs spiffy vs specfold",
        description="Answer a few held-out problems of each synthetic domain (math, code, instruction following) with "
        "the embedded model, decoding vanilla, spiffy and specfold side by side; print accuracy, NFE and tokens/s.",
    )
    p.add_argument("--dtype", default="fp32", choices=list(DTYPES))
    p.add_argument("--limit", type=positive_int, default=5, help="problems per domain (default 5)")
    p.add_argument("--max-new-tokens", type=positive_int, default=64)
    p.add_argument("--delta", type=non_negative_float, default=0.1, help="specfold threshold (default 0.1)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The main job: the embedded model answers held-out problems of each synthetic domain with vanilla, spiffy and
    specfold decoding side by side; prints one example per domain and the accuracy / NFE / tokens-per-second table."""
    from specfold.api import load_model
    from specfold.eval.harness import EvalPlan, MethodSpec, format_table, run_eval, summarize
    from specfold.eval.tasks.synthetic import TASKS

    model = load_model(None, dtype=args.dtype)
    print(f"specfold demo: the embedded model ({model.path}), {args.limit} held-out problems per domain, {args.dtype}")
    plan = EvalPlan(
        tasks=TASKS,
        methods=[MethodSpec("vanilla"), MethodSpec("spiffy"), MethodSpec("specfold", delta=args.delta)],
        limit=args.limit,
        max_new_tokens=args.max_new_tokens,
    )
    bar = None

    def progress(p) -> None:
        nonlocal bar
        if bar is None:
            bar = progress_bar(p.total, "demo")
        bar.update(p.done - bar.n)

    records = run_eval(model, plan, None, progress)
    if bar is not None:
        bar.close()
    shown: set[str] = set()
    for rec in records:
        if rec["method"] == "vanilla" and rec["task"] not in shown:
            shown.add(rec["task"])
            print(f"\n[{rec['task']}] {'correct' if rec['correct'] else 'WRONG'}, NFE {rec['nfe']}\n{rec['text']}")
    print()
    print(format_table(summarize(records)))
    return 0
