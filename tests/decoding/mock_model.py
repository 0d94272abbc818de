"""A scripted stand-in for the network: logits engineered from a per-position table, to test decoding control flow.

Position ``p`` (absolute) always predicts token ``target(p)`` with probability ``conf[p]`` (the rest spread
evenly), whatever the state. Rows are laid out like the real families: Fast-dLLM-v2 bidirectional rows are
shifted (row ``i`` predicts position ``i+1``), Nemotron's are not, and a causal / cache-writing forward's last row
predicts the next position (that is what seeds a block).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from specfold.model.cache import PrefixCache
from specfold.model.families import config_from_dict
from specfold.model.loading import LoadedModel
from specfold.model.random_checkpoint import random_config
from specfold.model.transformer import Prefill

V, MASK, STOP = 64, 63, 62


def target(p: int) -> int:
    return 10 + p % 40


class ScriptedNet:
    def __init__(self, family: str, conf: dict[int, float], default_conf: float = 0.3, targets=None) -> None:
        self.cfg = config_from_dict(random_config(family, vocab_size=V))
        self.conf, self.default_conf = conf, default_conf
        self.targets = targets or {}
        self.device = torch.device("cpu")
        self.dtype = torch.float64
        self.calls: list[tuple[str, int, int, bool]] = []  # (mask, start, rows, write)

    def new_cache(self, capacity: int) -> PrefixCache:
        return PrefixCache(1, 1, 2, capacity, torch.float64)

    def design(self, p: int) -> torch.Tensor:
        c = self.conf.get(p, self.default_conf)
        row = torch.full((V,), math.log((1 - c) / (V - 1)) if c < 1 else -1e9, dtype=torch.float64)
        row[self.targets.get(p, target(p))] = math.log(c)
        return row

    def position_logits(self, raw: torch.Tensor) -> torch.Tensor:
        if self.cfg.shifted_logits:
            return torch.cat([raw[:, -1:], raw[:, :-1]], dim=1)
        return raw

    def __call__(
        self, tokens: torch.Tensor, cache: PrefixCache, mask: str = "bidirectional", write_cache=False, logit_rows=None,
        cache_rows=None,
    ):
        b, t = tokens.shape
        start = cache.length
        self.calls.append((mask, start, t, write_cache))
        ahead = 1 if (mask != "bidirectional" or self.cfg.shifted_logits) else 0
        rows = torch.stack([self.design(start + i + ahead) for i in range(t)])
        if write_cache:
            cache.commit(t if cache_rows is None else cache_rows)
        out = rows.expand(b, t, V).clone()
        return out if logit_rows is None else out[:, logit_rows]

    def forward_ragged(
        self, tokens: torch.Tensor, cache, slots: torch.Tensor, lengths: torch.Tensor, mask: str = "bidirectional",
        write_cache=False, logit_rows=None, valid=None,
    ):
        """The batched forward (one branch each, as the decoding core's block commits use it): each request's rows
        from its own cached length, recorded like :meth:`__call__`."""
        rows = []
        for slot, length, toks in zip(slots.tolist(), lengths.tolist(), tokens, strict=True):
            view = cache.slot(slot)
            assert view.length == length
            out = self(toks[None], view, mask=mask, write_cache=False, logit_rows=logit_rows)
            self.calls[-1] = (mask, length, toks.shape[-1], write_cache)  # the caller advances the length
            rows.append(out[0])
        return torch.stack(rows)

    def prefill(self, tokens: torch.Tensor, cache: PrefixCache, mask: str = "causal", chunk=None) -> Prefill:
        """One recorded cache-writing call for the whole prompt (chunking is the real model's business)."""
        return Prefill(self(tokens[None], cache, mask=mask, write_cache=True)[0, -1], 1)


def scripted_model(family: str, conf: dict[int, float], **kw) -> LoadedModel:
    net = ScriptedNet(family, conf, **kw)
    return LoadedModel(net=net, config=net.cfg, tokenizer=None, mask_id=MASK, stop_id=STOP, path=Path("scripted"))
