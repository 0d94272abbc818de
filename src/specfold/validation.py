"""One validation layer for the options and arguments of the CLI, the Python API and the server.

Every check raises :class:`ValidationError` (a ``ValueError``) with one line naming the problem, and none of them
does any work besides looking: the CLI calls them before loading a model, the API before decoding. Output files
are checked and written by :mod:`specfold.io`; a draft graph checks itself (:meth:`DraftGraph.check
<specfold.decoding.draft_graph.DraftGraph.check>`). This module is at the bottom of the package: it imports nothing
of specfold. The method options are checked by :class:`~specfold.config.MethodConfig` (with
:func:`~specfold.config.check_delta` and :func:`~specfold.config.check_method_options`).

    >>> check_token_ids([5, 5000], vocab_size=1024)
    Traceback (most recent call last):
    ValidationError: the prompt has token id 5000, past the vocabulary (1024)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "CHAT_ROLES",
    "ValidationError",
    "check_device",
    "check_messages",
    "check_text",
    "check_token_ids",
]


CHAT_ROLES = ("system", "user", "assistant")  # the roles of a conversation the CLI and the API take


class ValidationError(ValueError):
    """An option or argument outside what it may be; the message is one line."""


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


def check_text(text: Any, what: str = "the prompt") -> str:
    """``text`` as prompt text: a string of Unicode scalar values (no lone surrogate: what an undecodable byte in
    a command-line argument becomes, or a ``"\\ud800"`` JSON escape) holding more than whitespace."""
    if not isinstance(text, str):
        raise ValidationError(f"{what} must be text, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        why = (f"an undecodable byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF
               else f"a lone surrogate U+{code:04X}")
        raise ValidationError(f"{what} is not valid Unicode text: character {exc.start} is {why}") from None
    if not text.strip():
        empty = "empty prompt" if what == "the prompt" else f"{what} is empty"
        raise ValidationError(empty if not text else f"{what} is only whitespace")
    return text


def check_messages(messages: Any, what: str = "messages") -> None:
    """ValidationError unless ``messages`` is a non-empty list of ``{"role", "content"}`` objects, each role one of
    :data:`CHAT_ROLES` and each content prompt text (:func:`~specfold.validation.check_text`)."""
    if not isinstance(messages, list | tuple) or not messages:
        got = "an empty list" if isinstance(messages, list | tuple) else f"a {type(messages).__name__}"
        raise ValidationError(f"{what} must be a non-empty list of {{role, content}} objects, got {got}")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValidationError(
                f"message {i} must be an object with string 'role' and 'content', got {str(m)[:60]}"
            )
        if m["role"] not in CHAT_ROLES:
            raise ValidationError(f"message {i} has role {m['role']!r}; expected one of {', '.join(CHAT_ROLES)}")
        if set(m) - {"role", "content"}:
            raise ValidationError(f"message {i} has unknown field(s) {', '.join(sorted(set(m) - {'role', 'content'}))}")
        check_text(m["content"], f"message {i} content")


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
