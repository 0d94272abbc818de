"""``specfold export-evalplus``: EvalPlus sample files from eval records."""

from __future__ import annotations

import argparse
import json

from specfold.cli.common import (
    check_outputs,
    evalplus_samples,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
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
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from specfold.eval.evalplus import write_evalplus
    from specfold.eval.harness import read_records

    check_outputs(("--out", args.out))
    if not Path(args.records).is_file():
        raise FileNotFoundError(f"no records file {args.records}")
    records = read_records(Path(args.records))
    samples = None
    if args.data_dir:
        samples = evalplus_samples({r["task"] for r in records}, args.split, Path(args.data_dir))
    written = write_evalplus(records, Path(args.out), samples, args.label)
    print(json.dumps({"files": {k: str(v) for k, v in written.items()}}))
    return 0
