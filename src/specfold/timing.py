"""Timing for the benchmarks (``specfold bench``) and ``scripts/``: warm up, synchronise, interleave, report the
median and the spread.

The rules (STYLE habit 5), kept in one place so that every figure in ``docs/results.md`` is measured alike:

* warm-up calls first (first calls, lazily built kernels and a CPU GEMM library's per-shape setup stay out);
* on CUDA the clock starts and stops with the device idle (kernels are asynchronous);
* the candidates of one comparison run interleaved (A B C A B C …), so background load hits them alike;
* a figure is the median over repeats, reported with its spread (max − min); latencies as percentiles
  (:func:`percentile`, linear interpolation).

    times = interleaved({"dense": run_dense, "folded": run_folded}, repeats=5, device="cuda")
    times["folded"].median / times["dense"].median
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

T = TypeVar("T")
K = TypeVar("K")

# The clock every timing here reads (tests put a fake one in its place).
clock: Callable[[], float] = time.perf_counter


@dataclass(frozen=True)
class Spread:
    """One figure measured over repeats (seconds of a timed candidate, or the demo's tokens/s per repeat)."""

    values: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def low(self) -> float:
        return min(self.values)

    @property
    def high(self) -> float:
        return max(self.values)

    @property
    def spread(self) -> float:
        """max − min over the repeats."""
        return self.high - self.low

    @property
    def relative(self) -> float:
        """(max − min) / median: 0.1 means the repeats spanned 10 % of the median."""
        return self.spread / self.median if self.median else 0.0


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0 ≤ q ≤ 100) of ``values``: linear interpolation between the nearest ranks, as
    numpy's default."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def synchronize(device: str | torch.device) -> None:
    """Wait until ``device`` has finished its queued work (a no-op off CUDA)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], T], device: str | torch.device = "cpu") -> tuple[T, float]:
    """``(fn(), seconds)``, the clock running from an idle device to an idle device."""
    synchronize(device)
    t0 = clock()
    out = fn()
    synchronize(device)
    return out, clock() - t0


def timed_call(fn: Callable[[], object], device: str | torch.device = "cpu") -> float:
    """Seconds of one ``fn()`` (see :func:`timed`)."""
    return timed(fn, device)[1]


def interleaved(
    fns: Mapping[K, Callable[[], object]],
    repeats: int,
    warmup: int = 1,
    device: str | torch.device = "cpu",
) -> dict[K, Spread]:
    """Time every candidate ``repeats`` times, interleaved in the mapping's order, after ``warmup`` untimed rounds of
    each. Returns one :class:`Spread` of seconds per key."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    seconds: dict[K, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            seconds[name].append(timed_call(fn, device))
    return {name: Spread(tuple(s)) for name, s in seconds.items()}
