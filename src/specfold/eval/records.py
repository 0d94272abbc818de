"""The JSONL records files of ``specfold eval`` / ``sweep``: read (corrupt lines counted, never skipped without a
word), checked before anything in them changes, and written by one process at a time.

A records file holds one JSON object per line (those eval writes have at least ``task``, ``method`` and
``sample_id``). The last line may be *torn* (a run killed mid-write: no newline at its end); every other line that
is not a JSON object is *corrupt*.

* :func:`scan_records` reads a file and says which lines were corrupt and whether the tail was torn;
  :func:`read_records` is its records only (readers report ``scan.corrupt`` themselves: ``merge``, ``plot``).
* :class:`RecordsWriter` opens an output for appending: it takes an advisory lock (``fcntl.flock``) so that a
  second writer on the same file is refused with one line, checks that the file holds records only *before*
  anything in it changes (a text file, a binary file or another JSONL file is left byte-identical), and only then
  cuts a torn tail so that the next record starts on a line of its own.

    >>> with RecordsWriter(Path("runs/eval.jsonl")) as w:
    ...     done = w.existing  # the records already there
    ...     w.append({"task": "synth-math", "method": "vanilla", "sample_id": "0", ...})
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specfold.validation import ValidationError

__all__ = ["RecordsScan", "RecordsWriter", "check_records_output", "read_records", "repair_tail", "scan_records"]

RECORD_FIELDS = ("task", "method", "sample_id")  # what makes a JSON line a record


def _is_record(item: Any) -> bool:
    """A JSON object: what a reader takes (an output to append to must hold eval records: :data:`RECORD_FIELDS`)."""
    return isinstance(item, dict)


@dataclass
class RecordsScan:
    records: list[dict[str, Any]] = field(default_factory=list)
    corrupt: list[int] = field(default_factory=list)  # 1-based numbers of complete lines that are not records
    torn: bool = False  # the last line has no newline and is not a record (a run killed mid-write)
    tail: bytes = b""  # that torn fragment
    unterminated: bool = False  # the last line is a whole record without its newline

    def describe(self, path: Path | str) -> str | None:
        """One line about what was skipped (None when nothing was)."""
        parts = []
        if self.corrupt:
            shown = ", ".join(map(str, self.corrupt[:5])) + (", ..." if len(self.corrupt) > 5 else "")
            parts.append(f"{len(self.corrupt)} corrupt line(s) skipped (line {shown})")
        if self.torn:
            parts.append("a torn last line skipped (a run killed mid-write)")
        return f"{path}: " + "; ".join(parts) if parts else None


def _scan_bytes(data: bytes, path: Path | str) -> RecordsScan:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValidationError(f"{path} is not a records file: byte {exc.start} is not UTF-8 text") from None
    scan = RecordsScan()
    lines = text.split("\n")
    last = lines.pop()  # "" when the file ends with a newline
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            item = None
        if _is_record(item):
            scan.records.append(item)
        else:
            scan.corrupt.append(n)
    if last.strip():
        try:
            item = json.loads(last)
        except json.JSONDecodeError:
            item = None
        if _is_record(item):  # a whole record whose newline was not written yet
            scan.records.append(item)
            scan.unterminated = True
        else:
            scan.torn, scan.tail = True, last.encode("utf-8")
    return scan


def scan_records(path: Path | str) -> RecordsScan:
    """The records of ``path`` (none when it does not exist), with its corrupt line numbers and torn tail."""
    path = Path(path)
    if not path.is_file():
        return RecordsScan()
    return _scan_bytes(path.read_bytes(), path)


def read_records(path: Path | str) -> list[dict[str, Any]]:
    """The records of ``path``; corrupt lines and a torn tail are left out (see :func:`scan_records` to count them)."""
    return scan_records(path).records


def repair_tail(path: Path) -> None:
    """Cut a torn last line (a run killed mid-write) so that appended records start on a line of their own;
    without this the first new record would be glued to the fragment and lost on the next read. Call it only on
    a file known to hold records (:class:`RecordsWriter` checks first)."""
    if not path.is_file():
        return
    with open(path, "rb+") as f:
        _cut_tail(f)


def _cut_tail(f) -> None:
    f.seek(0, os.SEEK_END)
    size = f.tell()
    if size == 0:
        return
    f.seek(size - 1)
    if f.read(1) == b"\n":
        return
    f.seek(0)
    data = f.read()
    f.truncate(data.rfind(b"\n") + 1)
    f.seek(0, os.SEEK_END)


def _check_output(scan: RecordsScan, path: Path, flag: str) -> None:
    """ValidationError unless ``scan`` is of a file eval may append to: eval records only, and at most a torn
    fragment of one at its end."""
    if scan.corrupt:
        raise ValidationError(
            f"{flag} {path} is not a records file (line {scan.corrupt[0]} is not an eval record); "
            "nothing was changed: choose another file"
        )
    foreign = next((i for i, r in enumerate(scan.records, 1) if not all(k in r for k in RECORD_FIELDS)), None)
    if foreign is not None:
        raise ValidationError(
            f"{flag} {path} is not an eval records file (its JSON object {foreign} has no "
            f"{'/'.join(RECORD_FIELDS)}); nothing was changed: choose another file"
        )
    if scan.torn and not scan.tail.lstrip().startswith(b"{"):
        what = "its last line is not an eval record"
        raise ValidationError(f"{flag} {path} is not a records file ({what}); nothing was changed")


def check_records_output(path: Path | str, flag: str = "--out") -> None:
    """Before any work: ValidationError unless ``path`` is missing or holds eval records only (nothing is changed)."""
    path = Path(path)
    if path.is_file():
        _check_output(_scan_bytes(path.read_bytes(), path), path, flag)


class RecordsWriter:
    """An output records file held for appending (a context manager; the lock lasts until :meth:`close`).

    Opening it (:meth:`open`) locks the file, refuses a file that holds anything but records (left byte-identical),
    starts it afresh when ``overwrite`` (still refusing a file that is not a records file), and cuts a torn tail.
    ``existing`` are the records already there."""

    def __init__(self, path: Path, overwrite: bool = False, flag: str = "--out") -> None:
        self.path, self.overwrite, self.flag = Path(path), overwrite, flag
        self.existing: list[dict[str, Any]] = []
        self._f = None

    def open(self) -> RecordsWriter:
        f = open(self.path, "ab+")  # creates a missing file; changes nothing in an existing one
        try:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ValidationError(
                    f"{self.flag} {self.path} is being written by another eval or sweep (it holds the file's lock); "
                    "wait for it to finish or choose another file"
                ) from None
            f.seek(0)
            scan = _scan_bytes(f.read(), self.path)
            _check_output(scan, self.path, self.flag)
            if self.overwrite:
                f.truncate(0)
                scan = RecordsScan()
            elif scan.unterminated:
                f.write(b"\n")  # a whole record whose newline was not written: kept
            elif scan.torn:
                _cut_tail(f)
            f.seek(0, os.SEEK_END)
        except BaseException:
            f.close()
            raise
        self._f, self.existing = f, scan.records
        return self

    def append(self, record: dict[str, Any]) -> None:
        """Write one record as one line and flush it (a kill after this loses nothing)."""
        assert self._f is not None, "RecordsWriter.append before open"
        self._f.write((json.dumps(record) + "\n").encode("utf-8"))
        self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()  # releases the lock
            self._f = None

    def __enter__(self) -> RecordsWriter:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()
