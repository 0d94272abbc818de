"""``specfold plot``: the figure of a sweep's records (paper Fig. 4/5/8)."""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plot",
        help="figure of a sweep's records (paper Fig. 4/5/8)",
        description="delta: accuracy vs tokens/s per task across delta, vanilla and spiffy as reference points; "
        "budget / depth: tokens/s gain over vanilla vs B / depth cap for spiffy and specfold. One subplot per task.",
    )
    p.add_argument("kind", choices=["delta", "budget", "depth"], help="which sweep the records hold")
    p.add_argument("--records", required=True, nargs="+", help="sweep JSONL file(s)")
    p.add_argument("--out", required=True, help="figure file; the format follows the suffix (.png, .svg, .pdf)")
    p.add_argument("--title", default=None, help="figure title (default: the paper figure's)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from specfold.cli.common import check_figure_out
    from specfold.eval.plots import plot_sweep
    from specfold.eval.records import scan_records

    check_figure_out(args.out)
    records, skipped = [], 0
    for path in args.records:
        if not Path(path).is_file():
            raise FileNotFoundError(f"no records file {path}")
        scan = scan_records(Path(path))
        records += scan.records
        if (note := scan.describe(path)) is not None:
            skipped += len(scan.corrupt) + scan.torn
            print(f"specfold: warning: {note}", file=sys.stderr)
    out = plot_sweep(records, args.kind, Path(args.out), args.title)
    print(json.dumps({"figure": str(out), "kind": args.kind, "records": len(records), "skipped_lines": skipped}))
    return 0
