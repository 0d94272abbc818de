"""Records carry their provenance, and a rerun into the same file resumes only when every setting agrees: each
kind of changed setting is refused with one line naming the field (and the file is left as it was); --overwrite
starts a new file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from specfold.api import load_model
from specfold.cli import main
from specfold.config import MethodConfig
from specfold.decoding.draft_graph import DraftGraph
from specfold.eval.harness import EvalPlan, read_records, run_eval
from specfold.eval.provenance import ProvenanceMismatch, model_hash
from specfold.eval.sweep import run_sweep
from specfold.model.random_checkpoint import write_random_checkpoint

HINT = "pass --overwrite to start a new file, or another --out"


def plan(**changes) -> EvalPlan:
    fields = dict(
        tasks=["synth-math"],
        methods=[MethodConfig("vanilla")],
        limit=2,
        max_new_tokens=8,
        block_size=8,
        threshold=1.0,
    )
    fields.update(changes)
    return EvalPlan(**fields)


@pytest.fixture
def ckpt(text_ckpt: Path, tmp_path: Path) -> Path:
    """A private copy of the text checkpoint (tests below rewrite its weights)."""
    return Path(shutil.copytree(text_ckpt, tmp_path / "ckpt"))


@pytest.fixture
def first(ckpt: Path, tmp_path: Path) -> Path:
    out = tmp_path / "r.jsonl"
    run_eval(load_model(ckpt), plan(), out)
    return out


def refused(model, p: EvalPlan, out: Path, field: str, there: str, now: str) -> None:
    before = out.read_bytes()
    with pytest.raises(ProvenanceMismatch) as info:
        run_eval(model, p, out)
    assert str(info.value) == f"{out} was written with another {field} ({there} there, {now} now); {HINT}"
    assert out.read_bytes() == before  # nothing appended, nothing cut


def test_records_carry_the_provenance(ckpt: Path, first: Path):
    recs = read_records(first)
    assert len(recs) == 2
    prov = recs[0]["provenance"]
    assert prov["model"] == str(ckpt) and prov["model_hash"] == model_hash(ckpt) and len(prov["model_hash"]) == 16
    assert (prov["dtype"], prov["device"], prov["chat"], prov["split"]) == ("float32", "cpu", True, "test")
    assert (prov["max_new_tokens"], prov["threshold"], prov["block_size"]) == (8, 1.0, 8)
    assert prov["sweep"] is None and prov["graph_hash"] is None and len(prov["task_data"]) == 16
    assert recs[0]["provenance"]["task_data"] != recs[1]["provenance"]["task_data"]  # a hash per sample
    from specfold import __version__

    assert prov["specfold"] == __version__


def test_same_settings_resume_without_new_records(ckpt: Path, first: Path):
    lines = first.read_text()
    again = run_eval(load_model(ckpt), plan(limit=3), first)  # a larger limit only adds samples
    assert len(again) == 3 and first.read_text().startswith(lines) and len(read_records(first)) == 3


@pytest.mark.parametrize(
    "changes, field, there, now",
    [
        ({"max_new_tokens": 16}, "max_new_tokens", "8", "16"),
        ({"threshold": 0.9}, "threshold", "1.0", "0.9"),
        ({"block_size": 4}, "block_size", "8", "4"),
        ({"chat": False}, "chat", "True", "False"),
        ({"split": "calib"}, "split", "'test'", "'calib'"),
        ({"batch_size": 2}, "batch_size", "1", "2"),
    ],
)
def test_a_changed_decoding_setting_is_refused(ckpt: Path, first: Path, changes, field, there, now):
    refused(load_model(ckpt), plan(**changes), first, field, there, now)


def test_another_dtype_is_refused(ckpt: Path, first: Path):
    refused(load_model(ckpt, dtype="fp64"), plan(), first, "dtype", "'float32'", "'float64'")


def test_another_model_path_is_refused(ckpt: Path, first: Path, tmp_path: Path):
    other = Path(shutil.copytree(ckpt, tmp_path / "other"))
    refused(load_model(other), plan(), first, "model", repr(str(ckpt)), repr(str(other)))


def test_other_weights_at_the_same_path_are_refused(ckpt: Path, first: Path, tmp_path: Path):
    """Same directory, same config and tensor shapes, other weights: the model hash tells them apart."""
    old = model_hash(ckpt)
    fresh = write_random_checkpoint(tmp_path / "seed9", "fast_dllm_v2", seed=9, mask_token_id=300, eos_token_id=299)
    shutil.copy(Path(fresh) / "model.safetensors", ckpt / "model.safetensors")
    new = model_hash(ckpt)
    assert new != old
    refused(load_model(ckpt), plan(), first, "model_hash", repr(old), repr(new))


def test_another_special_id_is_refused(ckpt: Path, first: Path):
    there = load_model(ckpt).stop_id  # the checkpoint's own stop id, the one the records were written with
    assert there != 298
    refused(load_model(ckpt, eos_id=298), plan(), first, "stop_id", str(there), "298")


def test_a_recalibrated_graph_under_the_same_name_is_refused(ckpt: Path, tmp_path: Path):
    graph = tmp_path / "g.json"
    DraftGraph.from_strings(["(1,1)", "(1,1)+(2,1)"]).to_json(graph)
    out = tmp_path / "g.jsonl"
    p = plan(methods=[MethodConfig("spiffy", graph=str(graph))], limit=1)
    model = load_model(ckpt)
    run_eval(model, p, out)
    DraftGraph.from_strings(["(1,1)", "(2,1)"]).to_json(graph)  # same file, same budget, other nodes
    before = out.read_bytes()
    with pytest.raises(ProvenanceMismatch, match=r"was written with another graph_hash \(draft graph of spiffy"):
        run_eval(model, p, out)
    assert out.read_bytes() == before


def test_changed_task_data_is_refused(ckpt: Path, tmp_path: Path):
    data = tmp_path / "data" / "gsm8k"
    data.mkdir(parents=True)
    row = {"question": "Tom has 3 apples and buys 4 more. How many apples?", "answer": "3 + 4 = 7\n#### 7"}
    (data / "test.jsonl").write_text(json.dumps(row) + "\n")
    p = plan(tasks=["gsm8k"], data_dir=tmp_path / "data", limit=1)
    out = tmp_path / "d.jsonl"
    model = load_model(ckpt)
    run_eval(model, p, out)
    row["question"] = "Tom has 5 apples and buys 4 more. How many apples?"  # same sample id, another question
    (data / "test.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(ProvenanceMismatch, match=r"another task_data \(task data of vanilla on gsm8k/test/00000"):
        run_eval(model, p, out)


def test_a_sweeps_fixed_delta_is_refused(ckpt: Path, tmp_path: Path):
    out = tmp_path / "s.jsonl"
    model = load_model(ckpt)
    opts = dict(limit=1, max_new_tokens=8, block_size=16, threshold=1.0)
    run_sweep(model, "budget", ["synth-math"], [2], out, delta=0.1, **opts)
    before = out.read_bytes()
    with pytest.raises(ProvenanceMismatch) as info:
        run_sweep(model, "budget", ["synth-math"], [2], out, delta=0.2, **opts)
    assert str(info.value) == f"{out} was written with another sweep_delta (0.1 there, 0.2 now); {HINT}"
    with pytest.raises(ProvenanceMismatch, match=r"another sweep \('budget' there, 'depth' now\)"):
        run_sweep(model, "depth", ["synth-math"], [1], out, budget=2, **opts)
    assert out.read_bytes() == before


def test_records_without_provenance_are_refused(ckpt: Path, first: Path):
    recs = read_records(first)
    for r in recs:
        del r["provenance"]
    first.write_text("".join(json.dumps(r) + "\n" for r in recs))
    with pytest.raises(ProvenanceMismatch) as info:
        run_eval(load_model(ckpt), plan(), first)
    assert str(info.value) == f"{first} holds records without provenance (an older specfold wrote them); {HINT}"


def test_overwrite_starts_a_new_file(ckpt: Path, first: Path):
    model = load_model(ckpt)
    new = run_eval(model, plan(max_new_tokens=16), first, overwrite=True)
    on_disk = read_records(first)
    assert len(on_disk) == 2 and [r["provenance"]["max_new_tokens"] for r in on_disk] == [16, 16]
    assert [r["token_ids"] for r in on_disk] == [r["token_ids"] for r in new]
    text = first.read_text()
    run_eval(model, plan(max_new_tokens=16), first)  # and it resumes like any file
    assert first.read_text() == text


def test_cli_refuses_then_overwrites(capsys, ckpt: Path, tmp_path: Path):
    out = tmp_path / "cli.jsonl"
    argv = ["eval", "--model", str(ckpt), "--tasks", "synth-math", "--limit", "2", "--max-new-tokens", "8",
            "--block-size", "8", "--out", str(out)]
    assert main(argv) == 0
    before = out.read_bytes()
    capsys.readouterr()
    assert main([*argv, "--no-chat"]) == 2
    err = capsys.readouterr().err
    assert err == f"specfold: error: {out} was written with another chat (True there, False now); {HINT}\n"
    assert out.read_bytes() == before
    assert main([*argv, "--no-chat", "--overwrite"]) == 0
    assert [r["provenance"]["chat"] for r in read_records(out)] == [False, False]
