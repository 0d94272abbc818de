"""``specfold.timing``: warm-up rounds stay untimed, candidates run interleaved, and a figure is the median of
its repeats with the max − min spread. A fake clock makes every duration known."""

from __future__ import annotations

import pytest

from specfold import timing


class FakeClock:
    """Advances by the duration the running candidate has declared."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_interleaved_runs_warmup_untimed_then_candidates_in_turn(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(timing, "clock", clock)
    calls: list[str] = []
    durations = {"a": iter([9.0, 1.0, 3.0, 2.0]), "b": iter([9.0, 5.0, 4.0, 9.0])}  # first of each: the warm-up

    def candidate(name: str):
        def run() -> None:
            calls.append(name)
            clock.now += next(durations[name])
        return run

    out = timing.interleaved({"a": candidate("a"), "b": candidate("b")}, repeats=3, warmup=1)
    assert calls == ["a", "b"] * 4
    assert out["a"].values == (1.0, 3.0, 2.0) and out["b"].values == (5.0, 4.0, 9.0)  # warm-up's 9 s left out
    assert (out["a"].median, out["a"].low, out["a"].high, out["a"].spread) == (2.0, 1.0, 3.0, 2.0)
    assert (out["b"].median, out["b"].spread) == (5.0, 5.0)


def test_timed_returns_the_result_and_the_seconds(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(timing, "clock", clock)

    def work() -> str:
        clock.now += 0.25
        return "done"

    assert timing.timed(work) == ("done", 0.25)
    assert timing.timed_call(work) == 0.25


def test_interleaved_needs_a_repeat():
    with pytest.raises(ValueError, match="repeats must be at least 1"):
        timing.interleaved({"a": lambda: None}, repeats=0)


def test_percentile_interpolates_between_ranks_as_numpy():
    xs = [4.0, 1.0, 3.0, 2.0]
    assert timing.percentile(xs, 0) == 1.0 and timing.percentile(xs, 100) == 4.0
    assert timing.percentile(xs, 50) == 2.5  # the median
    assert timing.percentile(xs, 95) == pytest.approx(3.85)  # 3 + 0.85 · (4 − 3); numpy.percentile agrees
    assert timing.percentile([7.0], 95) == 7.0
    with pytest.raises(ValueError, match="no values"):
        timing.percentile([], 50)
