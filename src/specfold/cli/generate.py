"""``specfold generate``: decode one prompt or several (text, a conversation, or token ids)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specfold.cli.common import (
    UsageError,
    add_cache_arg,
    add_decode_args,
    add_method_args,
    add_model_args,
    add_quota_args,
    id_list,
    load_from_args,
    method_config,
    positive_int,
)
from specfold.model.transformer import DEFAULT_PREFILL_CHUNK
from specfold.validation import check_messages, check_text


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "generate",
        help="decode one prompt or several",
        description="Decode prompts block by block and report NFE and tokens/s. Several prompts (positional and/or "
        "--prompts-file) are decoded together by specfold.generate and printed in order.",
    )
    p.add_argument("prompt", nargs="*", help="text prompt(s), each sent through the model's chat template")
    p.add_argument(
        "--prompts-file",
        metavar="FILE",
        default=None,
        help="more prompts, after the positional ones: one per line, or (FILE ending in .jsonl) one JSON string, "
        '{"prompt": TEXT} or {"messages": [...]} per line',
    )
    p.add_argument(
        "--prompt-ids", type=id_list, default=None, help="comma-separated token ids instead of text, or @FILE of ids"
    )
    p.add_argument(
        "--system", metavar="TEXT", default=None, help="a system message before each text prompt (chat template)"
    )
    p.add_argument(
        "--messages",
        metavar="FILE",
        default=None,
        help='a JSON list of {"role": system|user|assistant, "content": TEXT}: one conversation, answered as the '
        "assistant's next turn",
    )
    p.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="STR",
        help="cut the text just before the first occurrence of STR (repeatable: the earliest of them wins)",
    )
    p.add_argument("--no-chat", action="store_true", help="do not apply the chat template to a text prompt")
    p.add_argument("--json", action="store_true", help="print one JSON object per prompt (one per line)")
    add_model_args(p)
    add_decode_args(p)
    add_quota_args(p)
    add_cache_arg(p)
    p.add_argument(
        "--prefill-chunk",
        type=positive_int,
        default=None,
        help=f"prompt rows per prefill forward (default {DEFAULT_PREFILL_CHUNK}; Fast-dLLM-v2 rounds it down to "
        "whole blocks); memory grows with it, the result does not change",
    )
    add_method_args(p)
    p.set_defaults(func=run)


Conversation = list[dict]  # [{"role", "content"}, ...], checked by specfold.api.encode_messages


def _read_json(path: str, what: str):
    try:
        return json.loads(_read_text(path, what))
    except json.JSONDecodeError as exc:
        raise UsageError(f"{what} {path!r} is not JSON: {exc.msg} (line {exc.lineno})") from None


def _read_text(path: str, what: str) -> str:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path!r}: {exc.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise UsageError(f"{what} {path!r} line {line} is not UTF-8 text (byte 0x{data[exc.start]:02x})") from None


def _checked(item, where: str) -> str | Conversation:
    """A prompt (text) or a conversation (a message list), each checked (``where`` names it in the error)."""
    try:
        if isinstance(item, list):
            check_messages(item, where)
        else:
            check_text(item, where)
    except ValueError as exc:
        raise UsageError(str(exc) if str(exc).startswith(where) else f"{where}: {exc}") from None
    return item


def read_prompts_file(path: str) -> list[str | Conversation]:
    """Text prompts (one per non-blank line), or from a ``.jsonl`` file strings and conversations; each prompt
    Unicode text with more than whitespace, each conversation a valid message list."""
    lines = _read_text(path, "--prompts-file").splitlines()
    if not path.endswith(".jsonl"):
        return [_checked(line, f"{path} line {n}") for n, line in enumerate(lines, 1) if line.strip()]
    out: list[str | Conversation] = []
    shapes = 'expected a JSON string, {"prompt": TEXT} or {"messages": [...]}'
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{path} line {n} is not JSON: {exc.msg}") from None
        if isinstance(item, dict) and set(item) == {"prompt"} and isinstance(item["prompt"], str):
            item = item["prompt"]
        elif isinstance(item, dict) and set(item) == {"messages"} and isinstance(item["messages"], list):
            item = item["messages"]
        elif not isinstance(item, str):
            raise UsageError(f"{path} line {n}: {shapes}, got {line.strip()[:60]}")
        out.append(_checked(item, f"{path} line {n}"))
    return out


def gather_prompts(args: argparse.Namespace) -> list[str | Conversation | list[int]]:
    """Every prompt the options name, in order: positional, then --prompts-file, then --messages (or the ids)."""
    prompts: list[str | Conversation | list[int]] = [_checked(p, "the prompt") for p in args.prompt]
    if args.system is not None:
        _checked(args.system, "--system")
    if args.prompts_file is not None:
        prompts += read_prompts_file(args.prompts_file)
    if args.messages is not None:
        conversation = _read_json(args.messages, "--messages")
        if not isinstance(conversation, list):
            raise UsageError(
                f"--messages {args.messages!r} must hold a JSON list of {{role, content}} objects, got a "
                f"{'JSON string' if isinstance(conversation, str) else type(conversation).__name__}"
            )
        prompts.append(_checked(conversation, f"--messages {args.messages}"))
    if args.prompt_ids is not None:
        if prompts:
            raise UsageError("give either --prompt-ids or text prompts (PROMPT, --prompts-file, --messages)")
        if args.system is not None:
            raise UsageError("--system applies to text prompts, not --prompt-ids")
        return [args.prompt_ids]
    if not prompts:
        raise UsageError("give a PROMPT, --prompts-file, --messages or --prompt-ids")
    conversations = any(isinstance(p, list) for p in prompts)
    if args.no_chat and (args.system is not None or conversations):
        raise UsageError("--system and message lists go through the chat template; drop --no-chat")
    if args.system is not None and conversations:
        raise UsageError("--system applies to text prompts; put the system message in the message list")
    return prompts


def run(args: argparse.Namespace) -> int:
    from specfold.api import encode_messages, generate, truncate_at_stop

    prompts = gather_prompts(args)
    if any(not s for s in args.stop):
        raise UsageError("--stop needs a non-empty string")
    method = method_config(args)
    model = load_from_args(args)
    if args.stop and model.tokenizer is None:
        raise UsageError(f"--stop cuts text, and {model.path} has no tokenizer")
    ids_or_text = [
        p if args.prompt_ids is not None
        else encode_messages(model, p) if isinstance(p, list)
        else encode_messages(model, [{"role": "system", "content": args.system}, {"role": "user", "content": p}])
        if args.system is not None
        else p
        for p in prompts
    ]
    out = generate(
        model,
        ids_or_text if len(ids_or_text) > 1 else ids_or_text[0],
        max_new_tokens=args.max_new_tokens,
        threshold=args.threshold,
        block_size=args.block_size,
        small_block_size=args.small_block_size,
        method=method,
        chat=not args.no_chat,
        prefill_chunk=args.prefill_chunk,
        steps=args.steps,
        strategy=args.strategy,
        cache=args.cache,
    )
    results = out if isinstance(out, list) else [out]
    for i, result in enumerate(results):
        text, stop_string = result.text, None
        if args.stop and text is not None:
            text, stop_string = truncate_at_stop(text, args.stop)
        if args.json:
            rec = result.to_dict()
            rec.update(index=i, text=text, method=args.method, model=str(model.path))
            if args.stop:
                rec["stop_string"] = stop_string
            if args.method != "vanilla":
                rec["accepted_per_step"] = result.accepted_drafts / max(1, result.nfe_denoise)
            if args.method == "specfold":
                rec["fold_ratio"] = result.engine_stats.fold_ratio()
                rec["ffn_fold_ratio"] = result.engine_stats.fold_ratio("ffn")
                if result.engine_stats.block_draft_triples:  # a window's block rows and the rows around it
                    rec["fold_ratio_block"], rec["fold_ratio_context"] = result.engine_stats.window_fold_ratios()
            print(json.dumps(rec))
            continue
        if len(results) > 1:
            print(f"=== {i + 1}/{len(results)} ===")
        print(text if text is not None else " ".join(map(str, result.token_ids)))
        print(
            f"[{result.generated_tokens} tokens, NFE {result.nfe} ({result.nfe_denoise} denoise + {result.nfe_cache} "
            f"cache), {result.tokens_per_forward:.2f} tokens/forward, {result.tokens_per_second:.1f} tokens/s]",
            file=sys.stderr,
        )
    return 0
