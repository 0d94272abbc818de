"""One validation layer for the options and arguments of the CLI, the Python API and the server.

Every check raises :class:`ValidationError` (a ``ValueError``) with one line naming the problem, and none of them
does any work besides looking: the CLI calls them before loading a model, the API before decoding. Outputs are
checked writable before any work (:func:`check_output_path`) and written through a temporary file renamed over
the target (:func:`atomic_output`, :func:`atomic_write_text`), so an interrupted run never leaves half a file.

    >>> check_delta(1.5)
    Traceback (most recent call last):
    ValidationError: delta must be a finite number in [0, 1], got 1.5
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specfold.decoding.draft_graph import DraftGraph

__all__ = [
    "METHOD_OPTIONS",
    "ValidationError",
    "atomic_output",
    "atomic_write_text",
    "check_delta",
    "check_device",
    "check_figure_path",
    "check_graph",
    "check_graph_budget",
    "check_method_options",
    "check_output_path",
    "check_token_ids",
]


class ValidationError(ValueError):
    """An option or argument outside what it may be; the message is one line."""


# Which methods each speculation option applies to (an option given for a method it does not apply to is refused).
METHOD_OPTIONS: dict[str, tuple[str, ...]] = {
    "graph": ("spiffy", "specfold"),
    "budget": ("spiffy", "specfold"),
    "depth": ("spiffy", "specfold"),
    "lookahead": ("spiffy", "specfold"),
    "delta": ("specfold",),
    "backend": ("specfold",),
    "ffn": ("specfold",),
    "attention": ("specfold",),
}


def check_delta(delta: Any, name: str = "delta") -> float:
    """δ as a float in [0, 1] (NaN and infinities refused)."""
    try:
        value = float(delta)
    except (TypeError, ValueError):
        raise ValidationError(f"{name} must be a finite number in [0, 1], got {delta!r}") from None
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise ValidationError(f"{name} must be a finite number in [0, 1], got {value}")
    return value


def check_method_options(
    methods: str | Sequence[str],
    given: Mapping[str, Any],
    flags: Mapping[str, str] | None = None,
    selector: str = "",
) -> None:
    """Refuse a speculation option that none of ``methods`` uses. ``given`` holds the options the caller set
    explicitly (None = not given, so defaults never trigger this); ``flags`` maps option names to the names the
    caller knows them by (``{"ffn": "--ffn-reuse"}``), ``selector`` prefixes the method list in the message."""
    names = [methods] if isinstance(methods, str) else list(methods)
    for option, value in given.items():
        if value is None:
            continue
        users = METHOD_OPTIONS[option]
        if not any(m in users for m in names):
            shown = (flags or {}).get(option, option)
            raise ValidationError(f"{shown} applies to {selector}{' or '.join(users)}, not {','.join(names)}")


def check_graph_budget(graph: DraftGraph, budget: int | None) -> None:
    """A budget asked of a given graph must be the graph's own (a graph file is not re-selected)."""
    if budget is not None and budget != graph.budget:
        raise ValidationError(
            f"budget {budget} does not match the draft graph, which has {graph.budget} nodes "
            "(drop the budget, or pass a graph of that budget)"
        )


def check_graph(graph: DraftGraph, block_size: int | None = None, vocab_size: int | None = None) -> None:
    """The graph's position ranks fit in a block, its vocab ranks in the vocabulary, and the block size it was
    calibrated with (its provenance, when it records one) is the run's."""
    if block_size is not None:
        top = max((r for f in graph.nodes for step in f for r, _ in step), default=0)
        if top > block_size:
            raise ValidationError(f"the draft graph uses position rank {top}, past the block of {block_size} positions")
        calibrated = graph.provenance.get("block_size")
        if isinstance(calibrated, int) and calibrated != block_size:
            raise ValidationError(
                f"the draft graph was calibrated with block size {calibrated}, this run decodes blocks of "
                f"{block_size} (calibrate a graph for this block size)"
            )
    if vocab_size is not None and graph.max_vocab_rank > vocab_size:
        raise ValidationError(
            f"the draft graph uses vocab rank {graph.max_vocab_rank}, past the vocabulary ({vocab_size} tokens)"
        )


def check_token_ids(ids: Iterable[int], vocab_size: int) -> None:
    """Every prompt token id inside ``[0, vocab_size)``."""
    values = [int(i) for i in ids]
    if not values:
        raise ValidationError("empty prompt")
    top, low = max(values), min(values)
    if top >= vocab_size:
        raise ValidationError(f"the prompt has token id {top}, past the vocabulary ({vocab_size})")
    if low < 0:
        raise ValidationError(f"the prompt has a negative token id {low}")


def check_device(device: Any) -> str:
    """A torch device this machine has: ``cpu``, ``cuda[:i]`` with CUDA and that many GPUs, ``mps`` on Apple."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValidationError(f"unknown device {device!r} (expected cpu, cuda, cuda:N or mps)") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = "torch was built without CUDA" if torch.version.cuda is None else "no GPU is visible"
            raise ValidationError(f"device {device!r}: CUDA is not available here ({why}); use --device cpu")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise ValidationError(f"device {device!r}: this machine has {count} CUDA device(s)")
    elif dev.type == "mps":
        if not torch.backends.mps.is_available():
            raise ValidationError(f"device {device!r}: MPS is not available here; use --device cpu")
    elif dev.type != "cpu":
        raise ValidationError(f"unsupported device {device!r} (expected cpu, cuda, cuda:N or mps)")
    return str(dev)


def check_output_path(path: str | Path, flag: str = "--out") -> Path:
    """An output file that can be written: not a directory, in an existing directory, writable (probed by
    creating and removing a temporary file beside it, which also catches read-only filesystems)."""
    out = Path(path)
    if str(path) == "" or out.is_dir():
        raise ValidationError(f"{flag} {str(path)!r} is a directory; give a file path")
    parent = out.parent
    if not parent.exists():
        raise ValidationError(f"{flag} {out}: directory {parent} does not exist")
    if not parent.is_dir():
        raise ValidationError(f"{flag} {out}: {parent} is not a directory")
    if out.exists() and not os.access(out, os.W_OK):
        raise ValidationError(f"{flag} {out}: the file is not writable")
    try:
        fd, probe = tempfile.mkstemp(dir=parent, prefix=f".{out.name}.", suffix=".probe")
    except OSError as exc:
        raise ValidationError(f"{flag} {out}: cannot write in {parent} ({exc.strerror})") from None
    os.close(fd)
    os.unlink(probe)
    return out


def check_figure_path(path: str | Path, flag: str = "--out") -> Path:
    """An output path for a figure: writable (:func:`check_output_path`) with a suffix matplotlib can write."""
    out = check_output_path(path, flag)
    from matplotlib.figure import Figure

    formats = Figure().canvas.get_supported_filetypes()
    if out.suffix.lstrip(".").lower() not in formats:
        raise ValidationError(
            f"{flag} {out}: cannot write a figure as {out.suffix or 'a file without suffix'!r}; use one of "
            + ", ".join("." + f for f in sorted(formats))
        )
    return out


def _new_file_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


@contextmanager
def atomic_output(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` (same suffix, so format-by-suffix writers work) that replaces ``path``
    when the block ends without an exception; on an exception the temporary file is removed, ``path`` untouched."""
    out = Path(path)
    fd, name = tempfile.mkstemp(dir=out.parent, prefix=f".{out.stem}.", suffix=f".tmp{out.suffix}")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, out.stat().st_mode & 0o777 if out.exists() else _new_file_mode())
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file renamed over it."""
    with atomic_output(path) as tmp:
        tmp.write_text(text)
    return Path(path)
