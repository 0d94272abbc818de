"""The ``specfold`` command line — the only module that prints.

    specfold generate "What is 3 + 4?"                      # the embedded model
    specfold generate --model DIR --prompt-ids 1,2,3 --json  # any supported checkpoint, raw ids, JSON out
    specfold init-random DIR --family nld                   # a random-weight checkpoint in the real format

Bad input ends with one ``specfold: error: ...`` line and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence

from specfold.decoding.calibration import DEFAULT_OBJECTIVE, OBJECTIVES
from specfold.model.loading import DTYPES, CheckpointError


class UsageError(ValueError):
    """Bad command-line input, reported as one line."""


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def task_mix(text: str) -> dict[str, int]:
    """``synth-math=3,synth-if=2`` -> ``{"synth-math": 3, "synth-if": 2}`` (task names checked against the suite)."""
    from specfold.eval.tasks.synthetic import TASKS

    out: dict[str, int] = {}
    for part in text.split(","):
        name, sep, count = part.partition("=")
        name = name.strip()
        if not sep or name not in TASKS or not count.strip().isdigit():
            raise argparse.ArgumentTypeError(f"expected TASK=N with TASK in {', '.join(TASKS)}, got {part!r}")
        out[name] = int(count)
    if not any(out.values()):
        raise argparse.ArgumentTypeError(f"the mix {text!r} leaves out every task")
    return out


def threshold_type(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}") from None
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"threshold must be in (0, 1], got {value}")
    return value


def small_block_type(text: str) -> int | None | str:
    if text in ("auto", "none"):
        return None if text == "none" else "auto"
    return positive_int(text)


def id_list(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated token ids, got {text!r}") from None
    if not ids:
        raise argparse.ArgumentTypeError("--prompt-ids is empty")
    if min(ids) < 0:
        raise argparse.ArgumentTypeError("token ids must be non-negative")
    return ids


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument(
        "--model", default=None, help="checkpoint directory or Hugging Face id (default: the embedded model)"
    )
    g.add_argument("--dtype", default="fp32", choices=list(DTYPES), help="weights and activations (default fp32)")
    g.add_argument("--device", default="cpu", help="torch device (default cpu)")
    g.add_argument("--mask-id", type=int, default=None, help="override the mask token id")
    g.add_argument("--eos-id", type=int, default=None, help="override the stop token id")


def add_decode_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("decoding")
    g.add_argument("--max-new-tokens", type=positive_int, default=256, help="generation budget (default 256)")
    g.add_argument(
        "--threshold",
        type=threshold_type,
        default=0.9,
        help="unmask every eligible position with confidence > threshold, plus the most confident (0.9)",
    )
    g.add_argument("--block-size", type=positive_int, default=None, help="block length (default: the model's bd_size)")
    g.add_argument(
        "--small-block-size",
        type=small_block_type,
        default="auto",
        help="eligible window inside a block: N, 'none', or 'auto' (8 for Fast-dLLM-v2, none for NLD)",
    )


def add_method_args(p: argparse.ArgumentParser, multi: bool = False) -> None:
    g = p.add_argument_group("speculation (spiffy, specfold)")
    if multi:
        g.add_argument(
            "--methods",
            default="vanilla",
            type=method_list,
            help="comma-separated: vanilla, spiffy, specfold (default vanilla)",
        )
    else:
        g.add_argument(
            "--method",
            default="vanilla",
            choices=["vanilla", "spiffy", "specfold"],
            help="vanilla; spiffy = drafts + dense verification; specfold = drafts + folded verification",
        )
    g.add_argument("--graph", default=None, help="draft graph JSON (default: the one shipped beside the model)")
    g.add_argument("--budget", type=positive_int, default=None, help="draft budget B (default 7)")
    g.add_argument("--depth", type=positive_int, default=None, help="cap on the draft graph depth")
    if multi:
        g.add_argument(
            "--delta",
            type=float_list,
            default=[0.1],
            help="specfold recompute threshold(s) on the relative residual, comma-separated (0.1)",
        )
    else:
        g.add_argument(
            "--delta",
            type=non_negative_float,
            default=0.1,
            help="specfold recompute threshold on the relative residual (default 0.1)",
        )
    g.add_argument("--backend", choices=["torch", "triton"], default="torch", help="specfold engine backend")
    g.add_argument(
        "--ffn-reuse",
        choices=["residual", "paper"],
        default="residual",
        help="specfold FFN reuse: 'residual' gates the FFN on its own input (exact at delta 0, default); "
        "'paper' reuses it on the layer's folded set as the paper does (not exact at delta 0)",
    )
    g.add_argument(
        "--attention",
        choices=["correct", "direct"],
        default="correct",
        help="specfold folded-row attention: 'correct' = Eq. 8 from the source's softmax state (default); "
        "'direct' = every row over its branch's own K/V in one batched call (same result; cheaper for small models)",
    )


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value}")
    return value


def float_list(text: str) -> list[float]:
    return [non_negative_float(t) for t in text.split(",") if t.strip()]


def method_list(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in ("vanilla", "spiffy", "specfold")]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown method(s) {bad or text!r}; choose from vanilla, spiffy, specfold")
    return names


def method_kwargs(args: argparse.Namespace, method: str | None = None) -> dict:
    """Options for a speculative method (none for vanilla)."""
    if (method or args.method) == "vanilla":
        for flag in ("graph", "budget", "depth"):
            if getattr(args, flag) is not None and method is None:
                raise UsageError(f"--{flag} applies to --method spiffy or specfold")
        return {}
    return {
        "graph": args.graph,
        "budget": args.budget,
        "depth": args.depth,
        "delta": args.delta,
        "backend": args.backend,
        "ffn": args.ffn_reuse,
        "attention": args.attention,
    }


def _load(args: argparse.Namespace):
    from specfold.api import load_model

    return load_model(args.model, dtype=args.dtype, device=args.device, mask_id=args.mask_id, eos_id=args.eos_id)


def cmd_generate(args: argparse.Namespace) -> int:
    from specfold.api import generate

    if (args.prompt is None) == (args.prompt_ids is None):
        raise UsageError("give exactly one of PROMPT or --prompt-ids")
    model = _load(args)
    prompt = args.prompt if args.prompt is not None else args.prompt_ids
    result = generate(
        model,
        prompt,
        max_new_tokens=args.max_new_tokens,
        threshold=args.threshold,
        block_size=args.block_size,
        small_block_size=args.small_block_size,
        method=args.method,
        chat=not args.no_chat,
        **method_kwargs(args),
    )
    if args.json:
        out = result.to_dict()
        out.update(method=args.method, model=str(model.path))
        if args.method != "vanilla":
            out["accepted_per_step"] = result.accepted_drafts / max(1, result.nfe_denoise)
        if args.method == "specfold":
            from specfold.engine.base import fold_ratio

            out["fold_ratio"] = fold_ratio(result.engine_stats)
        print(json.dumps(out))
    else:
        print(result.text if result.text is not None else " ".join(map(str, result.token_ids)))
        print(
            f"[{result.generated_tokens} tokens, NFE {result.nfe} ({result.nfe_denoise} denoise + {result.nfe_cache} "
            f"cache), {result.tokens_per_forward:.2f} tokens/forward, {result.tokens_per_second:.1f} tokens/s]",
            file=sys.stderr,
        )
    return 0


def _progress_bar(total: int, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, dynamic_ncols=True, file=sys.stderr, disable=None)


def cmd_eval(args: argparse.Namespace) -> int:
    from pathlib import Path

    from specfold.eval.harness import EvalPlan, MethodSpec, format_table, run_eval, summarize

    specs = []
    for name in args.methods:
        if name == "specfold":
            specs += [
                MethodSpec(name, args.budget, args.depth, d, args.graph, args.backend, args.ffn_reuse, args.attention)
                for d in args.delta
            ]
        elif name == "spiffy":
            specs.append(MethodSpec(name, args.budget, args.depth, None, args.graph))
        else:
            specs.append(MethodSpec(name))
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
        num_shards=args.num_shards,
        shard_id=args.shard_id,
        chat=not args.no_chat,
    )
    model = _load(args)
    bar = None

    def progress(p) -> None:
        nonlocal bar
        if bar is None:
            bar = _progress_bar(p.total, "eval")
        bar.set_postfix_str(" ".join(f"{k} {v:.0f} tok/s" for k, v in p.tokens_per_second.items()), refresh=False)
        bar.update(p.done - bar.n)

    records = run_eval(model, plan, Path(args.out) if args.out else None, progress)
    if bar is not None:
        bar.close()
    summary = summarize(records)
    print(format_table(summary), file=sys.stderr if args.json else sys.stdout)
    if args.evalplus_out:
        from specfold.eval.evalplus import write_evalplus

        samples = _evalplus_samples(args.tasks, args.split, plan.data_dir)
        written = write_evalplus(records, Path(args.evalplus_out), samples)
        print("evalplus samples: " + ", ".join(f"{k} -> {v}" for k, v in written.items()), file=sys.stderr)
    if args.json:
        print(json.dumps(summary))
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from specfold.api import decode_config_for, encode_prompt, record_traces
    from specfold.decoding.calibration import BudgetError, calibrate, counts_to_json

    model = _load(args)
    if args.data_dir:
        from specfold.eval.benchmarks import calibration_prompts

        half = args.samples // 2
        samples = calibration_prompts(Path(args.data_dir), n_mbpp=args.samples - half, n_math=half)
        source = f"{args.samples - half} MBPP-train + {half} MATH-train from {args.data_dir}"
    else:
        from specfold.eval.tasks.synthetic import TASKS, load_split

        per_task = [load_split(t, "calib") for t in TASKS]
        samples = [s for group in zip(*per_task, strict=False) for s in group][: args.samples]
        source = "synthetic suite, calib split (" + ", ".join(TASKS) + ")"
    if len(samples) < args.samples:
        raise UsageError(f"only {len(samples)} calibration prompts available, asked for {args.samples}")
    cfg = decode_config_for(model, args.max_new_tokens, args.threshold, args.block_size, args.small_block_size)
    prompts = [encode_prompt(model, s.prompt, chat=not args.no_chat) for s in samples]
    bar = _progress_bar(len(prompts), "calibrate")
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
    try:
        graph, paths = calibrate(
            traces, args.budget, args.depth, args.objective, args.count_depth, folds=args.folds, model=model.name,
            provenance=provenance,
        )
    except BudgetError as err:
        raise UsageError(f"{err} (--samples {args.samples}, --budget {args.budget})") from None
    counts = paths.counts()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    graph.to_json(out)
    counts_path = out.with_name(out.stem + ".counts.json")
    counts_path.write_text(json.dumps(counts_to_json(counts), indent=1) + "\n")
    paths_path = out.with_name(out.stem + ".paths.json")
    paths.to_json(paths_path)
    acc = graph.provenance["acceptance"]
    held = acc["held_out"]
    print(
        f"expected accepted drafts per pass: {acc['in_sample']['accepted_per_pass']:.3f} in-sample, "
        + (f"{held['accepted_per_pass']:.3f} held out ({acc['folds']}-fold)" if held else "no held-out estimate")
        + f"; passes saved {acc['in_sample']['passes_saved']:.1%} in-sample",
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
            }
        )
    )
    return 0


def cmd_bench_layer(args: argparse.Namespace) -> int:
    from specfold.bench.layer import bench_layer
    from specfold.model.loading import parse_dtype

    rows = []
    for shape in args.shape:
        for f in args.fold_ratio:
            res = bench_layer(
                shape,
                f,
                branches=args.branches,
                block=args.block,
                prefix=args.prefix,
                dtype=parse_dtype(args.dtype),
                repeats=args.repeats,
                backend=args.backend,
                threads=args.threads,
                device=args.device,
            )
            rows.append(res.as_dict())
            if not args.json:
                print(
                    f"{shape:<18} f={f:<4} dense {res.dense_seconds * 1e3:8.2f} ms  folded "
                    f"{res.folded_seconds * 1e3:8.2f} ms  ratio {res.ratio:.3f}  FLOP limit "
                    f"{res.flop_limit_ratio:.3f}  ratio/limit {res.ratio / res.flop_limit_ratio:.3f}"
                )
    if args.json:
        for row in rows[:-1]:
            print(json.dumps(row))
        print(json.dumps(rows[-1]))
    return 0


def cmd_init_random(args: argparse.Namespace) -> int:
    from specfold.model.random_checkpoint import write_random_checkpoint

    out = write_random_checkpoint(
        args.out,
        args.family,
        seed=args.seed,
        vocab_size=args.vocab_size,
        hidden_size=args.hidden_size,
        num_heads=args.heads,
        num_kv_heads=args.kv_heads,
        num_layers=args.layers,
        intermediate_size=args.intermediate_size,
        mask_token_id=args.vocab_size - 1,
        eos_token_id=args.vocab_size - 2,
    )
    print(
        f"wrote a RANDOM-WEIGHT {args.family} checkpoint to {out} (mask id {args.vocab_size - 1}, "
        f"stop id {args.vocab_size - 2}); its output is noise"
    )
    return 0


def _grid(text: str) -> list[float]:
    try:
        return [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def cmd_sweep(args: argparse.Namespace) -> int:
    from pathlib import Path

    from specfold.eval.sweep import format_sweep, run_sweep, sweep_summary

    if args.kind == "budget" and args.budget is not None:
        raise UsageError("a budget sweep varies B itself; use --grid to choose the values")
    if args.kind == "delta" and args.delta is not None:
        raise UsageError("a delta sweep varies delta itself; use --grid to choose the values")
    model = _load(args)
    out = Path(args.out or f"sweep_{args.kind}.jsonl")
    bar = None

    def progress(p) -> None:
        nonlocal bar
        if bar is None:
            bar = _progress_bar(p.total, f"sweep {args.kind}")
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
        backend=args.backend,
        ffn=args.ffn_reuse,
        attention=args.attention,
        split=args.split,
        limit=args.limit,
        data_dir=Path(args.data_dir) if args.data_dir else None,
        max_new_tokens=args.max_new_tokens,
        threshold=args.threshold,
        block_size=args.block_size,
        small_block_size=args.small_block_size,
        num_shards=args.num_shards,
        shard_id=args.shard_id,
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


def cmd_plot(args: argparse.Namespace) -> int:
    from pathlib import Path

    from specfold.eval.harness import read_records
    from specfold.eval.plots import plot_sweep

    records = []
    for path in args.records:
        if not Path(path).is_file():
            raise FileNotFoundError(f"no records file {path}")
        records += read_records(Path(path))
    out = plot_sweep(records, args.kind, Path(args.out), args.title)
    print(json.dumps({"figure": str(out), "kind": args.kind, "records": len(records)}))
    return 0


def cmd_analyze_residuals(args: argparse.Namespace) -> int:
    from pathlib import Path

    from specfold.api import decode_config_for, encode_prompt
    from specfold.eval.residuals import plot_residual_map, residual_map

    if args.prompt is not None and args.prompt_ids is not None:
        raise UsageError("give at most one of --prompt or --prompt-ids")
    model = _load(args)
    if args.prompt_ids is not None:
        ids = args.prompt_ids
    else:
        ids = encode_prompt(model, args.prompt or DEFAULT_RESIDUAL_PROMPT, chat=not args.no_chat)
    cfg = decode_config_for(
        model, args.block_size or model.config.block_size, args.threshold, args.block_size, args.small_block_size
    )
    rmap = residual_map(model, ids, cfg, step=args.step, min_masks=args.min_masks)
    out = plot_residual_map(rmap, Path(args.out))
    if args.json:
        print(json.dumps({"figure": str(out), **rmap.to_dict()}))
    else:
        print(
            f"wrote {out}: rho over {len(rmap.rho)} layers x {len(rmap.labels)} positions, new token "
            f"{rmap.new_token} at position {rmap.new_position} (parent after {rmap.step} rule steps)"
        )
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    from pathlib import Path

    from specfold.eval.merge import merge_records, write_records

    report = merge_records([Path(p) for p in args.records])
    out = write_records(report.records, Path(args.out))
    info = report.to_dict(out)
    if args.json:
        print(json.dumps(info))
    else:
        n_in = sum(report.inputs.values())
        print(
            f"merged {n_in} records from {len(report.inputs)} files into {len(report.records)} "
            f"({report.duplicates} duplicates, {len(report.conflicts)} conflicts) -> {out}"
        )
        for c in report.conflicts:
            print(
                f"conflict: {c['task']} {c['label']} {c['sample_id']} differs in {', '.join(c['fields'])} "
                f"between {c['files'][0]} and {c['files'][1]}",
                file=sys.stderr,
            )
    return 1 if report.conflicts else 0


def _evalplus_samples(tasks, split: str, data_dir) -> dict:
    """Sample id -> sample of the HumanEval records (their prompt makes a self-contained solution)."""
    from specfold.eval.harness import load_task

    if "humaneval" not in tasks:
        return {}
    return {s.sample_id: s for s in load_task("humaneval", split, None, data_dir).samples}


def cmd_export_evalplus(args: argparse.Namespace) -> int:
    from pathlib import Path

    from specfold.eval.evalplus import write_evalplus
    from specfold.eval.harness import read_records

    if not Path(args.records).is_file():
        raise FileNotFoundError(f"no records file {args.records}")
    records = read_records(Path(args.records))
    samples = None
    if args.data_dir:
        samples = _evalplus_samples({r["task"] for r in records}, args.split, Path(args.data_dir))
    written = write_evalplus(records, Path(args.out), samples, args.label)
    print(json.dumps({"files": {k: str(v) for k, v in written.items()}}))
    return 0


DEFAULT_RESIDUAL_PROMPT = "What is 3 + 4?"


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage dump): ``specfold: error: ...``, exit status 2."""

    def error(self, message: str):  # type: ignore[override]
        print(f"{self.prog}: error: {message} (see --help)", file=sys.stderr)
        raise SystemExit(2)


def cmd_demo(args: argparse.Namespace) -> int:
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
            bar = _progress_bar(p.total, "demo")
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


def cmd_train(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tqdm import tqdm

    from specfold.model.loading import resolve_checkpoint
    from specfold.train.tokenizer import train_tokenizer
    from specfold.train.trainer import TrainConfig, train

    init = str(resolve_checkpoint(args.init)) if args.init else None  # a bad --init fails before any writing
    tok_dir = Path(args.tokenizer) if args.tokenizer else Path(args.out) / "tokenizer"
    if not (tok_dir / "tokenizer.json").is_file():
        train_tokenizer(tok_dir, vocab_size=args.vocab_size, seed=args.seed)
    cfg = TrainConfig(
        out_dir=args.out,
        tokenizer_dir=str(tok_dir),
        steps=args.steps,
        max_minutes=args.max_minutes,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        hidden_size=args.hidden_size,
        num_layers=args.layers,
        num_heads=args.heads,
        num_kv_heads=args.kv_heads,
        intermediate_size=args.intermediate_size,
        init_from=init,
        mix=args.mix,
        causal_copy=args.causal_copy,
    )
    bar = tqdm(total=args.steps, desc="train", unit="step", dynamic_ncols=True)

    def progress(step: int, loss: float) -> None:
        if bar.n == 0 and step > 1:  # a resumed run: start the count, and the rate, at its first step
            bar.reset()
            bar.initial = bar.n = bar.last_print_n = step - 1
        bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
        bar.update(step - bar.n)

    result = train(cfg, progress)
    bar.close()
    print(
        json.dumps(
            {
                "steps": result.steps,
                "final_loss": result.final_loss,
                "seconds": round(result.seconds, 1),
                "parameters": result.parameters,
                "model": str(result.export_dir),
            }
        )
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="specfold",
        description="Faster lossless decoding for masked diffusion LLMs (Fast-dLLM-v2, Nemotron-Labs-Diffusion).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser(
        "generate",
        help="decode one prompt",
        description="Decode one prompt block by block and report NFE and tokens/s.",
    )
    p.add_argument("prompt", nargs="?", help="text prompt (sent through the model's chat template)")
    p.add_argument("--prompt-ids", type=id_list, default=None, help="comma-separated token ids instead of text")
    p.add_argument("--no-chat", action="store_true", help="do not apply the chat template to a text prompt")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    add_model_args(p)
    add_decode_args(p)
    add_method_args(p)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser(
        "demo",
        help="the main job: the embedded model on held-out problems, vanilla vs spiffy vs specfold",
        description="Answer a few held-out problems of each synthetic domain (math, code, instruction following) with "
        "the embedded model, decoding vanilla, spiffy and specfold side by side; print accuracy, NFE and tokens/s.",
    )
    p.add_argument("--dtype", default="fp32", choices=list(DTYPES))
    p.add_argument("--limit", type=positive_int, default=5, help="problems per domain (default 5)")
    p.add_argument("--max-new-tokens", type=positive_int, default=64)
    p.add_argument("--delta", type=non_negative_float, default=0.1, help="specfold threshold (default 0.1)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser(
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
    p.add_argument(
        "--evalplus-out",
        default=None,
        help="also write EvalPlus samples of the code tasks (one file per method when several ran)",
    )
    add_model_args(p)
    add_decode_args(p)
    add_method_args(p, multi=True)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser(
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
        type=_grid,
        default=None,
        help="comma-separated values (default: delta 0.01,0.02,0.05,0.1,0.2,0.3,0.4,0.5,0.6,0.7; budget 2..8; "
        "depth 1..4)",
    )
    p.add_argument("--budget", type=positive_int, default=None, help="B of the delta and depth sweeps (default 7)")
    p.add_argument("--delta", type=non_negative_float, default=None, help="delta of budget/depth sweeps (0.1)")
    p.add_argument("--backend", choices=["torch", "triton"], default="torch", help="specfold engine backend")
    p.add_argument("--ffn-reuse", choices=["residual", "paper"], default="residual", help="specfold FFN reuse")
    p.add_argument(
        "--attention",
        choices=["correct", "direct"],
        default="correct",
        help="specfold folded-row attention: Eq. 8 correction or direct (same result)",
    )
    p.add_argument("--split", default="test", help="split of the tasks (default test)")
    p.add_argument("--limit", type=positive_int, default=None, help="first N samples of each task")
    p.add_argument("--data-dir", default=None, help="directory with the benchmarks' original files")
    p.add_argument("--out", default=None, help="JSONL records (default sweep_KIND.jsonl; a rerun resumes)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line (last line of stdout)")
    p.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    p.add_argument("--num-shards", type=positive_int, default=1, help="split the samples across processes")
    p.add_argument("--shard-id", type=int, default=0, help="this process's shard (0-based)")
    add_model_args(p)
    add_decode_args(p)
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser(
        "plot",
        help="figure of a sweep's records (paper Fig. 4/5/8)",
        description="delta: accuracy vs tokens/s per task across delta, vanilla and spiffy as reference points; "
        "budget / depth: tokens/s gain over vanilla vs B / depth cap for spiffy and specfold. One subplot per task.",
    )
    p.add_argument("kind", choices=["delta", "budget", "depth"], help="which sweep the records hold")
    p.add_argument("--records", required=True, nargs="+", help="sweep JSONL file(s)")
    p.add_argument("--out", required=True, help="figure file; the format follows the suffix (.png, .svg, .pdf)")
    p.add_argument("--title", default=None, help="figure title (default: the paper figure's)")
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser(
        "analyze",
        help="analyses (analyze residuals)",
        description="Analyses; `specfold analyze residuals` draws the relative residual of a draft (paper Fig. 6).",
    )
    analyze_sub = p.add_subparsers(dest="analysis", required=True, metavar="ANALYSIS", parser_class=_Parser)
    p = analyze_sub.add_parser(
        "residuals",
        help="heatmap of the relative residual rho over layers x positions (paper Fig. 6)",
        description="Decode a prompt vanilla to a block state with masks left, make a child that differs by the "
        "rule's most confident new token, run one folded pass at delta 0 on [parent, child] and draw rho (Eq. 4) "
        "of the child at every layer input and block position (log colour scale; positions marked committed / "
        "masked / newly unmasked).",
    )
    p.add_argument("--prompt", default=None, help=f"text prompt (default {DEFAULT_RESIDUAL_PROMPT!r})")
    p.add_argument("--prompt-ids", type=id_list, default=None, help="comma-separated token ids instead of text")
    p.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    p.add_argument("--out", required=True, help="figure file (.png, .svg, .pdf)")
    p.add_argument("--step", type=int, default=None, help="rule steps before the parent (default: about half masked)")
    p.add_argument("--min-masks", type=positive_int, default=4, help="masks the parent must keep (default 4)")
    p.add_argument("--json", action="store_true", help="print rho, labels and the states as one JSON object")
    add_model_args(p)
    g = p.add_argument_group("decoding")
    g.add_argument("--threshold", type=threshold_type, default=0.9, help="unmasking threshold (0.9)")
    g.add_argument("--block-size", type=positive_int, default=None, help="block length (default: the model's)")
    g.add_argument("--small-block-size", type=small_block_type, default="auto", help="N, 'none' or 'auto'")
    p.set_defaults(func=cmd_analyze_residuals)

    p = sub.add_parser(
        "merge",
        help="merge shard / rerun record files",
        description="Union of JSONL records by key (task, method, params, sample): each exactly once. Repeats with "
        "the same outcome are duplicates; repeats with different tokens/text/score/NFE are conflicts (reported, "
        "first kept, exit status 1).",
    )
    p.add_argument("records", nargs="+", help="JSONL record files")
    p.add_argument("--out", required=True, help="merged JSONL file (replaced)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.set_defaults(func=cmd_merge)

    p = sub.add_parser(
        "export-evalplus",
        help="EvalPlus sample files from eval records of code tasks",
        description="Write {task_id, solution|completion} JSONL for EvalPlus from the humaneval, mbpp and "
        "synth-code records (one file per method label when several).",
    )
    p.add_argument("--records", required=True, help="eval JSONL records")
    p.add_argument("--out", required=True, help="EvalPlus samples JSONL")
    p.add_argument("--label", default=None, help="only this method label, e.g. 'specfold[delta=0.1]'")
    p.add_argument("--data-dir", default=None, help="benchmark files: HumanEval prompts make full solutions")
    p.add_argument("--split", default="test", help="split of the records (default test)")
    p.set_defaults(func=cmd_export_evalplus)

    p = sub.add_parser(
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
    add_model_args(p)
    add_decode_args(p)
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser(
        "bench",
        help="microbenchmarks (bench layer)",
        description="Microbenchmarks; `specfold bench layer` times one dense vs one folded layer.",
    )
    bench_sub = p.add_subparsers(dest="bench", required=True, metavar="BENCH", parser_class=_Parser)
    p = bench_sub.add_parser(
        "layer",
        help="one layer at real shapes: dense vs folded at a fold ratio",
        description="One transformer layer with random weights at a real model's shape; "
        "draft rows fold with probability f; dense and folded are timed side by side "
        "(median of repeats) and compared with the FLOP-limit ratio from the shapes.",
    )
    p.add_argument(
        "--shape",
        type=lambda t: t.split(","),
        default=["fast-dllm-v2-1.5b"],
        help="fast-dllm-v2-1.5b, nld-3b, nld-8b (comma-separated)",
    )
    p.add_argument("--fold-ratio", type=float_list, default=[0.6], help="fold ratio(s) f, comma-separated")
    p.add_argument("--branches", type=positive_int, default=7, help="draft branches B (default 7)")
    p.add_argument("--block", type=positive_int, default=32)
    p.add_argument("--prefix", type=positive_int, default=512)
    p.add_argument("--dtype", default="bf16", choices=list(DTYPES))
    p.add_argument("--repeats", type=positive_int, default=7)
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (1 is steadiest)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--backend", choices=["torch", "triton"], default="torch")
    p.add_argument("--json", action="store_true", help="one JSON object per line (the last line is the last run)")
    p.set_defaults(func=cmd_bench_layer)

    p = sub.add_parser(
        "train",
        help="train a small Fast-dLLM-v2-family DLLM on the synthetic suite (CPU)",
        description="Block-diffusion training from scratch: block-causal attention across blocks, "
        "masked-token loss inside blocks, complementary masking. Resumes from OUT/state.pt; logs "
        "OUT/loss.jsonl; exports OUT/model (config.json, model.safetensors, tokenizer).",
    )
    p.add_argument("--out", required=True, help="run directory")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory (default: train one into OUT/tokenizer)")
    p.add_argument("--steps", type=positive_int, default=3000)
    p.add_argument("--max-minutes", type=float, default=None, help="wall-clock budget; the LR schedule fits it")
    p.add_argument("--batch-size", type=positive_int, default=32)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab-size", type=positive_int, default=1024)
    p.add_argument("--hidden-size", type=positive_int, default=256)
    p.add_argument("--layers", type=positive_int, default=8)
    p.add_argument("--heads", type=positive_int, default=8)
    p.add_argument("--kv-heads", type=positive_int, default=2)
    p.add_argument("--intermediate-size", type=positive_int, default=1024)
    p.add_argument(
        "--init",
        default=None,
        metavar="DIR",
        help="warm start from a checkpoint of the same shape (e.g. the shipped model, "
        "src/specfold/assets/embedded) instead of random weights; ignored when OUT/state.pt exists",
    )
    p.add_argument(
        "--mix",
        type=task_mix,
        default=None,
        metavar="TASK=N,...",
        help="train samples per task in each round, e.g. synth-math=3,synth-if=2,synth-code=1 "
        "(default: one of each)",
    )
    p.add_argument(
        "--causal-copy",
        action="store_true",
        help="add an autoregressive loss: a causal copy of each block predicts every response token from its "
        "full left context (about 1.3x the step time)",
    )
    p.set_defaults(func=cmd_train)

    p = sub.add_parser(
        "init-random",
        help="write a random-weight checkpoint in a family's real format",
        description="Write config.json + model.safetensors with random weights (for tests and demos).",
    )
    p.add_argument("out", help="output directory")
    p.add_argument("--family", choices=["fast_dllm_v2", "nld"], default="fast_dllm_v2")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab-size", type=positive_int, default=301)
    p.add_argument("--hidden-size", type=positive_int, default=96)
    p.add_argument("--heads", type=positive_int, default=6)
    p.add_argument("--kv-heads", type=positive_int, default=2)
    p.add_argument("--layers", type=positive_int, default=2)
    p.add_argument("--intermediate-size", type=positive_int, default=160)
    p.set_defaults(func=cmd_init_random)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except (CheckpointError, ValueError, FileNotFoundError, KeyboardInterrupt) as exc:
        message = str(exc) if not isinstance(exc, KeyboardInterrupt) else "interrupted"
        print(f"specfold: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
