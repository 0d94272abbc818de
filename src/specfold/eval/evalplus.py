"""EvalPlus-compatible sample files from eval records of code tasks (HumanEval, MBPP, synth-code).

EvalPlus reads JSONL with one ``{"task_id", "solution"}`` (a self-contained program) or ``{"task_id",
"completion"}`` (appended to the task's prompt) per line. Task ids follow EvalPlus: ``HumanEval/0``, ``Mbpp/11``;
synthetic tasks keep their sample id. HumanEval gets a ``solution`` (prompt + the model's code, as our scorer
builds it) when the samples are given, else a ``completion``; MBPP and synth-code get ``solution``.

    >>> write_evalplus(read_records(Path("runs/eval.jsonl")), Path("humaneval_samples.jsonl"))
    {'specfold[delta=0.1]': PosixPath('humaneval_samples.jsonl')}

then ``evalplus.evaluate --dataset humaneval --samples humaneval_samples.jsonl``. Records of several methods go to
one file per method label (``OUT`` stem + ``.<label>`` + suffix), because EvalPlus scores one model per file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from specfold.io import atomic_write_text

CODE_TASKS: tuple[str, ...] = ("humaneval", "mbpp", "synth-code")


def evalplus_task_id(task: str, sample_id: str) -> str:
    """``humaneval/HumanEval/0`` -> ``HumanEval/0``; ``mbpp/test/11`` -> ``Mbpp/11``; others unchanged."""
    if task == "humaneval":
        return sample_id.removeprefix("humaneval/")
    if task == "mbpp":
        return "Mbpp/" + sample_id.rsplit("/", 1)[-1]
    return sample_id


def evalplus_row(rec: dict[str, Any], sample: Any | None = None) -> dict[str, str]:
    """One EvalPlus line for a record of a code task (``sample``: the task's sample, for HumanEval's prompt)."""
    task, text = rec["task"], rec.get("text") or ""
    row = {"task_id": evalplus_task_id(task, rec["sample_id"])}
    if task == "humaneval":
        from specfold.eval.benchmarks.code import extract_code, humaneval_program

        if sample is not None:
            row["solution"] = humaneval_program(sample.meta, text)
        else:
            row["completion"] = extract_code(text)
    elif task == "mbpp":
        from specfold.eval.benchmarks.code import extract_code

        row["solution"] = extract_code(text)
    elif task == "synth-code":
        from specfold.eval.tasks.synthetic.code import extract_code

        row["solution"] = extract_code(text)
    else:
        raise ValueError(f"{task} is not a code task ({', '.join(CODE_TASKS)})")
    return row


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", label).strip("_")


def write_evalplus(
    records: Iterable[dict[str, Any]],
    out: Path,
    samples: Mapping[str, Any] | None = None,
    label: str | None = None,
) -> dict[str, Path]:
    """Write the code-task records as EvalPlus samples; returns ``{method label: file}``.

    ``samples``: sample id -> sample (HumanEval solutions need the prompt); ``label``: only that method. Records of
    non-code tasks are skipped; nothing to write is an error."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        lab = rec.get("label", rec["method"])
        if rec["task"] in CODE_TASKS and (label is None or lab == label):
            groups.setdefault(lab, []).append(rec)
    if not groups:
        what = f" of method {label!r}" if label else ""
        raise ValueError(f"no records{what} of a code task ({', '.join(CODE_TASKS)}) to export")
    written: dict[str, Path] = {}
    for lab, recs in groups.items():
        path = out if len(groups) == 1 else out.with_name(f"{out.stem}.{_slug(lab)}{out.suffix}")
        rows = [evalplus_row(rec, samples.get(rec["sample_id"]) if samples is not None else None) for rec in recs]
        atomic_write_text(path, "".join(json.dumps(row) + "\n" for row in rows))
        written[lab] = path
    return written
