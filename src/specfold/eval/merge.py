"""Merging the JSONL records of data-parallel shards (``specfold eval --num-shards N --shard-id i``) or reruns.

Records are united by their resume key (task, method, method parameters, sample id —
:func:`~specfold.eval.harness.record_key`), so every (task, method, params, sample) appears exactly once. The same
key in two inputs is a *duplicate* when the decoding outcome agrees (timings may differ) and a *conflict* when it
does not (different tokens, text, score or NFE: the inputs were made with different models or settings); the
first record is kept either way and every conflict is reported.

    >>> report = merge_records([Path("shard0.jsonl"), Path("shard1.jsonl")])
    >>> write_records(report.records, Path("all.jsonl")); report.conflicts
    []
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specfold.eval.harness import record_key
from specfold.eval.records import scan_records
from specfold.io import atomic_write_text

# What must agree between two records of one key (timing fields such as ``seconds`` may differ).
OUTCOME_FIELDS: tuple[str, ...] = ("token_ids", "text", "correct", "nfe", "nfe_denoise", "generated_tokens")


@dataclass
class MergeReport:
    records: list[dict[str, Any]]  # one per key, ordered by (task, sample id, method label)
    inputs: dict[str, int] = field(default_factory=dict)  # path -> records read
    duplicates: int = 0  # repeated keys with the same outcome
    conflicts: list[dict[str, Any]] = field(default_factory=list)  # repeated keys with different outcomes
    skipped: dict[str, int] = field(default_factory=dict)  # path -> lines that were not records (corrupt, torn)
    notes: list[str] = field(default_factory=list)  # one line per input with skipped lines

    def to_dict(self, out: Path | None = None) -> dict[str, Any]:
        return {
            "out": str(out) if out is not None else None,
            "inputs": self.inputs,
            "records": len(self.records),
            "duplicates": self.duplicates,
            "conflicts": self.conflicts,
            "skipped_lines": self.skipped,
        }


def merge_records(paths: Sequence[Path]) -> MergeReport:
    """Union of the records in ``paths`` by key; lines that are not records (corrupt, or a torn last line) are left
    out and counted per input (``skipped``, ``notes``)."""
    if not paths:
        raise ValueError("nothing to merge: give at least one records file")
    kept: dict[str, tuple[dict[str, Any], str]] = {}
    report = MergeReport(records=[])
    for path in paths:
        if not Path(path).is_file():
            raise FileNotFoundError(f"no records file {path}")
        scan = scan_records(Path(path))
        recs = scan.records
        report.inputs[str(path)] = len(recs)
        if scan.corrupt or scan.torn:
            report.skipped[str(path)] = len(scan.corrupt) + scan.torn
            report.notes.append(scan.describe(path))
        for rec in recs:
            key = record_key(rec)
            if key not in kept:
                kept[key] = (rec, str(path))
                continue
            first, where = kept[key]
            differ = [f for f in OUTCOME_FIELDS if first.get(f) != rec.get(f)]
            if differ:
                report.conflicts.append(
                    {"task": rec["task"], "label": rec.get("label", rec["method"]), "sample_id": rec["sample_id"],
                     "files": [where, str(path)], "fields": differ}
                )
            else:
                report.duplicates += 1
    report.records = sorted(
        (rec for rec, _ in kept.values()),
        key=lambda r: (r["task"], r["sample_id"], r.get("label", r["method"]), record_key(r)),
    )
    return report


def write_records(records: Iterable[dict[str, Any]], out: Path) -> Path:
    """Write records as JSONL (replacing ``out``; through a temporary file, so a crash leaves no half file)."""
    return atomic_write_text(out, "".join(json.dumps(rec) + "\n" for rec in records))
