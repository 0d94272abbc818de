"""One validation layer for the options and arguments of the CLI, the Python API and the server.

Every check raises :class:`ValidationError` (a ``ValueError``) with one line naming the problem, and none of them
does any work besides looking: the CLI calls them before loading a model, the API before decoding. Output files
are checked and written by :mod:`specfold.io`; a draft graph checks itself (:meth:`DraftGraph.check
<specfold.decoding.draft_graph.DraftGraph.check>`). This module is at the bottom of the package: it imports nothing
of specfold.

    >>> check_delta(1.5)
    Traceback (most recent call last):
    ValidationError: delta must be a finite number in [0, 1], got 1.5
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "METHOD_OPTIONS",
    "ValidationError",
    "check_delta",
    "check_device",
    "check_method_options",
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
