"""Shared pieces of the real-benchmark loaders: the sample type, file reading and the online fallback.

Every loader reads the benchmark's original release files under ``DIR/<benchmark>/`` first. Only when
those are missing *and* Hugging Face ``datasets`` is importable does it fall back to the hub copy
(:func:`hf_rows`); otherwise :func:`missing_data` builds one ``FileNotFoundError`` that names the
expected path. The fallback does not retry an absent hub: with ``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE`` set
only a cached copy is read, and a hub that does not answer the first connection (within
``HUB_PROBE_TIMEOUT_S``) is not asked again; either way the same one-line error names the expected path.
Nothing is read or downloaded at import time.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import socket
from collections.abc import Callable, Iterable
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
    fallback = (
        "or let the online fallback (Hugging Face `datasets`) reach the hub" if datasets_available()
        else "or install Hugging Face `datasets` for the online fallback"
    )
    msg = (
        f"{name}: data not found: expected {expected}"
        f"{' (' + hint + ')' if hint else ''}. Pass --data-dir DIR holding the original release files "
        f"under DIR/{name.split('/')[0]}/, {fallback}."
    )
    return FileNotFoundError(msg)


def expected_path(data_dir: Path | None, *parts: str) -> Path | str:
    """``data_dir/parts...``, or a ``DIR/...`` placeholder when no data dir was given."""
    return Path(data_dir, *parts) if data_dir is not None else "DIR/" + "/".join(parts)


HUB_PROBE_TIMEOUT_S = 3.0  # one connection attempt to the hub before the fallback asks it for a dataset
_TRUE = ("1", "ON", "YES", "TRUE")


def _offline_flag() -> str | None:
    return next((v for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE") if os.environ.get(v, "").upper() in _TRUE), None)


def hub_unreachable() -> str | None:
    """Why the hub cannot be asked (None when one connection to it succeeds, or a proxy is configured and the
    client's own connection is the only fair test)."""
    from urllib.parse import urlparse

    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    url = urlparse(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname or "", port), timeout=HUB_PROBE_TIMEOUT_S).close()
    except OSError as exc:
        return f"the hub at {endpoint} is unreachable: {exc.strerror or exc}"
    return None


def hf_rows(
    repo: str, config: str | None, split: str, missing: Callable[[str], Exception] | None = None
) -> list[dict]:
    """Rows of a hub dataset through ``datasets.load_dataset`` (only called as the fallback). ``missing(why)``
    builds the error raised when the hub cannot give them (offline without a cached copy, unreachable, or the
    download failed); without it the dataset library's own error propagates."""
    offline = _offline_flag()
    why = None if offline else hub_unreachable()
    if why is not None and missing is not None:
        raise missing(why)
    datasets = importlib.import_module("datasets")
    try:
        ds = datasets.load_dataset(repo, config, split=split) if config else datasets.load_dataset(repo, split=split)
    except Exception as exc:  # noqa: BLE001 - any failure of the fallback is the data not being there
        if missing is None:
            raise
        reason = f"{offline} is set and {repo} is not cached" if offline else f"{repo}: {type(exc).__name__}"
        raise missing(reason) from None
    return [dict(row) for row in ds]
