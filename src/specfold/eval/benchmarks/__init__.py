"""The paper's real benchmarks as loaders and exact scorers (no model calls).

Benchmarks: ``gsm8k``, ``math500``, ``math`` (full MATH), ``humaneval``, ``mbpp``, ``ifeval``. Each sample
is a :class:`BenchSample` (``task, sample_id, prompt, meta, reference``) — the same shape as the synthetic
suite's ``Sample`` — whose ``prompt`` is the zero-shot user message; the caller applies the model's
chat template. Data come from the original release files under ``data_dir/<benchmark>/`` (see each
module), else from the Hugging Face hub when ``datasets`` is importable, else a ``FileNotFoundError``
names the expected path. Nothing is read at import time.

    >>> from pathlib import Path
    >>> samples = load_benchmark("gsm8k", Path("/data"), limit=5)
    >>> score_benchmark(samples[0], samples[0].reference)
    True

Splits: gsm8k test/train; math500 test; math test/train; humaneval test; mbpp test/train/validation/prompt
(and ``sanitized-<split>``); ifeval test.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

from specfold.eval.benchmarks import code, gsm8k, ifeval
from specfold.eval.benchmarks import math as math_bench
from specfold.eval.benchmarks._common import BenchSample

BENCHMARKS: tuple[str, ...] = ("gsm8k", "math500", "math", "humaneval", "mbpp", "ifeval")

_LOADERS: dict[str, Callable[[Path | None, str, int | None], list[BenchSample]]] = {
    "gsm8k": gsm8k.load,
    "math500": math_bench.load_math500,
    "math": math_bench.load_math,
    "humaneval": code.load_humaneval,
    "mbpp": code.load_mbpp,
    "ifeval": ifeval.load,
}
_SCORERS: dict[str, Callable[[dict, str], bool]] = {
    "gsm8k": gsm8k.score,
    "math500": math_bench.score,
    "math": math_bench.score,
    "humaneval": code.score_humaneval,
    "mbpp": code.score_mbpp,
    "ifeval": ifeval.score,
}


def _check_name(name: str) -> None:
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; expected one of {BENCHMARKS}")


def load_benchmark(
    name: str, data_dir: Path | str | None, split: str = "test", limit: int | None = None
) -> list[BenchSample]:
    """Samples of one benchmark split in the release's order; ``limit`` takes a prefix."""
    _check_name(name)
    return _LOADERS[name](Path(data_dir) if data_dir is not None else None, split, limit)


def score_benchmark(sample: BenchSample, response: str) -> bool:
    """Exact score of ``response`` (the generated assistant text, without the stop token)."""
    _check_name(sample.task)
    return bool(_SCORERS[sample.task](sample.meta, response))


def calibration_prompts(
    data_dir: Path | str | None, n_mbpp: int = 25, n_math: int = 25, seed: int = 0
) -> list[BenchSample]:
    """Calibration prompts for real models: ``n_mbpp`` MBPP-train then ``n_math`` MATH-train samples.

    Drawn without replacement by ``random.Random(seed)`` from each train split (disjoint from every test
    split), so the same arguments always give the same list.
    """
    rng = random.Random(seed)
    mbpp_train = load_benchmark("mbpp", data_dir, "train")
    math_train = load_benchmark("math", data_dir, "train")
    if n_mbpp > len(mbpp_train) or n_math > len(math_train):
        raise ValueError(
            f"asked for {n_mbpp} MBPP / {n_math} MATH prompts; train has {len(mbpp_train)} / {len(math_train)}"
        )
    return rng.sample(mbpp_train, n_mbpp) + rng.sample(math_train, n_math)


__all__ = [
    "BENCHMARKS",
    "BenchSample",
    "calibration_prompts",
    "load_benchmark",
    "score_benchmark",
]
