"""Where the embedded model lives: package data under ``specfold/assets/embedded``."""

from __future__ import annotations

from pathlib import Path

from specfold.config import CheckpointError

EMBEDDED_DIR = Path(__file__).resolve().parent.parent / "assets" / "embedded"


def embedded_model_dir() -> Path:
    if not (EMBEDDED_DIR / "config.json").is_file():
        raise CheckpointError(
            "no embedded model is installed with this copy of specfold; pass --model PATH "
            "(or create a random-weight one with `specfold init-random DIR`)"
        )
    return EMBEDDED_DIR
