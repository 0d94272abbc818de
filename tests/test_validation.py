"""The validation layer: every bad input of the list in issue 17 ends in one line naming the problem — from the CLI
(``specfold: error: ...``, exit status 2, no traceback) and from the Python API (a ``ValueError``) — and nothing is
written. Output paths are checked before any work: the CLI cases below pass a checkpoint that does not exist, so a
command that loaded the model first would fail with another message."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch

from specfold.api import generate, load_model, prepare_method
from specfold.cli import main
from specfold.config import MethodConfig
from specfold.decoding.draft_graph import DraftGraph
from specfold.eval.harness import EvalPlan, run_eval
from specfold.eval.plots import plot_sweep
from specfold.io import atomic_output, atomic_write_text, check_output_path
from specfold.model.embedded import embedded_model_dir
from specfold.validation import ValidationError, check_device

EMBEDDED = embedded_model_dir()
SHIPPED_GRAPH = EMBEDDED / "draft_graph.json"
NO_MODEL = "/no/such/checkpoint"  # loading it fails with "no checkpoint directory"
GEN = ["generate", "What is 3 + 4?", "--max-new-tokens", "4"]
EVAL = ["eval", "--tasks", "synth-math", "--limit", "1", "--max-new-tokens", "4"]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory: relative outputs land here, and it must stay empty."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


@pytest.fixture
def unwritable(tmp_path: Path):
    """A directory this process cannot create files in, and the reason the OS gives. Root ignores permission
    bits, so as root it is /sys (sysfs refuses new files); otherwise a directory without write permission."""
    if os.geteuid() == 0:
        if not Path("/sys/kernel").is_dir():
            pytest.skip("no sysfs to stand in for a read-only directory")
        yield Path("/sys"), "Permission denied"
        return
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    yield d, "Permission denied"
    d.chmod(0o700)


@pytest.fixture(scope="module")
def embedded():
    return load_model()


def graph_file(tmp_path: Path, nodes: list[str], **provenance) -> Path:
    path = tmp_path / "graph.json"
    DraftGraph.from_strings(nodes, provenance=provenance).to_json(path)
    return path


def one_line_error(capsys, argv: list[str], message: str) -> None:
    try:
        code = main(argv)
    except SystemExit as stop:  # argparse's own errors (types, choices) exit from parse_args
        code = stop.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert re.match(r"specfold( [a-z-]+)?: error: ", err) and message in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


# ---------------------------------------------------------------------------------------------- generate


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--method", "specfold", "--delta", "1.5"],
         "argument --delta: delta must be a finite number in [0, 1], got 1.5"),
        (["--method", "specfold", "--delta", "nan"],
         "argument --delta: delta must be a finite number in [0, 1], got nan"),
        (["--method", "specfold", "--delta", "-0.1"], "delta must be a finite number in [0, 1], got -0.1"),
        (["--delta", "0.5"], "--delta applies to --method specfold, not vanilla"),
        (["--backend", "triton"], "--backend applies to --method specfold, not vanilla"),
        (["--attention", "direct"], "--attention applies to --method specfold, not vanilla"),
        (["--graph", str(SHIPPED_GRAPH)], "--graph applies to --method spiffy or specfold, not vanilla"),
        (["--no-lookahead"], "--no-lookahead applies to --method spiffy or specfold, not vanilla"),
        (["--method", "specfold", "--backend", "cuda"],
         "argument --backend: invalid choice: 'cuda' (choose from 'torch', 'triton')"),
        (["--method", "beam"],
         "argument --method: invalid choice: 'beam' (choose from 'vanilla', 'spiffy', 'specfold')"),
        (["--method", "spiffy", "--delta", "0.2"], "--delta applies to --method specfold, not spiffy"),
        (["--method", "spiffy", "--ffn-reuse", "paper"], "--ffn-reuse applies to --method specfold, not spiffy"),
        (["--method", "spiffy", "--graph", str(SHIPPED_GRAPH), "--budget", "99"],
         "budget 99 does not match the draft graph, which has 7 nodes"),
        (["--method", "spiffy", "--graph", str(SHIPPED_GRAPH), "--budget", "99", "--depth", "1"],
         "budget 99 does not match the draft graph, which has 7 nodes"),
        (["--method", "spiffy", "--block-size", "16"],
         "the draft graph was calibrated with block size 32, this run decodes blocks of 16"),
        (["--device", "banana"], "unknown device 'banana'"),
    ],
)
def test_generate_bad_options(capsys, cwd, extra, message):
    one_line_error(capsys, [*GEN, *extra], message)
    assert not any(cwd.iterdir())


@pytest.mark.parametrize(
    "nodes, message",
    [
        (["(1,1)", "(1,1)|(40,1)"], "the draft graph uses position rank 40, past the block of 32 positions"),
        (["(1,2000)"], "the draft graph uses vocab rank 2000, past the vocabulary (1024 tokens)"),
    ],
)
def test_generate_refuses_a_graph_outside_the_block_or_vocabulary(capsys, tmp_path, cwd, nodes, message):
    one_line_error(capsys, [*GEN, "--method", "spiffy", "--graph", str(graph_file(tmp_path, nodes))], message)


def test_generate_refuses_a_graph_calibrated_for_another_block(capsys, tmp_path, cwd):
    graph = graph_file(tmp_path, ["(1,1)"], block_size=16)
    one_line_error(capsys, [*GEN, "--method", "specfold", "--graph", str(graph)],
                   "the draft graph was calibrated with block size 16, this run decodes blocks of 32")


def test_generate_refuses_prompt_ids_past_the_vocabulary(capsys, cwd):
    one_line_error(capsys, ["generate", "--prompt-ids", "1,2,5000", "--max-new-tokens", "4"],
                   "the prompt has token id 5000, past the vocabulary (1024)")


def test_device_without_cuda(capsys, cwd):
    if torch.cuda.is_available():
        one_line_error(capsys, [*GEN, "--device", "cuda:99"], "device 'cuda:99': this machine has")
    else:
        one_line_error(capsys, [*GEN, "--device", "cuda"], "device 'cuda': CUDA is not available here (")
        with pytest.raises(ValidationError, match="CUDA is not available here"):
            load_model(device="cuda")


def test_no_lookahead_reaches_the_decoder(capsys, cwd, monkeypatch):
    import specfold.api

    seen = []
    real = specfold.api.prepare_method
    monkeypatch.setattr(specfold.api, "prepare_method", lambda *a: seen.append(real(*a)) or seen[-1])
    assert main([*GEN, "--method", "spiffy", "--no-lookahead"]) == 0
    assert main([*GEN, "--method", "spiffy"]) == 0
    capsys.readouterr()
    assert [m.drafter.lookahead for m in seen] == [False, True]  # the embedded model drafts at boundaries


def test_demo_refuses_a_delta_outside_0_1(capsys, cwd):
    one_line_error(capsys, ["demo", "--delta", "1.5"], "argument --delta: delta must be a finite number in [0, 1], "
                   "got 1.5")
    one_line_error(capsys, ["demo", "--delta", "nan"], "delta must be a finite number in [0, 1], got nan")


def test_defaults_never_count_as_given(capsys, cwd):
    """Every option left at its default is accepted for every method (only explicit ones are checked)."""
    for method in ("vanilla", "spiffy", "specfold"):
        assert main([*GEN, "--method", method]) == 0
    assert main([*GEN, "--method", "specfold", "--delta", "0", "--backend", "torch", "--budget", "3"]) == 0
    capsys.readouterr()


# ---------------------------------------------------------------------------------------------- eval and sweep


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--methods", "vanilla", "--delta", "0.2"], "--delta applies to --methods specfold, not vanilla"),
        (["--methods", "vanilla,spiffy", "--attention", "direct"],
         "--attention applies to --methods specfold, not vanilla,spiffy"),
        (["--methods", "vanilla", "--budget", "3"], "--budget applies to --methods spiffy or specfold, not vanilla"),
        (["--methods", "specfold", "--delta", "0.1,1.5"], "delta must be a finite number in [0, 1], got 1.5"),
        (["--methods", "vanilla", "--no-lookahead"],
         "--no-lookahead applies to --methods spiffy or specfold, not vanilla"),
        (["--methods", "specfold", "--ffn-reuse", "x"],
         "argument --ffn-reuse: invalid choice: 'x' (choose from 'residual', 'paper')"),
        (["--methods", "vanilla,medusa"], "unknown method(s) ['medusa']; choose from vanilla, spiffy, specfold"),
        (["--device", "cuda:99"], "device 'cuda:99'"),
    ],
)
def test_eval_bad_options(capsys, cwd, extra, message):
    one_line_error(capsys, [*EVAL, "--out", "r.jsonl", *extra], message)
    assert not any(cwd.iterdir())


def out_cases(command: str) -> list[tuple[list[str], str]]:
    """(``--out`` arguments, message) for a directory, a missing directory and an unwritable one (``{ro}``)."""
    return [
        (["--out", "."], "--out '.' is a directory; give a file path"),
        (["--out", "missing/x.out"], "--out missing/x.out: directory missing does not exist"),
        (["--out", "{ro}/x.out"], "--out {ro}/x.out: cannot write in {ro} ({why})"),
    ]


COMMANDS = {
    "eval": [*EVAL, "--model", NO_MODEL],
    "eval-evalplus": [*EVAL, "--model", NO_MODEL, "--out", "r.jsonl"],
    "sweep": ["sweep", "delta", "--tasks", "synth-math", "--limit", "1", "--model", NO_MODEL],
    "calibrate": ["calibrate", "--samples", "2", "--model", NO_MODEL],
    "plot": ["plot", "delta", "--records", "no-such.jsonl"],
    "analyze": ["analyze", "residuals", "--model", NO_MODEL],
    "merge": ["merge", "no-such.jsonl"],
    "export-evalplus": ["export-evalplus", "--records", "no-such.jsonl"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("case", range(3))
def test_outputs_are_checked_before_any_work(capsys, cwd, unwritable, command, case):
    ro, why = unwritable
    args, message = out_cases(command)[case]
    suffix = {"plot": ".png", "analyze": ".png"}.get(command, ".jsonl")
    args = [a.replace("{ro}", str(ro)).replace(".out", suffix) for a in args]
    message = message.replace("{ro}", str(ro)).replace("{why}", why).replace(".out", suffix)
    if command == "eval-evalplus":
        args[0] = "--evalplus-out"
        message = message.replace("--out", "--evalplus-out")
    one_line_error(capsys, [*COMMANDS[command], *args], message)
    assert not any(cwd.iterdir())  # nothing written, no directory created
    assert not any(p.name.startswith(".x.") for p in ro.iterdir())


def test_sweep_grid_is_checked_before_the_model_loads(capsys, cwd):
    one_line_error(capsys, ["sweep", "delta", "--tasks", "synth-math", "--grid", "0.1,1.5", "--model", NO_MODEL],
                   "delta grid value must be a finite number in [0, 1], got 1.5")
    one_line_error(capsys, ["sweep", "budget", "--tasks", "synth-math", "--delta", "nan", "--model", NO_MODEL],
                   "argument --delta: delta must be a finite number in [0, 1], got nan")
    assert not any(cwd.iterdir())


def test_calibrate_checks_its_side_files(capsys, cwd):
    (cwd / "g.counts.json").mkdir()
    one_line_error(capsys, ["calibrate", "--out", "g.json", "--model", NO_MODEL],
                   "--out (counts) 'g.counts.json' is a directory; give a file path")
    assert sorted(p.name for p in cwd.iterdir()) == ["g.counts.json"]


# ---------------------------------------------------------------------------------------------- plot


def sweep_records(kind: str | None, deltas=(0.1, 0.2)) -> list[dict]:
    recs = []
    for i, d in enumerate([None, *deltas]):
        method = "vanilla" if d is None else "specfold"
        params = {} if d is None else {"budget": 7, "depth": None, "graph": None, "delta": d}
        rec = {"task": "synth-math", "method": method, "label": method if d is None else f"specfold[delta={d}]",
               "params": params, "sample_id": "s0", "correct": True, "nfe": 10 - i, "nfe_denoise": 10 - i,
               "generated_tokens": 8, "seconds": 0.1, "accepted_drafts": i, "token_ids": [1] * 8}
        if kind is not None:
            rec["provenance"] = {"sweep": kind}
        recs.append(rec)
    return recs


@pytest.mark.parametrize("kind", ["delta", None])  # from the provenance, or inferred from the varying δ
def test_plot_budget_of_delta_records_is_refused(capsys, cwd, kind):
    path = cwd / "delta.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in sweep_records(kind)))
    one_line_error(capsys, ["plot", "budget", "--records", str(path), "--out", "fig.png"],
                   "the records hold a delta sweep, not a budget sweep")
    with pytest.raises(ValidationError, match="the records hold a delta sweep, not a depth sweep"):
        plot_sweep(sweep_records(kind), "depth", cwd / "fig.png")
    assert [p.name for p in cwd.iterdir()] == ["delta.jsonl"]
    assert main(["plot", "delta", "--records", str(path), "--out", "fig.png"]) == 0  # the right kind draws
    assert (cwd / "fig.png").read_bytes()[:4] == b"\x89PNG"


def test_plot_refuses_an_unknown_figure_format(capsys, cwd):
    path = cwd / "delta.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in sweep_records("delta")))
    one_line_error(capsys, ["plot", "delta", "--records", str(path), "--out", "fig.xyz"],
                   "--out fig.xyz: cannot write a figure as '.xyz'; use one of ")
    assert [p.name for p in cwd.iterdir()] == ["delta.jsonl"]


# ---------------------------------------------------------------------------------------------- Python API


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"method": "specfold", "delta": 1.5}, "delta must be a finite number in [0, 1], got 1.5"),
        ({"method": "specfold", "delta": float("nan")}, "delta must be a finite number in [0, 1], got nan"),
        ({"delta": 0.5}, "delta applies to specfold, not vanilla"),
        ({"backend": "triton"}, "backend applies to specfold, not vanilla"),
        ({"method": "spiffy", "delta": 0.5}, "delta applies to specfold, not spiffy"),
        ({"graph": SHIPPED_GRAPH}, "graph applies to spiffy or specfold, not vanilla"),
        ({"method": "spiffy", "graph": SHIPPED_GRAPH, "budget": 99},
         "budget 99 does not match the draft graph, which has 7 nodes"),
        ({"method": "spiffy", "block_size": 16},
         "the draft graph was calibrated with block size 32, this run decodes blocks of 16"),
    ],
)
def test_api_generate_bad_options(embedded, kwargs, message):
    with pytest.raises(ValueError) as info:
        generate(embedded, "What is 3 + 4?", max_new_tokens=4, **kwargs)
    assert str(info.value).startswith(message)


def test_api_checks_every_prompt_before_decoding_any(embedded):
    with pytest.raises(ValueError, match=r"the prompt has token id 5000, past the vocabulary \(1024\)"):
        generate(embedded, [[5, 6, 7], [5, 5000]], max_new_tokens=4)
    with pytest.raises(ValueError, match="the prompt has a negative token id -3"):
        generate(embedded, [5, -3], max_new_tokens=4)


def test_api_graph_object_budget(embedded):
    graph = DraftGraph.from_strings(["(1,1)", "(2,1)"])
    with pytest.raises(ValueError, match="budget 5 does not match the draft graph, which has 2 nodes"):
        prepare_method(embedded, MethodConfig("spiffy", graph=graph, budget=5))
    assert prepare_method(embedded, MethodConfig("spiffy", graph=graph, budget=2)).graph == graph


def test_draft_graph_checks_its_fit_to_a_run():
    graph = DraftGraph.from_strings(["(1,1)", "(1,1)|(3,2)"], provenance={"block_size": 4})
    graph.check_budget(None)
    graph.check_budget(2)
    graph.check(block_size=4, vocab_size=2)
    with pytest.raises(ValidationError, match="^budget 3 does not match the draft graph, which has 2 nodes"):
        graph.check_budget(3)
    with pytest.raises(ValidationError, match="^the draft graph uses position rank 3, past the block of 2 positions$"):
        graph.check(block_size=2)
    with pytest.raises(ValidationError, match="^the draft graph was calibrated with block size 4, this run decodes"):
        graph.check(block_size=8)
    with pytest.raises(ValidationError, match=r"^the draft graph uses vocab rank 2, past the vocabulary \(1 tokens\)$"):
        graph.check(vocab_size=1)


def test_run_eval_checks_out_before_decoding(embedded, tmp_path):
    plan = EvalPlan(tasks=["synth-math"], methods=[MethodConfig("vanilla")], limit=1, max_new_tokens=4)
    with pytest.raises(ValidationError, match="is a directory; give a file path"):
        run_eval(embedded, plan, tmp_path)
    with pytest.raises(ValidationError, match="directory .*missing does not exist"):
        run_eval(embedded, plan, tmp_path / "missing" / "r.jsonl")
    assert not any(tmp_path.iterdir())


def test_check_device_accepts_what_exists():
    assert check_device("cpu") == "cpu"
    with pytest.raises(ValidationError, match="unsupported device 'meta'"):
        check_device("meta")


# ---------------------------------------------------------------------------------------------- atomic writes


def test_check_output_path_probe_leaves_nothing(tmp_path):
    assert check_output_path(tmp_path / "x.json") == tmp_path / "x.json"
    assert not any(tmp_path.iterdir())


def test_atomic_output_replaces_whole_or_not_at_all(tmp_path):
    target = tmp_path / "g.json"
    target.write_text("old\n")
    with pytest.raises(RuntimeError), atomic_output(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed mid-write")
    assert target.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["g.json"]
    atomic_write_text(target, "new\n")
    assert target.read_text() == "new\n" and [p.name for p in tmp_path.iterdir()] == ["g.json"]
    fresh = atomic_write_text(tmp_path / "fresh.txt", "x")
    umask = os.umask(0)
    os.umask(umask)
    assert fresh.stat().st_mode & 0o777 == 0o666 & ~umask  # a new file gets the usual mode, not mkstemp's 0600


def test_graph_files_are_written_atomically(tmp_path):
    path = graph_file(tmp_path, ["(1,1)"])
    assert DraftGraph.load(path).strings() == ["", "(1,1)"] and [p.name for p in tmp_path.iterdir()] == ["graph.json"]


def test_plot_of_records_without_a_drafting_method_is_refused(capsys, cwd):
    path = cwd / "vanilla.jsonl"
    path.write_text(json.dumps(sweep_records(None, deltas=())[0]) + "\n")  # a vanilla-only eval record
    one_line_error(capsys, ["plot", "budget", "--records", str(path), "--out", "fig.png"],
                   "the records hold no budget sweep: not one spiffy or specfold record")
    assert [p.name for p in cwd.iterdir()] == ["vanilla.jsonl"]
