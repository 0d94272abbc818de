"""``specfold bench layer``: one dense vs one folded layer at real shapes."""

from __future__ import annotations

import argparse
import json

from specfold.cli.common import (
    Parser,
    float_list,
    positive_int,
)
from specfold.model.loading import DTYPES


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "bench",
        help="microbenchmarks (bench layer)",
        description="Microbenchmarks; `specfold bench layer` times one dense vs one folded layer.",
    )
    bench_sub = p.add_subparsers(dest="bench", required=True, metavar="BENCH", parser_class=Parser)
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
    p.set_defaults(func=run)


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
                    f"{res.folded_seconds * 1e3:8.2f} ms  ratio {res.ratio:.3f}  FLOP limit "
                    f"{res.flop_limit_ratio:.3f}  ratio/limit {res.ratio / res.flop_limit_ratio:.3f}"
                )
    if args.json:
        for row in rows[:-1]:
            print(json.dumps(row))
        print(json.dumps(rows[-1]))
    return 0
