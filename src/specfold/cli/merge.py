"""``specfold merge``: merge shard / rerun record files."""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "merge",
        help="merge shard / rerun record files",
        description="Union of JSONL records by key (task, method, params, sample): each exactly once. Repeats with "
        "the same outcome are duplicates; repeats with different tokens/text/score/NFE are conflicts (reported, "
        "first kept, exit status 1).",
    )
    p.add_argument("records", nargs="+", help="JSONL record files")
    p.add_argument("--out", required=True, help="merged JSONL file (replaced)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from specfold.cli.common import check_outputs
    from specfold.eval.merge import merge_records, write_records

    check_outputs(("--out", args.out))
    report = merge_records([Path(p) for p in args.records])
    out = write_records(report.records, Path(args.out))
    info = report.to_dict(out)
    for note in report.notes:
        print(f"specfold: warning: {note}", file=sys.stderr)
    if args.json:
        print(json.dumps(info))
    else:
        n_in = sum(report.inputs.values())
        print(
            f"merged {n_in} records from {len(report.inputs)} files into {len(report.records)} "
            f"({report.duplicates} duplicates, {len(report.conflicts)} conflicts, "
            f"{sum(report.skipped.values())} lines skipped) -> {out}"
        )
        for c in report.conflicts:
            print(
                f"conflict: {c['task']} {c['label']} {c['sample_id']} differs in {', '.join(c['fields'])} "
                f"between {c['files'][0]} and {c['files'][1]}",
                file=sys.stderr,
            )
    return 1 if report.conflicts else 0
