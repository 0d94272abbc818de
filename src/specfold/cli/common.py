"""What the ``specfold`` commands share: argument types, option groups, the parser class, model loading and the
progress bar."""

from __future__ import annotations

import argparse
import enum
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from specfold.config import (
    METHOD_OPTIONS,
    AttentionMode,
    Backend,
    FfnReuse,
    MethodConfig,
    MethodName,
    check_delta,
    check_method_options,
)
from specfold.model.loading import AUTO_DTYPE, DTYPES
from specfold.validation import ValidationError


class UsageError(ValueError):
    """Bad command-line input, reported as one line."""


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage dump): ``specfold: error: ...``, exit status 2."""

    def error(self, message: str):  # type: ignore[override]
        print(f"{self.prog}: error: {message} (see --help)", file=sys.stderr)
        raise SystemExit(2)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value}")
    return value


def delta_type(text: str) -> float:
    """δ: a finite number in [0, 1] (:func:`specfold.config.check_delta`)."""
    try:
        return check_delta(text.strip() if text.strip() else text)
    except ValidationError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def delta_list(text: str) -> list[float]:
    values = [delta_type(t) for t in text.split(",") if t.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated deltas in [0, 1], got {text!r}")
    return values


def threshold_type(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}") from None
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"threshold must be in (0, 1], got {value}")
    return value


def small_block_type(text: str) -> int | None | str:
    if text in ("auto", "none"):
        return None if text == "none" else "auto"
    return positive_int(text)


def id_list(text: str) -> list[int]:
    """``1,2,3``, or ``@FILE`` with ids separated by commas or whitespace (long prompts outgrow one argument)."""
    if text.startswith("@"):
        try:
            text = Path(text[1:]).read_text()
        except OSError as exc:
            raise argparse.ArgumentTypeError(f"cannot read token ids from {text[1:]!r}: {exc.strerror}") from None
        text = ",".join(text.split())
    try:
        ids = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated token ids, got {text[:80]!r}") from None
    if not ids:
        raise argparse.ArgumentTypeError("--prompt-ids is empty")
    if min(ids) < 0:
        raise argparse.ArgumentTypeError("token ids must be non-negative")
    return ids


def int_list(text: str) -> list[int]:
    values = [positive_int(t.strip()) for t in text.split(",") if t.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return values


def float_list(text: str) -> list[float]:
    return [non_negative_float(t) for t in text.split(",") if t.strip()]


def number_list(text: str) -> list[float]:
    try:
        return [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def choices(kind: type[enum.StrEnum]) -> list[str]:
    """The values of an option's enum, as argparse ``choices`` (its message then quotes them as plain strings)."""
    return [m.value for m in kind]


def method_list(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in choices(MethodName)]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown method(s) {bad or text!r}; choose from {', '.join(MethodName)}")
    return names


def task_mix(text: str) -> dict[str, int]:
    """``synth-math=3,synth-if=2`` -> ``{"synth-math": 3, "synth-if": 2}`` (task names checked against the suite)."""
    from specfold.eval.tasks.synthetic import TASKS

    out: dict[str, int] = {}
    for part in text.split(","):
        name, sep, count = part.partition("=")
        name = name.strip()
        if not sep or name not in TASKS or not count.strip().isdigit():
            raise argparse.ArgumentTypeError(f"expected TASK=N with TASK in {', '.join(TASKS)}, got {part!r}")
        out[name] = int(count)
    if not any(out.values()):
        raise argparse.ArgumentTypeError(f"the mix {text!r} leaves out every task")
    return out


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument(
        "--model", default=None, help="checkpoint directory or Hugging Face id (default: the embedded model)"
    )
    g.add_argument("--dtype", default="fp32", choices=DTYPE_CHOICES,
                   help="weights and activations; auto = bf16 on a CPU with native bf16 matrix units (AMX, "
                   "AVX-512 BF16) or a GPU, fp32 elsewhere (default fp32)")
    g.add_argument("--device", default="cpu", help="torch device (default cpu)")
    g.add_argument("--mask-id", type=int, default=None, help="override the mask token id")
    g.add_argument("--eos-id", type=int, default=None, help="override the stop token id")


DTYPE_CHOICES = [*DTYPES, AUTO_DTYPE]


def resolve_dtype(args: argparse.Namespace, device: str = "cpu") -> str:
    """``args.dtype`` with ``auto`` decided (:func:`specfold.model.loading.auto_dtype`) and the choice and its reason
    said in one line on stderr; ``args.dtype`` is replaced by the choice."""
    if args.dtype == AUTO_DTYPE:
        from specfold.model.loading import auto_dtype

        args.dtype, why = auto_dtype(getattr(args, "device", device))
        print(f"specfold: --dtype auto chose {args.dtype}: {why}", file=sys.stderr)
    return args.dtype


def choose_compile(args: argparse.Namespace, planned_tokens: int) -> bool:
    """``--compile`` / ``--no-compile`` as given; left unset, on when the run plans enough tokens to repay the
    compile (:func:`specfold.config.compile_pays`), the choice and its reason said in one line on stderr.
    ``args.compile`` is replaced by the choice."""
    if args.compile is None:
        from specfold.config import COMPILE_MIN_TOKENS, compile_pays

        args.compile = compile_pays(planned_tokens)
        if args.compile:
            print(f"specfold: compiling the dense forwards: the run plans {planned_tokens} tokens (>= "
                  f"{COMPILE_MIN_TOKENS}; --no-compile to run eager)", file=sys.stderr)
    return args.compile


def add_decode_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("decoding")
    g.add_argument("--max-new-tokens", type=positive_int, default=256, help="generation budget (default 256)")
    g.add_argument(
        "--threshold",
        type=threshold_type,
        default=0.9,
        help="unmask every eligible position with confidence > threshold, plus the most confident (0.9)",
    )
    g.add_argument("--block-size", type=positive_int, default=None, help="block length (default: the model's bd_size)")
    g.add_argument(
        "--small-block-size",
        type=small_block_type,
        default="auto",
        help="eligible window inside a block: N, 'none', or 'auto' (8 for Fast-dLLM-v2, none for NLD)",
    )


def add_quota_args(p: argparse.ArgumentParser) -> None:
    """``--steps`` / ``--strategy``: a quota rule's passes per block and strategy (SDAR; refused for families whose
    rule has no quota)."""
    from specfold.config import QUOTA_STRATEGIES

    g = p.add_argument_group("quota rule (SDAR)")
    g.add_argument("--steps", type=positive_int, default=None,
                   help="denoising passes per block (default: the block size)")
    g.add_argument("--strategy", choices=list(QUOTA_STRATEGIES), default=None,
                   help="low_confidence_dynamic (default: all above --threshold when at least the step's quota are, "
                   "else the quota most confident) or low_confidence_static (always the quota most confident)")


def add_cache_arg(p: argparse.ArgumentParser) -> None:
    """``--cache``: Fast-dLLM v1's cache for the fully bidirectional families (LLaDA, Dream; refused for the others,
    whose finished blocks are cached as they go)."""
    from specfold.config import CACHE_MODES

    p.add_argument("--cache", choices=list(CACHE_MODES), default=None,
                   help="LLaDA / Dream: 'none' = every pass a forward of the whole sequence (LLaDA's own generate() "
                   "with --steps), 'prefix' = the block and the masked suffix over the prefix's K/V, 'dual' = the "
                   "block over the prefix's and the suffix's K/V (default; both refilled by a full forward at each "
                   "block); there --steps counts the passes of the whole generation, as their references do")


# The method options as the CLI spells them (the MethodConfig field names are the keys), and their help.
METHOD_FLAGS = {
    "graph": "--graph",
    "budget": "--budget",
    "depth": "--depth",
    "lookahead": "--no-lookahead",
    "delta": "--delta",
    "backend": "--backend",
    "ffn": "--ffn-reuse",
    "attention": "--attention",
    "compile": "--compile",
}
METHOD_HELP = {
    "graph": "draft graph JSON (default: the one shipped beside the model)",
    "budget": "draft budget B (default 7)",
    "depth": "cap on the draft graph depth",
    "lookahead": "spiffy/specfold without boundary drafts (on by default for the Fast-dLLM-v2 family: the forward "
    "that writes a finished block to the cache also runs the next block's first state from a guessed seed, saving "
    "that block's first pass when the guess is right; lossless)",
    "delta": "specfold recompute threshold on the relative residual, in [0, 1] (default 0.1)",
    "backend": "specfold engine backend (torch)",
    "ffn": "specfold FFN reuse: 'residual' gates the FFN on its own input (exact at delta 0, default); 'paper' "
    "reuses it on the layer's folded set as the paper does (not exact at delta 0)",
    "compile": "run the dense forwards (vanilla, spiffy, specfold's dense passes) under torch.compile with dynamic "
    "shapes; --no-compile: eager (default: eval, sweep and bench batch compile when the run plans enough tokens to "
    "repay the compile, specfold.config.compile_pays; everything else runs eager, as compiling costs tens of seconds "
    "per process on a CPU; the compile seconds and graphs are reported in the statistics)",
    "attention": "specfold folded-row attention: 'auto' = per layer the cheaper of the two by the engine's cost rule "
    "(default); 'correct' = Eq. 8 from the source's softmax state; 'direct' = every row over its branch's own K/V in "
    "one batched call (same result)",
}
_CHOICES = {"backend": Backend, "ffn": FfnReuse, "attention": AttentionMode}


def add_method_args(
    p: argparse.ArgumentParser,
    select: str | None = "method",
    options: Iterable[str] = tuple(METHOD_FLAGS),
    help: Mapping[str, str] | None = None,
) -> None:
    """The method options of a command: ``select`` ``"method"`` (one, ``--method``), ``"methods"`` (a comma-separated
    ``--methods`` list, each specfold run at every δ of a comma-separated ``--delta``) or None (the command picks its
    methods); ``options``: which of :data:`METHOD_FLAGS` it takes; ``help``: texts replacing :data:`METHOD_HELP`'s.

    Every default is None (= not given), so that an option given for a method it does not apply to is refused
    (:func:`method_config`) while its default never is; :class:`~specfold.config.MethodConfig` fills defaults in."""
    helps = {**METHOD_HELP, **(help or {})}
    g = p.add_argument_group("speculation (spiffy, specfold)")
    if select == "methods":
        g.add_argument("--methods", default=[MethodName.VANILLA.value], type=method_list,
                       help=f"comma-separated: {', '.join(MethodName)} (default vanilla)")
    elif select == "method":
        g.add_argument("--method", default=MethodName.VANILLA.value, choices=choices(MethodName),
                       help="vanilla; spiffy = drafts + dense verification; specfold = drafts + folded verification")
    for option in (*options, *(() if "compile" in options else ("compile",))):  # every command takes --compile
        flag = METHOD_FLAGS[option]
        if option == "compile":
            g.add_argument(flag, dest="compile", action=argparse.BooleanOptionalAction, default=None,
                           help=helps[option])
        elif option in _CHOICES:
            g.add_argument(flag, choices=choices(_CHOICES[option]), default=None, help=helps[option])
        elif option == "lookahead":
            g.add_argument(flag, dest="lookahead", action="store_false", default=None, help=helps[option])
        elif option == "delta" and select == "methods":
            g.add_argument(flag, type=delta_list, default=None,
                           help="specfold recompute threshold(s) on the relative residual, in [0, 1], "
                           "comma-separated (0.1)")
        elif option == "delta":
            g.add_argument(flag, type=delta_type, default=None, help=helps[option])
        elif option in ("budget", "depth"):
            g.add_argument(flag, type=positive_int, default=None, help=helps[option])
        else:
            g.add_argument(flag, default=None, help=helps[option])


def given_method_options(args: argparse.Namespace) -> dict[str, Any]:
    """The method options given on the command line (None = left at the default), by MethodConfig field name."""
    return {name: getattr(args, "ffn_reuse" if name == "ffn" else name, None) for name in METHOD_FLAGS}


def method_config(args: argparse.Namespace, method: str | None = None, **values: Any) -> MethodConfig:
    """``method`` (default ``--method``) as a MethodConfig with the options given on the command line that apply to
    it; ``values`` replace parsed ones (one δ of a ``--delta`` list). An option that none of the command's methods
    (``--method``, or every method of ``--methods``) uses is refused, naming the flag."""
    method = method or args.method
    selected, selector = (
        (args.methods, "--methods ") if hasattr(args, "methods")
        else ([args.method], "--method ") if hasattr(args, "method") else ([method], "")
    )
    given = given_method_options(args)
    check_method_options(selected, given, METHOD_FLAGS, selector)
    given.update(values)
    name = MethodName(method)
    return MethodConfig(name, **{k: v for k, v in given.items() if v is not None and name in METHOD_OPTIONS[k]})


def check_outputs(*paths: tuple[str, str | Path | None]) -> None:
    """``(flag, path)`` pairs of output files, checked writable before any work (a None path is skipped)."""
    from specfold.io import check_output_path

    for flag, path in paths:
        if path is not None:
            check_output_path(path, flag)


def check_figure_out(path: str | Path, flag: str = "--out") -> None:
    """A figure file: writable, and a suffix matplotlib writes (.png, .svg, .pdf, ...), checked before any work."""
    from specfold.io import check_figure_path

    check_figure_path(path, flag)


def add_overwrite_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="start --out afresh instead of resuming (needed when it holds records made with other settings)",
    )


def add_batch_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--batch-size",
        type=positive_int,
        default=1,
        help="requests of a method decoded together (continuous batching, every method; default 1)",
    )


def load_from_args(args: argparse.Namespace):
    from specfold.api import load_model
    from specfold.validation import check_device

    check_device(args.device)
    dtype = resolve_dtype(args)
    return load_model(args.model, dtype=dtype, device=args.device, mask_id=args.mask_id, eos_id=args.eos_id)


def progress_bar(total: int, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, dynamic_ncols=True, file=sys.stderr, disable=None)


def evalplus_samples(tasks, split: str, data_dir) -> dict:
    """Sample id -> sample of the HumanEval records (their prompt makes a self-contained solution)."""
    from specfold.eval.harness import load_task

    if "humaneval" not in tasks:
        return {}
    return {s.sample_id: s for s in load_task("humaneval", split, None, data_dir).samples}
