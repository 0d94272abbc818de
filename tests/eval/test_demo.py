"""The demo's measurement rule (repeat until the tokens/s medians settle) and its conclusions, on scripted records:
every figure a sentence states is the records' own."""

from __future__ import annotations

import pytest

from specfold.cli.demo import conclusions
from specfold.config import MethodConfig
from specfold.eval import demo
from specfold.eval.demo import Spread, run_demo
from specfold.eval.harness import EvalPlan


def records(seconds: dict[str, float], spiffy_tokens: list[int] | None = None) -> list[dict]:
    """One task, two samples, vanilla and spiffy; 10 tokens per sample, ``seconds[label]`` per sample."""
    out = []
    for i in range(2):
        for label, nfe, passes in (("vanilla", 4, 4), ("spiffy", 2, 2)):
            tokens = [1, 2, 3] if label == "vanilla" or spiffy_tokens is None else spiffy_tokens
            out.append({"task": "synth-math", "sample_id": f"synth-math/test/{i}", "method": label, "label": label,
                        "correct": i == 0, "nfe": nfe, "nfe_denoise": passes, "generated_tokens": 10,
                        "seconds": seconds[label], "accepted_drafts": 1, "token_ids": tokens, "text": "x"})
    return out


PLAN = EvalPlan(tasks=["synth-math"], methods=[MethodConfig("vanilla"), MethodConfig("spiffy")])


def scripted(monkeypatch, runs: list[dict[str, float]], spiffy_tokens=None) -> list[int]:
    calls: list[int] = []

    def fake_run_eval(model, plan, out, progress):
        calls.append(len(calls))
        return records(runs[len(calls) - 1], spiffy_tokens)

    monkeypatch.setattr(demo, "run_eval", fake_run_eval)
    return calls


def test_repeats_stop_once_the_medians_settle(monkeypatch):
    # vanilla tokens/s per repeat: 10, 5, 10, 10.2 -> medians 10, 7.5, 10, 10.1: settled after the fourth
    runs = [{"vanilla": s, "spiffy": 0.5} for s in (1.0, 2.0, 1.0, 1 / 1.02, 9.0)]
    calls = scripted(monkeypatch, runs)
    result = run_demo(None, PLAN, min_repeats=3, max_repeats=5, tolerance=0.05)
    assert len(calls) == result.repeats == 4 and result.settled
    t = result.timing["synth-math", "vanilla"]
    assert t.values == pytest.approx((10.0, 5.0, 10.0, 10.2)) and t.median == pytest.approx(10.0)
    assert (t.low, t.high) == pytest.approx((5.0, 10.2)) and t.relative == pytest.approx(0.52)
    assert result.summary["synth-math"]["vanilla"]["tokens_per_second"] == pytest.approx(10.0)
    assert result.summary["synth-math"]["spiffy"]["tps_vs_vanilla"] == pytest.approx(2.0)


def test_repeats_end_at_the_maximum_unsettled(monkeypatch):
    runs = [{"vanilla": s, "spiffy": 0.5} for s in (1.0, 2.0, 4.0)]
    scripted(monkeypatch, runs)
    result = run_demo(None, PLAN, min_repeats=2, max_repeats=3)
    assert result.repeats == 3 and not result.settled
    with pytest.raises(ValueError, match=r"repeats must satisfy 1 <= min \(4\) <= max \(3\)"):
        run_demo(None, PLAN, min_repeats=4, max_repeats=3)


def test_conclusions_state_the_runs_numbers(monkeypatch):
    # spiffy: half the passes, each 4x as long as vanilla's (2 s over 2 forwards vs 1 s over 4) -> 0.5x the speed
    scripted(monkeypatch, [{"vanilla": 1.0, "spiffy": 2.0}] * 3)
    result = run_demo(None, PLAN, min_repeats=3, max_repeats=3)
    assert result.methods["spiffy"].seconds_per_pass == pytest.approx(4 * result.methods["vanilla"].seconds_per_pass)
    assert conclusions(result) == [
        "Accuracy over 2 problems: vanilla 50.0%, spiffy 50.0%.",
        "spiffy gave vanilla's tokens on 2/2 problems (lossless); it needed 0.50× vanilla's forward passes (0.50 "
        "drafts accepted per pass), each pass took 4.00× as long as a vanilla pass (it verifies every draft branch "
        "together), so it ran at 0.50× vanilla's tokens/s.",
        "Why slower: here a pass costs in proportion to the rows it computes (a CPU is compute-bound), so verifying "
        "many branches at once costs more than the passes it saves; on a GPU a wider pass costs little more than a "
        "narrow one, and fewer passes mean more speed.",
        "Noise: over 3 repeats a row's tokens/s spanned up to 0% of its median (min 10.0, max 10.0).",
    ]


def test_conclusions_flag_a_spiffy_that_is_not_lossless_and_skip_why_slower_when_faster(monkeypatch):
    scripted(monkeypatch, [{"vanilla": 1.0, "spiffy": 0.25}, {"vanilla": 1.0, "spiffy": 0.5}], spiffy_tokens=[9])
    result = run_demo(None, PLAN, min_repeats=1, max_repeats=2)
    lines = conclusions(result)
    assert lines[1].startswith("spiffy gave vanilla's tokens on 0/2 problems -- spiffy must be lossless: this is a "
                               "bug, please report it; it needed 0.50× vanilla's forward passes")
    assert lines[1].endswith("so it ran at 3.00× vanilla's tokens/s.")  # median of 40 and 20 tokens/s vs 10
    assert not any(line.startswith("Why slower") for line in lines)
    assert lines[-1] == ("Noise: over 2 repeats a row's tokens/s spanned up to 67% of its median (min 20.0, max "
                         "40.0); the medians had not settled, so rerun on a quieter machine. Speed ratios closer to 1 "
                         "than that are noise.")


def test_spread():
    s = Spread((3.0, 1.0, 2.0))
    assert (s.median, s.low, s.high, s.relative) == (2.0, 1.0, 3.0, 1.0)
