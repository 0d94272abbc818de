"""The training loop end to end on a tiny model (fp32, CPU): the LR schedule, the loss falls, the first batches are
pinned, a killed run resumes into exactly the run it would have been, and the export loads as a model that decodes.

The tokenizer is the shipped model's (no tokenizer training here); the model is 2 layers of width 32."""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from specfold.api import generate, load_model
from specfold.model.embedded import EMBEDDED_DIR
from specfold.train import trainer
from specfold.train.trainer import TrainConfig, lr_at, train, training_logits

STEPS, KILL_AT = 24, 12


class Killed(Exception):
    """Raised from the progress callback: the process dies between two steps."""


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(out: Path, **kw) -> TrainConfig:
    cfg = TrainConfig(out_dir=str(out), tokenizer_dir=str(EMBEDDED_DIR), steps=STEPS, batch_size=4, lr=3e-3,
                      min_lr=3e-4, warmup=4, max_len=64, block_size=16, hidden_size=32, num_layers=2, num_heads=2,
                      num_kv_heads=1, intermediate_size=64, checkpoint_every=8, bf16=False, seed=3)
    return replace(cfg, **kw)


def run(cfg: TrainConfig, kill_at: int | None = None):
    """Train; return (result or None if killed, {step: loss} seen by the progress callback)."""
    seen: dict[int, float] = {}

    def progress(step: int, loss: float) -> None:
        seen[step] = loss
        if step == kill_at:
            raise Killed

    if kill_at is None:
        return train(cfg, progress), seen
    with pytest.raises(Killed):
        train(cfg, progress)
    return None, seen


def batch_digest(tokens: list[torch.Tensor]) -> str:
    """sha256 over the token rows (noisy copies and clean copy) the first steps feed the model."""
    h = hashlib.sha256()
    for t in tokens:
        h.update(str(list(t.shape)).encode() + t.to(torch.int64).numpy().tobytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The uninterrupted run, and the token rows of each step (recorded on their way into the model)."""
    out = tmp_path_factory.mktemp("full")
    fed: list[torch.Tensor] = []

    def recording(net, tokens, *args):
        fed.append(tokens.clone())
        return training_logits(net, tokens, *args)

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(trainer, "training_logits", recording)
            result, seen = run(tiny(out))
    finally:
        torch.set_num_threads(before)
    return out, result, seen, fed


def test_lr_schedule_warms_up_then_follows_the_cosine():
    cfg = tiny(Path("-"), steps=104, warmup=4, lr=1e-3, min_lr=1e-4)
    assert [lr_at(cfg, s) for s in range(4)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])
    assert lr_at(cfg, 4) == pytest.approx(1e-3)  # progress 0: the peak
    assert lr_at(cfg, 54) == pytest.approx(1e-4 + 0.5 * 9e-4)  # half way: the midpoint of the cosine
    assert lr_at(cfg, 104) == pytest.approx(1e-4) and lr_at(cfg, 500) == pytest.approx(1e-4)
    timed = replace(cfg, max_minutes=10.0)  # the time budget: whichever of steps and time runs out first
    assert lr_at(timed, 10, seconds=300.0) == pytest.approx(1e-4 + 0.5 * 9e-4)
    assert lr_at(timed, 54, seconds=1.0) == pytest.approx(lr_at(cfg, 54))


def test_loss_falls_and_every_step_is_logged(uninterrupted):
    out, result, seen, _ = uninterrupted
    assert sorted(seen) == list(range(1, STEPS + 1)) and result.steps == STEPS
    losses = [seen[s] for s in range(1, STEPS + 1)]
    assert all(math.isfinite(v) for v in losses)
    first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
    assert first > math.log(1024) - 1.0  # starts near uniform over the 1024-token vocabulary
    assert last < first - 0.5, (first, last)  # measured: 6.85 -> 5.65; with the LR at 0, 6.94 -> 6.91
    assert result.final_loss == pytest.approx(sum(losses) / len(losses))  # fewer than 50 steps: all of them
    log = [json.loads(line) for line in (out / "loss.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(1, STEPS + 1))
    assert [r["loss"] for r in log] == losses
    assert [r["lr"] for r in log] == [lr_at(tiny(out), s) for s in range(STEPS)]


# The first three steps' batches of the tiny run (seed 3), computed in another process: a change to the data stream
# (train split, tokenisation, pooling and sorting, the shuffle, the masks) shows here. Re-derive with batch_digest.
FIRST_BATCHES = "ab0246adddce941a2aa7550cb2c4f0ae4bb3ab67bb600136f1f5033ef481d863"


def test_first_batches_are_pinned(uninterrupted):
    fed = uninterrupted[3]
    assert len(fed) == STEPS and fed[0].shape[0] == 4  # one forward per step, batch_size rows
    assert batch_digest(fed[:3]) == FIRST_BATCHES


def test_export_loads_and_decodes(uninterrupted):
    out, result, _, _ = uninterrupted
    assert result.export_dir == out / "model"
    model = load_model(result.export_dir)
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.block_size) == (32, 2, 2, 1, 16)
    assert result.parameters == sum(p.numel() for p in model.net.parameters())
    state = torch.load(out / "state.pt", weights_only=False)
    assert state["step"] == STEPS
    for name, p in model.net.state_dict().items():  # the export is the final weights, stored in bf16
        torch.testing.assert_close(p, state["model"][name].to(torch.bfloat16).float(), rtol=0, atol=0)
    res = generate(model, "What is 3 + 4?", max_new_tokens=16)
    assert res.generated_tokens == 16 and isinstance(res.text, str)


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """A run killed at step KILL_AT, then started again with the same config (it resumes from its checkpoint)."""
    out = tmp_path_factory.mktemp("killed")
    cfg = tiny(out)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _, before_kill = run(cfg, kill_at=KILL_AT)
        saved = torch.load(out / "state.pt", weights_only=False)["step"]
        result, after = run(cfg)
    finally:
        torch.set_num_threads(before)
    return out, before_kill, saved, result, after


def test_killed_run_resumes_into_the_same_run(uninterrupted, resumed):
    _, full, full_seen, _ = uninterrupted
    out, before_kill, saved, result, after = resumed
    assert before_kill == {s: full_seen[s] for s in range(1, KILL_AT + 1)}  # same run up to the kill
    assert 0 < saved <= KILL_AT  # something to resume from
    assert sorted(after) == list(range(saved + 1, STEPS + 1))
    # fp32 on one thread: the resumed steps are the uninterrupted run's, bit for bit (data, masks, LR, AdamW state)
    assert after == {s: full_seen[s] for s in after}
    assert result.steps == STEPS
    want = torch.load(Path(full.export_dir).parent / "state.pt", weights_only=False)["model"]
    got = torch.load(out / "state.pt", weights_only=False)["model"]
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)


def _log(path: Path) -> list[tuple[int, float, float]]:
    return [(r["step"], r["loss"], r["lr"]) for r in map(json.loads, path.read_text().splitlines())]


def test_resumed_log_equals_the_uninterrupted_log(uninterrupted, resumed):
    assert _log(resumed[0] / "loss.jsonl") == _log(uninterrupted[0] / "loss.jsonl")


def test_resumed_run_reports_the_uninterrupted_final_loss(uninterrupted, resumed):
    assert resumed[3].final_loss == pytest.approx(uninterrupted[1].final_loss, rel=1e-12)


# An interrupt (Ctrl-C raised from the progress callback, or a SIGTERM the process sends itself) at a step inside a
# pool of BUCKET = 8 batches: the run saves after that step and stops; started again it continues with exactly the
# steps the uninterrupted run took next.
@pytest.mark.parametrize(("how", "at"), [("KeyboardInterrupt", 11), ("SIGTERM", 5)])
def test_interrupted_run_saves_and_resumes_without_a_lost_or_repeated_step(uninterrupted, tmp_path, how, at):
    _, full, full_seen, _ = uninterrupted
    cfg = tiny(tmp_path)
    before: dict[int, float] = {}

    def interrupt(step: int, loss: float) -> None:
        before[step] = loss
        if step == at and how == "SIGTERM":
            os.kill(os.getpid(), signal.SIGTERM)  # handled after this step: the loop saves, then stops
        elif step == at:
            raise KeyboardInterrupt

    handler = signal.getsignal(signal.SIGTERM)
    with pytest.raises(trainer.TrainingInterrupted) as stop:
        train(cfg, interrupt)
    assert str(stop.value) == f"{how} after step {at} of {STEPS}: state saved to {tmp_path / 'state.pt'}"
    assert signal.getsignal(signal.SIGTERM) == handler  # the training-time handlers are gone again
    assert before == {s: full_seen[s] for s in range(1, at + 1)}
    assert torch.load(tmp_path / "state.pt", weights_only=False)["step"] == at
    assert [s for s, _, _ in _log(tmp_path / "loss.jsonl")] == list(range(1, at + 1))
    result, after = run(cfg)
    assert after == {s: full_seen[s] for s in range(at + 1, STEPS + 1)}  # bit for bit, every remaining step
    assert _log(tmp_path / "loss.jsonl") == _log(Path(full.export_dir).parent / "loss.jsonl")
    assert result.steps == STEPS and result.final_loss == pytest.approx(full.final_loss, rel=1e-12)


class FakeTime:
    """``trainer.time`` with a clock that moves only when the test says so (10 s per step below)."""

    now = 0.0

    @classmethod
    def perf_counter(cls) -> float:
        return cls.now


def test_time_budget_counts_from_step_zero_and_state_is_saved_on_time(tmp_path, monkeypatch):
    monkeypatch.setattr(trainer, "time", FakeTime)
    FakeTime.now = 0.0
    saves: list[int] = []
    real_save = trainer._save_state
    monkeypatch.setattr(trainer, "_save_state", lambda path, net, opt, step, *a: (saves.append(step),
                                                                                  real_save(path, net, opt, step, *a)))

    def ten_seconds_a_step(step: int, loss: float) -> None:
        FakeTime.now += 10.0

    # warm-up 100 steps, budget 45 s: the budget ends the run at step 5 (it was ignored in warm-up before)
    cfg = tiny(tmp_path / "budget", warmup=100, max_minutes=0.75, checkpoint_every=1000, checkpoint_minutes=0.25)
    result = train(cfg, ten_seconds_a_step)
    assert result.steps == 5 and result.seconds == 50.0
    # a save after the first step, then whenever 15 s passed since the last one (steps end at 0, 10, 20, ... s),
    # and at the end with the time spent (50 s: the budget spans resumes)
    assert saves == [1, 3, 5, 5]
    assert torch.load(tmp_path / "budget" / "state.pt", weights_only=False)["seconds"] == 50.0
    assert [s for s, _, _ in _log(tmp_path / "budget" / "loss.jsonl")] == [1, 2, 3, 4, 5]
    # the budget spans resumes: a rerun of the finished run takes no step and keeps the log
    FakeTime.now = 1000.0
    again = train(cfg, ten_seconds_a_step)
    assert again.steps == 5 and again.final_loss == result.final_loss
    assert [s for s, _, _ in _log(tmp_path / "budget" / "loss.jsonl")] == [1, 2, 3, 4, 5]
