"""``specfold demo``: the embedded model on held-out problems, vanilla vs spiffy vs specfold."""

from __future__ import annotations

import argparse
import textwrap

from specfold.cli.common import (
    DTYPE_CHOICES,
    add_method_args,
    method_config,
    positive_int,
    progress_bar,
    resolve_dtype,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "demo",
        help="the main job: the embedded model on held-out problems, vanilla vs spiffy vs specfold",
        description="Answer a few held-out problems of each synthetic domain (math, code, instruction following) with "
        "the embedded model, decoding vanilla, spiffy and specfold side by side; print accuracy, NFE and tokens/s "
        "(median over repeats, with its spread), a key to the columns and what the numbers show.",
    )
    p.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                   help="auto (default): bf16 where the CPU has native bf16 matrix units (AMX, AVX-512 BF16) or on a "
                   "GPU, fp32 elsewhere")
    p.add_argument("--limit", type=positive_int, default=5, help="problems per domain (default 5)")
    p.add_argument("--max-new-tokens", type=positive_int, default=64)
    p.add_argument(
        "--repeats",
        type=positive_int,
        default=5,
        help="timing repeats at most (default 5; at least 3, or this many if fewer): the demo stops once one more "
        "repeat moves no median tokens/s by over 5%%",
    )
    add_method_args(p, None, ("delta",), help={"delta": "specfold threshold, in [0, 1] (default 0.1)"})
    p.set_defaults(func=run)


COLUMNS = """Columns:
  acc       share of problems answered correctly (math: the exact answer; code: hidden tests pass; if: every
            constraint met)
  NFE       forward passes per problem (denoising passes + cache writes); NFE× = relative to vanilla
  tok/s     generated tokens per second, the median over the timing repeats; TPS× = relative to vanilla
  tok/fwd   generated tokens per forward pass
  acc/step  draft tokens accepted per verification pass (spiffy, specfold)
  fold      share of draft (branch, position, layer) triples folded at the layer-input gate (Q/K/V inherited)
  ffn       the same share at the FFN gate (FFN output reused)"""


def _x(a: float, b: float) -> str:
    return f"{a / b:.2f}×" if b else "-"


def conclusions(result) -> list[str]:
    """Sentences computed from the run's findings (specfold.eval.demo.MethodFindings): what it shows."""
    found = result.methods
    base = found.get("vanilla")
    lines = []
    acc = ", ".join(f"{m.label} {100 * m.correct / m.n:.1f}%" for m in found.values())
    lines.append(f"Accuracy over {next(iter(found.values())).n} problems: {acc}.")
    if base is None:
        return lines
    for m in found.values():
        if m is base:
            continue
        same = f"{m.label} gave vanilla's tokens on {m.same_as_vanilla}/{m.n} problems"
        if m.same_as_vanilla == m.n:
            same += " (lossless)" if m.method == "spiffy" else " (at this delta no token changed)"
        elif m.method == "spiffy":
            same += " -- spiffy must be lossless: this is a bug, please report it"
        else:
            same += " (delta > 0 approximates: a larger delta folds more and drifts more)"
        tps = m.tokens_per_second.median / base.tokens_per_second.median if base.tokens_per_second.median else 0.0
        speed = (f"it needed {_x(m.nfe / m.n, base.nfe / base.n)} vanilla's forward passes "
                 f"({m.accepted_per_pass:.2f} drafts accepted per pass), each pass took "
                 f"{_x(m.seconds_per_pass, base.seconds_per_pass)} as long as a vanilla pass (it verifies every draft "
                 f"branch together), so it ran at {tps:.2f}× vanilla's tokens/s")
        lines.append(f"{same}; {speed}.")
    spiffy = next((m for m in found.values() if m.method == "spiffy"), None)
    for m in found.values():
        if m.method == "specfold" and spiffy is not None and m.fold_ratio is not None:
            cheaper = m.seconds_per_pass < spiffy.seconds_per_pass
            lines.append(f"{m.label} folded {100 * m.fold_ratio:.0f}% of the draft triples; its passes took "
                         f"{_x(m.seconds_per_pass, spiffy.seconds_per_pass)} as long as spiffy's, for "
                         f"{_x(m.tokens_per_second.median, spiffy.tokens_per_second.median)} spiffy's tokens/s"
                         + ("." if cheaper else ": on this model the bookkeeping of folding cost more than the rows "
                            "it skipped."))
    slower = [m for m in found.values() if m is not base and m.tokens_per_second.median < base.tokens_per_second.median]
    if slower and all(m.seconds_per_pass > base.seconds_per_pass for m in slower):
        lines.append("Why slower: here a pass costs in proportion to the rows it computes (a CPU is compute-bound), "
                     "so verifying many branches at once costs more than the passes it saves; on a GPU a wider pass "
                     "costs little more than a narrow one, and fewer passes mean more speed.")
    worst = max(result.timing.values(), key=lambda s: s.relative)
    noise = max(s.relative for s in result.timing.values())
    lines.append(f"Noise: over {result.repeats} repeats a row's tokens/s spanned up to {100 * noise:.0f}% of its "
                 f"median (min {worst.low:.1f}, max {worst.high:.1f})"
                 + ("" if result.settled else "; the medians had not settled, so rerun on a quieter machine")
                 + (". Speed ratios closer to 1 than that are noise." if noise > 0.05 else "."))
    return lines


def run(args: argparse.Namespace) -> int:
    """The main job: the embedded model answers held-out problems of each synthetic domain with vanilla, spiffy and
    specfold decoding side by side; prints one example per domain, the table with its key, the timing spread over
    repeats and what the run shows."""
    import torch

    from specfold.api import load_model
    from specfold.config import MethodConfig
    from specfold.eval.demo import run_demo
    from specfold.eval.harness import EvalPlan, format_table
    from specfold.eval.tasks.synthetic import TASKS

    methods = [MethodConfig("vanilla", compile=args.compile), MethodConfig("spiffy", compile=args.compile),
               method_config(args, "specfold")]
    if args.global_threads is None:  # the model is small: more threads only contend on a shared CPU
        torch.set_num_threads(1)
    threads = torch.get_num_threads()
    model = load_model(None, dtype=resolve_dtype(args))
    print(f"specfold demo: the embedded model ({model.path}), {args.limit} held-out problems per domain, {args.dtype}, "
          f"{threads} CPU thread{'s' if threads > 1 else ''}" + (" (--threads N for more)" if threads == 1 else ""))
    plan = EvalPlan(
        tasks=TASKS,
        methods=methods,
        limit=args.limit,
        max_new_tokens=args.max_new_tokens,
    )
    bar, bar_repeat = None, 0

    def progress(repeat: int, p) -> None:
        nonlocal bar, bar_repeat
        if repeat != bar_repeat:
            if bar is not None:
                bar.close()
            bar, bar_repeat = progress_bar(p.total, f"demo run {repeat}"), repeat
        bar.update(p.done - bar.n)

    result = run_demo(model, plan, min(3, args.repeats), args.repeats, progress=progress)
    if bar is not None:
        bar.close()
    shown: set[str] = set()
    for rec in result.records:
        if rec["method"] == "vanilla" and rec["task"] not in shown:
            shown.add(rec["task"])
            print(f"\n[{rec['task']}] {'correct' if rec['correct'] else 'WRONG'}, NFE {rec['nfe']}\n{rec['text']}")
    print()
    print(format_table(result.summary))
    print()
    print(COLUMNS)
    print(f"\nTiming: tokens/s over {result.repeats} repeats (every problem decoded again each time; the tokens do not "
          "change, the clock does)")
    width = max(len(f"{t} {m}") for t, m in result.timing)
    print(f"  {'row':<{width}} {'median':>8} {'min':>8} {'max':>8} {'spread':>7}")
    for (task, label), s in result.timing.items():
        row = f"{task} {label}"
        print(f"  {row:<{width}} {s.median:>8.1f} {s.low:>8.1f} {s.high:>8.1f} {100 * s.relative:>6.0f}%")
    print("\nWhat this run shows:")
    for line in conclusions(result):
        print(textwrap.fill(line, 116, initial_indent="  - ", subsequent_indent="    "))
    return 0
