"""``specfold bench layer`` (one dense vs one folded layer at real shapes), ``specfold bench pass`` (one whole
verification pass, dense vs folded, with a per-part breakdown), ``specfold bench batch`` (batched decoding) and
``specfold bench kernels --compile-only`` (every Triton kernel compiled for sm_80 / sm_90, no GPU needed)."""

from __future__ import annotations

import argparse
import json

from specfold.cli.common import (
    DTYPE_CHOICES,
    Parser,
    UsageError,
    add_cache_arg,
    choices,
    choose_compile,
    delta_list,
    delta_type,
    float_list,
    int_list,
    method_list,
    positive_int,
    progress_bar,
    resolve_dtype,
    threshold_type,
)
from specfold.config import AttentionMode, Backend, MethodConfig

DTYPE_HELP = ("auto (default): bf16 where the CPU has native bf16 matrix units (AMX, AVX-512 BF16) or on a GPU, fp32 "
              "elsewhere (a bf16 GEMM is emulated on an AVX2-only CPU: use --dtype bf16 to measure that anyway)")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "bench",
        help="benchmarks (bench layer, bench pass, bench batch, bench kernels)",
        description="Benchmarks; `specfold bench layer` times one dense vs one folded layer, "
        "`specfold bench pass` one whole verification pass, `specfold bench batch` batched decoding, "
        "`specfold bench kernels --compile-only` compiles every Triton kernel for a GPU target.",
    )
    bench_sub = p.add_subparsers(dest="bench", required=True, metavar="BENCH", parser_class=Parser)
    p = bench_sub.add_parser(
        "layer",
        help="one layer at real shapes: dense vs folded at a fold ratio",
        description="One transformer layer with random weights at a real model's shape; "
        "draft rows fold with probability f; dense and folded are timed side by side "
        "(median of interleaved repeats) with the rows limit (the same arithmetic on the recomputed rows packed "
        "beforehand) and compared with the FLOP-limit ratio from the shapes.",
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
    p.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES, help=DTYPE_HELP)
    p.add_argument("--repeats", type=positive_int, default=7)
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (1 is steadiest)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--backend", choices=choices(Backend), default="torch")
    p.add_argument("--json", action="store_true", help="one JSON object per line (the last line is the last run)")
    p.add_argument("--compile", action="store_true",
                   help="also time the compiled folded layer and the compiled rows limit (torch.compile; the first "
                   "calls, which compile, are timed apart)")
    p.set_defaults(func=run)

    p = bench_sub.add_parser(
        "pass",
        help="one whole verification pass (embedding, L layers, head): dense vs folded, per-part breakdown",
        description="A random-weight model at a real shape verifies K draft states (real gate decisions at delta) "
        "against a random prefix; dense and folded passes are timed side by side (median of interleaved "
        "repeats); one profiled folded pass gives seconds per part (gate, packing, qkv, attention, correction, "
        "o_proj, ffn, head) and one counted pass the framework ops and host syncs per layer.",
    )
    p.add_argument("--shape", type=lambda t: t.split(","), default=["fast-dllm-v2-1.5b"],
                   help="fast-dllm-v2-1.5b, nld-3b, nld-8b, or embedded: the shipped model itself, all its layers "
                   "(comma-separated)")
    p.add_argument("--delta", type=delta_list, default=[0.1], help="recompute threshold(s) in [0, 1], comma-separated")
    p.add_argument("--fold-ratio", type=float_list, default=[None],
                   help="impose fold ratio(s) f on every layer instead of the gate's decisions, and time the rows "
                   "limit beside (a dense pass over the rows a folded layer recomputes)")
    p.add_argument("--attention", choices=choices(AttentionMode), default="auto",
                   help="folded rows' attention: auto (the cost rule's choice per layer, default), direct (every "
                   "row's attention recomputed from its source's query) or correct (Eq. 8 from the parent's state)")
    p.add_argument("--layers", type=positive_int, default=4, help="layers of the model (default 4)")
    p.add_argument("--vocab", type=positive_int, default=None, help="vocabulary (default: the shape's real one)")
    p.add_argument("--branches", type=positive_int, default=7, help="draft branches B (default 7)")
    p.add_argument("--block", type=positive_int, default=32)
    p.add_argument("--prefix", type=positive_int, default=512)
    p.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES, help=DTYPE_HELP)
    p.add_argument("--repeats", type=positive_int, default=5)
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (1 is steadiest)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--compile", action="store_true",
                   help="also time the compiled folded pass, the compiled dense pass and the compiled rows limit "
                   "(torch.compile; the first calls, which compile, are timed apart)")
    p.set_defaults(func=run_pass)

    p = bench_sub.add_parser(
        "batch",
        help="batched decoding: throughput and latency over batch sizes, methods side by side",
        description="A queue of held-out prompts (the first --prompts of the synthetic tasks' test split, spread "
        "over the tasks) decoded through a continuous batch of at most R requests, for each R of --batch-sizes and "
        "each method, interleaved (--repeats rounds of the whole grid; medians). Reports total tokens/s (generated "
        "tokens / wall seconds of the queue), per-request latency p50/p95, NFE, accepted drafts, fold ratio, and "
        "the share of requests whose tokens equal the method's batch-1 tokens. --shape instead of --model: a "
        "random-weight model at that real layer shape with --layers layers (the embedded model's draft graph). "
        "Use --threads 1 and bf16 for steady CPU figures.",
    )
    p.add_argument("--model", default=None, help="checkpoint directory or hub id (default: the embedded model)")
    p.add_argument("--shape", default=None, help="random weights at this shape instead (fast-dllm-v2-1.5b, nld-8b…)")
    p.add_argument("--layers", type=positive_int, default=2, help="layers of the --shape model (default 2)")
    p.add_argument("--vocab", type=positive_int, default=None, help="vocabulary of the --shape model (default: real)")
    p.add_argument("--tasks", default="synth-math,synth-code,synth-if", help="tasks whose test prompts are used")
    p.add_argument("--prompts", type=positive_int, default=48, help="requests in the queue (default 48)")
    p.add_argument("--batch-sizes", type=int_list, default=[1, 4, 8, 16], help="R values (default 1,4,8,16)")
    p.add_argument("--methods", type=method_list, default=["vanilla", "spiffy", "specfold"])
    p.add_argument("--delta", type=delta_type, default=0.1, help="specfold's delta (default 0.1)")
    p.add_argument("--backend", choices=choices(Backend), default="torch", help="specfold engine backend")
    p.add_argument("--max-new-tokens", type=positive_int, default=64, help="generation budget (default 64)")
    p.add_argument("--threshold", type=threshold_type, default=0.9)
    p.add_argument("--block-size", type=positive_int, default=None, help="block length (default: the model's)")
    p.add_argument("--steps", type=positive_int, default=None,
                   help="a quota rule's passes (SDAR: per block; LLaDA: of the whole generation)")
    add_cache_arg(p)
    p.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES, help=DTYPE_HELP)
    p.add_argument("--repeats", type=positive_int, default=1, help="interleaved rounds of the grid (default 1)")
    p.add_argument("--json", action="store_true", help="one JSON object per grid point")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="the dense forwards under torch.compile (default: on when the run plans enough tokens to "
                   "repay the compile, see specfold.config.compile_pays)")
    p.add_argument("--eager-and-compiled", action="store_true",
                   help="run every method twice, eager and compiled (NAME+compile), interleaved in the same rounds: "
                   "compiled vs eager side by side (the table adds 'vs eager'; JSON points carry 'compiled')")
    p.set_defaults(func=run_batch)

    p = bench_sub.add_parser(
        "kernels",
        help="compile every Triton kernel for sm_80 / sm_90 at the real shapes (no GPU needed)",
        description="Compile check of the Triton backend, without a GPU: the folded layer is run on meta tensors at "
        "each --shape and --dtype (draft branches B = 7, block 32, prefix 512), every kernel launch is recorded "
        "with the tile sizes, warps and stages its launcher picks, and compiled for each --arch with the ptxas "
        "bundled in the triton wheel. Reports registers, spill bytes and shared memory per (kernel, shape, dtype, "
        "arch) and flags what breaks a limit (shared memory over the per-block maximum: A100 163 KiB, H100 227 "
        "KiB; registers over a block's 64 Ki; any spill). Exit status 1 when something fails to compile or breaks "
        "a limit. TRITON_INTERPRET must be unset. Example: specfold bench kernels --compile-only --arch "
        "sm_80,sm_90 --shape nld-8b --dtype bf16 --json",
    )
    p.add_argument("--compile-only", action="store_true", required=True,
                   help="compile, do not run (the only mode so far; required)")
    p.add_argument("--arch", type=_name_list, default=None, help="sm_80, sm_90 (comma-separated; default both)")
    p.add_argument("--shape", type=_name_list, default=None,
                   help="fast-dllm-v2-1.5b, fast-dllm-v2-7b, nld-3b, nld-8b, nld-14b (comma-separated; default all)")
    p.add_argument("--dtype", type=_name_list, default=None,
                   help="bf16, fp32, fp16 (comma-separated; default bf16,fp32)")
    p.add_argument("--json", action="store_true",
                   help="one JSON object per line: kernel, shape, dtype, arch, compiled, error, registers, spills "
                   "(bytes of spill stores), shared_bytes, num_warps, num_stages, and tiles, grid, violations")
    p.set_defaults(func=run_kernels)


def _name_list(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {text!r}")
    return names


def run_kernels(args: argparse.Namespace) -> int:
    import os

    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise UsageError("bench kernels compiles for a GPU target: unset TRITON_INTERPRET (the interpreter compiles "
                         "nothing)")
    from specfold.bench.kernels import compile_kernels, violations

    try:
        results = compile_kernels(args.shape, args.dtype, args.arch)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    bad = 0
    if not args.json:
        print(f"{'kernel':<24}{'shape':<19}{'dtype':<6}{'arch':<7}{'regs':>5}{'spills':>7}{'shared KiB':>11}"
              f"{'warps':>6}{'stages':>7}  tiles / problems")
    for r in results:
        problems = violations(r)
        bad += bool(problems)
        if args.json:
            print(json.dumps({**r.as_dict(), "violations": problems}), flush=True)
            continue
        regs = "-" if r.registers is None else r.registers
        spills = "-" if r.spills is None else r.spills
        shared = "-" if r.shared_bytes is None else f"{r.shared_bytes / 1024:.1f}"
        tiles = " ".join(f"{k}={v}" for k, v in r.tiles.items())
        print(f"{r.kernel:<24}{r.shape:<19}{r.dtype:<6}{r.arch:<7}{regs:>5}{spills:>7}{shared:>11}{r.num_warps:>6}"
              f"{r.num_stages:>7}  {tiles}" + "".join(f"\n    ! {p}" for p in problems), flush=True)
    if bad and not args.json:
        print(f"{bad} kernel compile(s) failed or broke a limit", flush=True)
    return 1 if bad else 0


def run_pass(args: argparse.Namespace) -> int:
    from specfold.bench.verify_pass import bench_pass
    from specfold.model.loading import parse_dtype

    dtype = parse_dtype(resolve_dtype(args, args.device))
    grid = [(shape, delta, f) for shape in args.shape for delta in args.delta for f in args.fold_ratio]
    for shape, delta, f in grid:
        res = bench_pass(shape, delta, layers=args.layers, vocab=args.vocab, branches=args.branches,
                         block=args.block, prefix=args.prefix, dtype=dtype, repeats=args.repeats,
                         threads=args.threads, device=args.device, imposed_fold=f, compile=args.compile,
                         attention=args.attention)
        if args.json:
            print(json.dumps(res.as_dict()), flush=True)
            continue
        if f is not None:
            print(f"{shape:<18} imposed fold {f:.2f}: folded {res.folded_seconds * 1e3:8.1f} ms  rows limit "
                  f"{res.rows_seconds * 1e3:8.1f} ms  folded/rows {res.rows_ratio:.3f}")
        total = sum(res.parts.values())
        parts = "  ".join(f"{k} {100 * v / total:.0f}%" for k, v in res.parts.items() if total)
        print(f"{shape:<18} delta={delta:<5} dense {res.dense_seconds * 1e3:8.1f} ms  folded "
              f"{res.folded_seconds * 1e3:8.1f} ms  ratio {res.ratio:.3f}  fold {res.fold_ratio:.2f} "
              f"ffn {res.ffn_fold_ratio:.2f}  dense layers {res.dense_layers}/{res.layers}  "
              f"ops/layer {res.ops_per_layer:.0f}  syncs/layer {res.syncs_per_layer:.1f}\n    {parts}", flush=True)
        if res.compiled_seconds is not None:
            crows = "" if res.compiled_rows_ratio is None else f"  compiled folded/rows {res.compiled_rows_ratio:.3f}"
            print(f"    compiled: folded {res.compiled_seconds * 1e3:8.1f} ms  dense "
                  f"{res.compiled_dense_seconds * 1e3:8.1f} ms{crows}  ({res.compiled_graphs} graphs, "
                  f"{res.compile_seconds:.1f} s compiling)", flush=True)
        if res.rule_gate_seconds is not None:
            print(f"    per-pass rule on this machine: dense layer {res.rule_dense_layer_seconds * 1e3:.2f} ms, "
                  f"bookkeeping of a folded layer G {res.rule_gate_seconds * 1e3:.2f} ms", flush=True)
    return 0


def run(args: argparse.Namespace) -> int:
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
                dtype=parse_dtype(resolve_dtype(args, args.device)),
                repeats=args.repeats,
                backend=args.backend,
                threads=args.threads,
                device=args.device,
                compile=args.compile,
            )
            rows.append(res.as_dict())
            if not args.json:
                print(
                    f"{shape:<18} f={f:<4} dense {res.dense_seconds * 1e3:8.2f} ms  folded "
                    f"{res.folded_seconds * 1e3:8.2f} ms  ratio {res.ratio:.3f}  rows limit "
                    f"{res.rows_limit_ratio:.3f}  ratio/rows {res.ratio / res.rows_limit_ratio:.3f}  FLOP limit "
                    f"{res.flop_limit_ratio:.3f}  attention {res.attention_plan}"
                    + ("" if res.compiled_seconds is None else f"  compiled {res.compiled_seconds * 1e3:8.2f} ms  "
                       f"compiled/rows(compiled) {res.compiled_rows_ratio:.3f}")
                )
    if args.json:
        for row in rows[:-1]:
            print(json.dumps(row))
        print(json.dumps(rows[-1]))
    return 0


COMPILED_SUFFIX = "+compile"  # bench batch --eager-and-compiled: the compiled twin of a method


def run_batch(args: argparse.Namespace) -> int:
    from specfold.api import decode_config_for, load_model, prepare_method
    from specfold.bench.batch import BatchBenchConfig, bench_batch, held_out_prompts, random_shape_model, shape_graph
    from specfold.model.embedded import EMBEDDED_DIR
    from specfold.model.loading import parse_dtype

    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if args.shape is not None and args.model is not None:
        raise UsageError("--shape builds a random model; it does not take --model")
    bench = BatchBenchConfig(tuple(args.batch_sizes), args.repeats)
    text_model = load_model(args.model, dtype=resolve_dtype(args))
    graph = None
    if args.shape is None:
        model, prompts = text_model, held_out_prompts(text_model, tasks, args.prompts)
    else:
        model = random_shape_model(args.shape, args.layers, args.vocab, parse_dtype(args.dtype))
        prompts = held_out_prompts(text_model, tasks, args.prompts, model.config.vocab_size)
        graph = EMBEDDED_DIR / "draft_graph.json"
    cfg = decode_config_for(model, args.max_new_tokens, args.threshold, args.block_size, "auto", None, args.steps,
                            cache=args.cache)
    if graph is not None:
        graph = shape_graph(cfg.block_size)  # the embedded graph, or one within a shorter block (SDAR)
    runs = 1 + bench.repeats * len(bench.batch_sizes)  # the warm-up, then the grid
    if args.eager_and_compiled:
        if args.compile is not None:
            raise UsageError("--eager-and-compiled runs both; drop --compile / --no-compile")
        modes = (False, True)
    else:
        modes = (choose_compile(args, len(prompts) * args.max_new_tokens * len(args.methods) * runs),)
    methods, compiled_label = {}, {}
    for name in args.methods:
        for comp in modes:
            options = {"delta": args.delta, "backend": args.backend} if name == "specfold" else {}
            options["compile"] = comp
            if name != "vanilla" and graph is not None:
                options["graph"] = graph
            label = name + (COMPILED_SUFFIX if comp and len(modes) == 2 else "")
            methods[label] = prepare_method(model, MethodConfig(name, **options), cfg)
            compiled_label[label] = comp
    bar = progress_bar(len(bench.batch_sizes) * len(methods) * bench.repeats, "bench batch")

    def progress(p) -> None:
        bar.set_postfix_str(f"{p.method} R={p.batch_size} {p.tokens_per_second:.1f} tok/s", refresh=False)
        bar.update(p.done - bar.n)

    points = bench_batch(model, prompts, cfg, methods, bench, progress)
    bar.close()
    label = args.shape and f"random {args.shape} x{args.layers}L" or model.name
    if args.json:
        for pt in points:
            name = pt.method.removesuffix(COMPILED_SUFFIX)
            print(json.dumps({"model": label, "dtype": args.dtype, "delta": args.delta, **pt.as_dict(), "method": name,
                              "compiled": compiled_label[pt.method]}))
        return 0
    print(f"{label}, {args.dtype}, {len(prompts)} prompts, max {args.max_new_tokens} new tokens, delta {args.delta}"
          + "".join(f", {k} {v}" for k, v in (("block", cfg.block_size), ("steps", cfg.steps), ("cache", cfg.cache))
                    if v is not None))
    base = {(p.method, p.batch_size): p for p in points}
    both = args.eager_and_compiled
    width = max(9, *(len(m) for m in methods))
    print(f"{'R':>3} {'method':<{width}} {'tok/s':>8} {'vs R=1':>7} {'vs spiffy':>9} {'p50 s':>7} {'p95 s':>7} "
          f"{'NFE':>6} {'acc':>5} {'fold':>5} {'agree':>6}" + (f" {'vs eager':>8}" if both else ""))
    for p in points:
        one = base.get((p.method, 1))
        suffix = COMPILED_SUFFIX if compiled_label[p.method] and both else ""
        sp = base.get(("spiffy" + suffix, p.batch_size))
        eager = base.get((p.method.removesuffix(COMPILED_SUFFIX), p.batch_size))
        vs_eager = f" {p.tokens_per_second / eager.tokens_per_second:>8.2f}" if both and eager is not None else ""
        fr = "-" if p.fold_ratio is None else f"{p.fold_ratio:.2f}"
        vs_one = "-" if one is None else f"{p.tokens_per_second / one.tokens_per_second:.2f}"
        vs_spiffy = "-" if sp is None else f"{p.tokens_per_second / sp.tokens_per_second:.2f}"
        agree = "-" if p.agreement is None else f"{p.agreement:.2f}"
        window = "" if p.fold_ratio_block is None else f"  (fold: block rows {p.fold_ratio_block:.2f}, " + (
            "-" if p.fold_ratio_context is None else f"context rows {p.fold_ratio_context:.2f}") + ")"
        print(f"{p.batch_size:>3} {p.method:<{width}} {p.tokens_per_second:>8.1f} {vs_one:>7} {vs_spiffy:>9} "
              f"{p.latency_p50:>7.2f} {p.latency_p95:>7.2f} {p.nfe:>6} {p.accepted_drafts:>5} {fr:>5} {agree:>6}"
              f"{vs_eager}{window}")
    compiled = {p.method: p for p in points if p.compiled_graphs}
    if compiled:  # the forwards are shared: the first method to run pays for the graphs
        print("compiled: " + ", ".join(f"{m} {p.compiled_graphs} graphs in {p.compile_seconds:.1f} s"
                                       for m, p in compiled.items()))
    return 0
