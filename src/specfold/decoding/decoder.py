"""Decoding entry points over the one core (:mod:`specfold.decoding.core`): :func:`decode` for one prompt (the core
with one request) and :func:`decode_batch` for many through a continuous batch. Every method — vanilla, spiffy,
specfold — runs through both; nothing here decides anything about a block."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from specfold.config import DecodeConfig
from specfold.decoding.core import BatchMethod, Drafter, GenerationResult, StepObserver, decode_requests
from specfold.engine.base import Verifier
from specfold.model.loading import LoadedModel


def decode(
    model: LoadedModel,
    prompt_ids: list[int] | torch.Tensor,
    cfg: DecodeConfig,
    verifier: Verifier | None = None,
    drafter: Drafter | None = None,
    observer: StepObserver | None = None,
) -> GenerationResult:
    """Decode one prompt. ``drafter=None`` is vanilla decoding; the verifier defaults to dense; ``observer`` sees
    the trajectory (calibration)."""
    return decode_requests(model, [prompt_ids], cfg, BatchMethod(verifier, drafter), 1, [observer])[0]


def decode_batch(
    model: LoadedModel,
    prompts: Sequence[Sequence[int]],
    cfg: DecodeConfig,
    method: Any = None,
    max_batch: int = 8,
) -> list[GenerationResult]:
    """Decode every prompt through a batch of at most ``max_batch`` requests; results in prompt order."""
    return decode_requests(model, prompts, cfg, method, max_batch)
