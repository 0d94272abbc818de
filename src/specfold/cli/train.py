"""``specfold train``: block-diffusion training of a small DLLM on the synthetic suite."""

from __future__ import annotations

import argparse
import json
import math
import sys

from specfold.cli.common import (
    positive_int,
    task_mix,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train",
        help="train a small Fast-dLLM-v2-family DLLM on the synthetic suite (CPU)",
        description="Block-diffusion training from scratch: block-causal attention across blocks, "
        "masked-token loss inside blocks, complementary masking. Logs OUT/loss.jsonl; exports OUT/model "
        "(config.json, model.safetensors, tokenizer). Saves OUT/state.pt after the first step, every 100 steps, "
        "every --checkpoint-minutes and on Ctrl-C/SIGTERM (after the step in flight); run the same command again "
        "to resume exactly where it stopped.",
    )
    p.add_argument("--out", required=True, help="run directory")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory (default: train one into OUT/tokenizer)")
    p.add_argument("--steps", type=positive_int, default=3000)
    p.add_argument(
        "--max-minutes",
        type=positive_minutes,
        default=None,
        help="wall-clock budget counted from step 0 (warm-up included, across resumes); the LR schedule fits it",
    )
    p.add_argument(
        "--checkpoint-minutes",
        type=positive_minutes,
        default=5.0,
        help="save OUT/state.pt at least this often (default 5)",
    )
    p.add_argument("--batch-size", type=positive_int, default=32)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab-size", type=positive_int, default=1024)
    p.add_argument("--hidden-size", type=positive_int, default=256)
    p.add_argument("--layers", type=positive_int, default=8)
    p.add_argument("--heads", type=positive_int, default=8)
    p.add_argument("--kv-heads", type=positive_int, default=2)
    p.add_argument("--intermediate-size", type=positive_int, default=1024)
    p.add_argument(
        "--init",
        default=None,
        metavar="DIR",
        help="warm start from a checkpoint of the same shape (e.g. the shipped model, "
        "src/specfold/assets/embedded) instead of random weights; ignored when OUT/state.pt exists",
    )
    p.add_argument(
        "--mix",
        type=task_mix,
        default=None,
        metavar="TASK=N,...",
        help="train samples per task in each round, e.g. synth-math=3,synth-if=2,synth-code=1 "
        "(default: one of each)",
    )
    p.add_argument(
        "--causal-copy",
        action="store_true",
        help="add an autoregressive loss: a causal copy of each block predicts every response token from its "
        "full left context (about 1.3x the step time)",
    )
    p.set_defaults(func=run)


def positive_minutes(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of minutes > 0, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a number of minutes > 0, got {value}")
    return value


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tqdm import tqdm

    from specfold.model.loading import resolve_checkpoint
    from specfold.train.tokenizer import train_tokenizer
    from specfold.train.trainer import TrainConfig, TrainingInterrupted, train

    init = str(resolve_checkpoint(args.init)) if args.init else None  # a bad --init fails before any writing
    tok_dir = Path(args.tokenizer) if args.tokenizer else Path(args.out) / "tokenizer"
    if not (tok_dir / "tokenizer.json").is_file():
        print(f"specfold: trained a tokenizer into {train_tokenizer(tok_dir, args.vocab_size, seed=args.seed)}",
              file=sys.stderr)
    cfg = TrainConfig(
        out_dir=args.out,
        tokenizer_dir=str(tok_dir),
        steps=args.steps,
        max_minutes=args.max_minutes,
        checkpoint_minutes=args.checkpoint_minutes,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        hidden_size=args.hidden_size,
        num_layers=args.layers,
        num_heads=args.heads,
        num_kv_heads=args.kv_heads,
        intermediate_size=args.intermediate_size,
        init_from=init,
        mix=args.mix,
        causal_copy=args.causal_copy,
    )
    bar = tqdm(total=args.steps, desc="train", unit="step", dynamic_ncols=True)

    def progress(step: int, loss: float) -> None:
        if bar.n == 0 and step > 1:  # a resumed run: start the count, and the rate, at its first step
            bar.reset()
            bar.initial = bar.n = bar.last_print_n = step - 1
        bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
        bar.update(step - bar.n)

    try:
        result = train(cfg, progress)
    except TrainingInterrupted as stop:
        bar.close()
        print(f"specfold: {stop}; run the same command again to resume", file=sys.stderr)
        return 143 if stop.reason == "SIGTERM" else 130  # 128 + the signal's number, as a shell reports it
    bar.close()
    print(
        json.dumps(
            {
                "steps": result.steps,
                "final_loss": result.final_loss,
                "seconds": round(result.seconds, 1),
                "parameters": result.parameters,
                "model": str(result.export_dir),
            }
        )
    )
    return 0
