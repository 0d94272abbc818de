"""``specfold analyze residuals``: the relative residual heatmap (paper Fig. 6)."""

from __future__ import annotations

import argparse
import json

from specfold.cli.common import (
    Parser,
    UsageError,
    add_model_args,
    check_figure_out,
    id_list,
    load_from_args,
    positive_int,
    small_block_type,
    threshold_type,
)

DEFAULT_RESIDUAL_PROMPT = "What is 3 + 4?"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "analyze",
        help="analyses (analyze residuals)",
        description="Analyses; `specfold analyze residuals` draws the relative residual of a draft (paper Fig. 6).",
    )
    analyze_sub = p.add_subparsers(dest="analysis", required=True, metavar="ANALYSIS", parser_class=Parser)
    p = analyze_sub.add_parser(
        "residuals",
        help="heatmap of the relative residual rho over layers x positions (paper Fig. 6)",
        description="Decode a prompt vanilla to a block state with masks left, make a child that differs by the "
        "rule's most confident new token, run one folded pass at delta 0 on [parent, child] and draw rho (Eq. 4) "
        "of the child at every layer input and block position (log colour scale; positions marked committed / "
        "masked / newly unmasked).",
    )
    p.add_argument("--prompt", default=None, help=f"text prompt (default {DEFAULT_RESIDUAL_PROMPT!r})")
    p.add_argument("--prompt-ids", type=id_list, default=None, help="comma-separated token ids instead of text")
    p.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    p.add_argument("--out", required=True, help="figure file (.png, .svg, .pdf)")
    p.add_argument("--step", type=int, default=None, help="rule steps before the parent (default: about half masked)")
    p.add_argument("--min-masks", type=positive_int, default=4, help="masks the parent must keep (default 4)")
    p.add_argument("--json", action="store_true", help="print rho, labels and the states as one JSON object")
    add_model_args(p)
    g = p.add_argument_group("decoding")
    g.add_argument("--threshold", type=threshold_type, default=0.9, help="unmasking threshold (0.9)")
    g.add_argument("--block-size", type=positive_int, default=None, help="block length (default: the model's)")
    g.add_argument("--small-block-size", type=small_block_type, default="auto", help="N, 'none' or 'auto'")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from specfold.api import decode_config_for, encode_prompt
    from specfold.eval.residuals import plot_residual_map, residual_map

    if args.prompt is not None and args.prompt_ids is not None:
        raise UsageError("give at most one of --prompt or --prompt-ids")
    check_figure_out(args.out)
    model = load_from_args(args)
    if args.prompt_ids is not None:
        ids = args.prompt_ids
    else:
        ids = encode_prompt(model, args.prompt or DEFAULT_RESIDUAL_PROMPT, chat=not args.no_chat)
    cfg = decode_config_for(
        model, args.block_size or model.config.block_size, args.threshold, args.block_size, args.small_block_size
    )
    rmap = residual_map(model, ids, cfg, step=args.step, min_masks=args.min_masks)
    out = plot_residual_map(rmap, Path(args.out))
    if args.json:
        print(json.dumps({"figure": str(out), **rmap.to_dict()}))
    else:
        print(
            f"wrote {out}: rho over {len(rmap.rho)} layers x {len(rmap.labels)} positions, new token "
            f"{rmap.new_token} at position {rmap.new_position} (parent after {rmap.step} rule steps)"
        )
    return 0
