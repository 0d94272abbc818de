"""``specfold generate``: decode one prompt."""

from __future__ import annotations

import argparse
import json
import sys

from specfold.cli.common import (
    UsageError,
    add_decode_args,
    add_method_args,
    add_model_args,
    id_list,
    load_from_args,
    method_kwargs,
    positive_int,
)
from specfold.model.transformer import DEFAULT_PREFILL_CHUNK


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "generate",
        help="decode one prompt",
        description="Decode one prompt block by block and report NFE and tokens/s.",
    )
    p.add_argument("prompt", nargs="?", help="text prompt (sent through the model's chat template)")
    p.add_argument(
        "--prompt-ids", type=id_list, default=None, help="comma-separated token ids instead of text, or @FILE of ids"
    )
    p.add_argument("--no-chat", action="store_true", help="do not apply the chat template to a text prompt")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    add_model_args(p)
    add_decode_args(p)
    p.add_argument(
        "--prefill-chunk",
        type=positive_int,
        default=None,
        help=f"prompt rows per prefill forward (default {DEFAULT_PREFILL_CHUNK}; Fast-dLLM-v2 rounds it down to "
        "whole blocks); memory grows with it, the result does not change",
    )
    add_method_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specfold.api import generate

    if (args.prompt is None) == (args.prompt_ids is None):
        raise UsageError("give exactly one of PROMPT or --prompt-ids")
    model = load_from_args(args)
    prompt = args.prompt if args.prompt is not None else args.prompt_ids
    result = generate(
        model,
        prompt,
        max_new_tokens=args.max_new_tokens,
        threshold=args.threshold,
        block_size=args.block_size,
        small_block_size=args.small_block_size,
        method=args.method,
        chat=not args.no_chat,
        prefill_chunk=args.prefill_chunk,
        **method_kwargs(args),
    )
    if args.json:
        out = result.to_dict()
        out.update(method=args.method, model=str(model.path))
        if args.method != "vanilla":
            out["accepted_per_step"] = result.accepted_drafts / max(1, result.nfe_denoise)
        if args.method == "specfold":
            from specfold.engine.base import fold_ratio

            out["fold_ratio"] = fold_ratio(result.engine_stats)
            out["ffn_fold_ratio"] = fold_ratio(result.engine_stats, "ffn")
        print(json.dumps(out))
    else:
        print(result.text if result.text is not None else " ".join(map(str, result.token_ids)))
        print(
            f"[{result.generated_tokens} tokens, NFE {result.nfe} ({result.nfe_denoise} denoise + {result.nfe_cache} "
            f"cache), {result.tokens_per_forward:.2f} tokens/forward, {result.tokens_per_second:.1f} tokens/s]",
            file=sys.stderr,
        )
    return 0
