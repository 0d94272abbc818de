"""``specfold init-random``: a random-weight checkpoint in a family's real format."""

from __future__ import annotations

import argparse

from specfold.cli.common import (
    positive_int,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "init-random",
        help="write a random-weight checkpoint in a family's real format",
        description="Write config.json + model.safetensors with random weights (for tests and demos).",
    )
    p.add_argument("out", help="output directory")
    from specfold.model.families import FAMILIES

    p.add_argument("--family", choices=sorted(FAMILIES), default="fast_dllm_v2")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab-size", type=positive_int, default=301)
    p.add_argument("--hidden-size", type=positive_int, default=96)
    p.add_argument("--heads", type=positive_int, default=6)
    p.add_argument("--kv-heads", type=positive_int, default=2)
    p.add_argument("--layers", type=positive_int, default=2)
    p.add_argument("--intermediate-size", type=positive_int, default=160)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specfold.model.random_checkpoint import write_random_checkpoint

    out = write_random_checkpoint(
        args.out,
        args.family,
        seed=args.seed,
        vocab_size=args.vocab_size,
        hidden_size=args.hidden_size,
        num_heads=args.heads,
        num_kv_heads=args.kv_heads,
        num_layers=args.layers,
        intermediate_size=args.intermediate_size,
        mask_token_id=args.vocab_size - 1,
        eos_token_id=args.vocab_size - 2,
    )
    print(
        f"wrote a RANDOM-WEIGHT {args.family} checkpoint to {out} (mask id {args.vocab_size - 1}, "
        f"stop id {args.vocab_size - 2}); its output is noise"
    )
    return 0
