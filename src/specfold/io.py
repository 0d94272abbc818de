"""Output files: checked writable before any work, written whole or not at all.

Outputs are checked writable before a run starts (:func:`check_output_path`, :func:`check_figure_path`) and
written through a temporary file renamed over the target (:func:`atomic_output`, :func:`atomic_write_text`), so an
interrupted run never leaves half a file. A bad path raises :class:`~specfold.validation.ValidationError` naming
the flag it came from. This module is at the bottom of the package: it imports nothing of specfold but the
validation error.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from specfold.validation import ValidationError

__all__ = ["atomic_output", "atomic_outputs", "atomic_write_text", "check_figure_path", "check_output_path"]


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
    from matplotlib.figure import Figure  # lazy: matplotlib is an optional dependency

    formats = Figure().canvas.get_supported_filetypes()
    if out.suffix.lstrip(".").lower() not in formats:
        raise ValidationError(
            f"{flag} {out}: cannot write a figure as {out.suffix or 'a file without suffix'!r}; use one of "
            + ", ".join("." + f for f in sorted(formats))
        )
    return out


def _new_file_mode() -> int:
    """The mode ``open()`` would give a new file under the current umask (mkstemp's files are 0o600)."""
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


@contextmanager
def atomic_outputs(*paths: str | Path) -> Iterator[list[Path]]:
    """:func:`atomic_output` for files that belong together (a graph and its counts and paths): one temporary
    path per target; only when the block ends without an exception and every file is written are they renamed
    over their targets, in the order given (put the file that names the others last). On an exception — a full
    disk, a read-only directory — every temporary file is removed and no target changes."""
    outs = [Path(p) for p in paths]
    tmps: list[Path] = []
    try:
        for out in outs:
            fd, name = tempfile.mkstemp(dir=out.parent, prefix=f".{out.stem}.", suffix=f".tmp{out.suffix}")
            os.close(fd)
            tmps.append(Path(name))
        yield list(tmps)
        for tmp, out in zip(tmps, outs, strict=True):
            os.chmod(tmp, out.stat().st_mode & 0o777 if out.exists() else _new_file_mode())
        for tmp, out in zip(tmps, outs, strict=True):  # renames only: nothing left to run out of space
            os.replace(tmp, out)
    except BaseException:
        for tmp in tmps:
            tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file renamed over it."""
    with atomic_output(path) as tmp:
        tmp.write_text(text)
    return Path(path)
