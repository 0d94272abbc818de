"""Shared pieces of the real-benchmark loaders: the sample type, file reading and the online fallback.

Every loader reads the benchmark's original release files under ``DIR/<benchmark>/`` first. Only when
those are missing *and* Hugging Face ``datasets`` is importable does it fall back to the hub copy
(:func:`hf_rows`); otherwise :func:`missing_data` builds one ``FileNotFoundError`` that names the
expected path. Nothing is read or downloaded at import time.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class BenchSample:
    """One benchmark prompt and what its scorer needs; mirrors :class:`specfold.eval.tasks.synthetic.Sample`.

    ``prompt`` is the zero-shot user message (no chat template). ``meta`` is JSON-serialisable.
    ``reference`` is the dataset's own solution written as a response that scores correct (GSM8K answer,
    MATH solution, MBPP code, HumanEval canonical body); ``""`` where the dataset has none (IFEval).
    """

    task: str  # one of BENCHMARKS
    sample_id: str  # stable id, e.g. "gsm8k/test/00017", "math500/test/precalculus/807.json"
    prompt: str
    meta: dict
    reference: str = ""


def check_limit(limit: int | None) -> None:
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")


def check_split(name: str, split: str, splits: Iterable[str]) -> None:
    splits = tuple(splits)
    if split not in splits:
        raise ValueError(f"{name}: unknown split {split!r}; expected one of {splits}")


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def datasets_available() -> bool:
    """Whether Hugging Face ``datasets`` can be imported (the online fallback)."""
    return importlib.util.find_spec("datasets") is not None


def missing_data(name: str, expected: Path | str, hint: str = "") -> FileNotFoundError:
    """The one error raised when neither the release file nor the online fallback is available."""
    msg = (
        f"{name}: data not found: expected {expected}"
        f"{' (' + hint + ')' if hint else ''}. Pass --data-dir DIR holding the original release files "
        f"under DIR/{name.split('/')[0]}/, or install Hugging Face `datasets` for the online fallback."
    )
    return FileNotFoundError(msg)


def expected_path(data_dir: Path | None, *parts: str) -> Path | str:
    """``data_dir/parts...``, or a ``DIR/...`` placeholder when no data dir was given."""
    return Path(data_dir, *parts) if data_dir is not None else "DIR/" + "/".join(parts)


def hf_rows(repo: str, config: str | None, split: str) -> list[dict]:
    """Rows of a hub dataset through ``datasets.load_dataset`` (network; only called as the fallback)."""
    datasets = importlib.import_module("datasets")
    ds = datasets.load_dataset(repo, config, split=split) if config else datasets.load_dataset(repo, split=split)
    return [dict(row) for row in ds]
