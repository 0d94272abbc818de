"""``specfold bench layer`` (one dense vs one folded layer at real shapes) and ``specfold bench pass`` (one whole
verification pass, dense vs folded, with a per-part breakdown)."""

from __future__ import annotations

import argparse
import json

from specfold.cli.common import (
    Parser,
    delta_list,
    float_list,
    positive_int,
)
from specfold.model.loading import DTYPES


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "bench",
        help="microbenchmarks (bench layer, bench pass)",
        description="Microbenchmarks; `specfold bench layer` times one dense vs one folded layer, "
        "`specfold bench pass` one whole verification pass.",
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
    p.add_argument("--dtype", default="bf16", choices=list(DTYPES))
    p.add_argument("--repeats", type=positive_int, default=7)
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (1 is steadiest)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--backend", choices=["torch", "triton"], default="torch")
    p.add_argument("--json", action="store_true", help="one JSON object per line (the last line is the last run)")
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
                   help="fast-dllm-v2-1.5b, nld-3b, nld-8b (comma-separated)")
    p.add_argument("--delta", type=delta_list, default=[0.1], help="recompute threshold(s) in [0, 1], comma-separated")
    p.add_argument("--layers", type=positive_int, default=4, help="layers of the model (default 4)")
    p.add_argument("--vocab", type=positive_int, default=None, help="vocabulary (default: the shape's real one)")
    p.add_argument("--branches", type=positive_int, default=7, help="draft branches B (default 7)")
    p.add_argument("--block", type=positive_int, default=32)
    p.add_argument("--prefix", type=positive_int, default=512)
    p.add_argument("--dtype", default="bf16", choices=list(DTYPES))
    p.add_argument("--repeats", type=positive_int, default=5)
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (1 is steadiest)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.set_defaults(func=run_pass)


def run_pass(args: argparse.Namespace) -> int:
    from specfold.bench.verify_pass import bench_pass
    from specfold.model.loading import parse_dtype

    for shape in args.shape:
        for delta in args.delta:
            res = bench_pass(shape, delta, layers=args.layers, vocab=args.vocab, branches=args.branches,
                             block=args.block, prefix=args.prefix, dtype=parse_dtype(args.dtype), repeats=args.repeats,
                             threads=args.threads, device=args.device)
            if args.json:
                print(json.dumps(res.as_dict()), flush=True)
                continue
            total = sum(res.parts.values())
            parts = "  ".join(f"{k} {100 * v / total:.0f}%" for k, v in res.parts.items() if total)
            print(f"{shape:<18} delta={delta:<5} dense {res.dense_seconds * 1e3:8.1f} ms  folded "
                  f"{res.folded_seconds * 1e3:8.1f} ms  ratio {res.ratio:.3f}  fold {res.fold_ratio:.2f} "
                  f"ffn {res.ffn_fold_ratio:.2f}  dense layers {res.dense_layers}/{res.layers}  "
                  f"ops/layer {res.ops_per_layer:.0f}  syncs/layer {res.syncs_per_layer:.1f}\n    {parts}", flush=True)
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
                    f"{res.folded_seconds * 1e3:8.2f} ms  ratio {res.ratio:.3f}  rows limit "
                    f"{res.rows_limit_ratio:.3f}  ratio/rows {res.ratio / res.rows_limit_ratio:.3f}  FLOP limit "
                    f"{res.flop_limit_ratio:.3f}  attention {res.attention_plan}"
                )
    if args.json:
        for row in rows[:-1]:
            print(json.dumps(row))
        print(json.dumps(rows[-1]))
    return 0
