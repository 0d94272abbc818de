"""A folded-verification input shared by the engine tests: a prefix cache and ``K`` branch states of a small
random checkpoint, drafted along :data:`PARENTS` (a chain of depth 4 plus side branches, and one draft identical to
its parent so that every layer folds with Δ = ∅)."""

from __future__ import annotations

from pathlib import Path

import torch

from specfold.model.cache import PrefixCache
from specfold.model.loading import load_checkpoint
from specfold.model.transformer import DLLM

PARENTS = torch.tensor([-1, 0, 1, 2, 3, 0, 5, 1])  # [K] a chain of depth 4 plus side branches
N, PROMPT = 32, 13  # block length, prompt length


def branch_pass(ckpt: Path, dtype: torch.dtype, seed: int = 0) -> tuple[DLLM, PrefixCache, torch.Tensor]:
    """The model, a cache holding a random ``PROMPT``-token prefix, and the branch states ``[K, N]``: row 0 has 10
    decoded positions, each draft is its parent with two more (or re-guessed) positions."""
    _, cfg, net = load_checkpoint(ckpt, dtype=dtype)
    gen = torch.Generator().manual_seed(seed)
    cache = net.new_cache(64)
    net(torch.randint(0, 299, (PROMPT,), generator=gen)[None], cache, mask="causal", write_cache=True)
    mask_id = cfg.mask_token_id
    states = torch.full((len(PARENTS), N), mask_id, dtype=torch.long)
    states[0, :10] = torch.randint(0, 299, (10,), generator=gen)
    for i in range(1, len(PARENTS)):  # each draft = parent + two more (or re-guessed) positions
        states[i] = states[PARENTS[i]]
        pos = torch.randint(8, N, (2,), generator=gen)
        states[i, pos] = torch.randint(0, 299, (2,), generator=gen)
    states[6] = states[5]  # a draft identical to its parent: every layer folds with Δ = ∅
    return net, cache, states
