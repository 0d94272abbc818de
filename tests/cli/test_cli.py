"""The command line: JSON output, and one-line errors with exit status 2 for bad input (never a traceback)."""

from __future__ import annotations

import json

import pytest

from specfold.api import decode_config_for, load_model
from specfold.cli import main
from specfold.decoding.decoder import decode


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_json_fields(capsys, fd_ckpt):
    code, out, _ = run(capsys, "generate", "--model", str(fd_ckpt), "--prompt-ids", "1,2,3", "--max-new-tokens", "40",
                       "--json")
    assert code == 0
    rec = json.loads(out.strip().splitlines()[-1])
    for key in ("text", "token_ids", "nfe", "generated_tokens", "seconds", "tokens_per_second"):
        assert key in rec
    assert rec["generated_tokens"] == len(rec["token_ids"]) == 40
    model = load_model(fd_ckpt)  # raw ids go in as given; no tokenizer, so no text
    want = decode(model, [1, 2, 3], decode_config_for(model, 40))
    assert (rec["token_ids"], rec["nfe"], rec["text"]) == (want.token_ids, want.nfe, None)


def test_generate_prompt_ids_from_a_file_and_prefill_chunk(capsys, fd_ckpt, tmp_path):
    ids = [(7 * i) % 290 for i in range(100)]
    (tmp_path / "ids.txt").write_text(" ".join(map(str, ids[:50])) + "\n" + ",".join(map(str, ids[50:])) + "\n")
    recs = []
    for argv in (["--prompt-ids", ",".join(map(str, ids))], ["--prompt-ids", f"@{tmp_path / 'ids.txt'}",
                                                           "--prefill-chunk", "32"]):
        code, out, _ = run(capsys, "generate", "--model", str(fd_ckpt), *argv, "--max-new-tokens", "8", "--json")
        assert code == 0
        recs.append(json.loads(out.strip().splitlines()[-1]))
    assert recs[0]["token_ids"] == recs[1]["token_ids"]
    assert (recs[0]["prefill_forwards"], recs[1]["prefill_forwards"]) == (1, 3)  # 96 aligned rows: one / three chunks
    assert recs[1]["prefill_seconds"] > 0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--prompt-ids", "1", "--threshold", "1.5"], "threshold must be in (0, 1]"),
        (["--prompt-ids", "1", "--threshold", "0"], "threshold must be in (0, 1]"),
        (["--prompt-ids", "1", "--max-new-tokens", "0"], "expected a positive integer"),
        (["--prompt-ids", "1", "--block-size", "-4"], "expected a positive integer"),
        (["--prompt-ids", "1", "--dtype", "fp16"], "invalid choice: 'fp16'"),
        (["--prompt-ids", ""], "--prompt-ids is empty"),
        (["--prompt-ids", "1", "--max-new-tokens", "100000"], "exceeds the model's position limit"),
        (["--prompt-ids", "1,2,400"], "token id 400, past the vocabulary (301)"),
        (["--prompt-ids", "1", "--prefill-chunk", "0"], "expected a positive integer"),
        (["--prompt-ids", "@no-such-file"], "cannot read token ids from 'no-such-file'"),
        ([""], "empty prompt"),
        (["hello"], "has no tokenizer"),
        (["--prompt-ids", "1", "--method", "spiffy"], "no draft graph"),
        (["--prompt-ids", "1", "--budget", "3"], "--budget applies to --method spiffy or specfold"),
    ],
)
def test_bad_input_one_line_error(capsys, fd_ckpt, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        code = main(["generate", "--model", str(fd_ckpt), *argv])
        raise SystemExit(code)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_missing_checkpoint(capsys, tmp_path):
    code, _, err = run(capsys, "generate", "--model", str(tmp_path / "x"), "--prompt-ids", "1")
    assert code == 2 and err.startswith("specfold: error: no checkpoint directory")


@pytest.mark.parametrize(
    "mix, message",
    [("synth-math", "expected TASK=N"), ("gsm8k=2", "expected TASK=N"), ("synth-math=x", "expected TASK=N"),
     ("synth-math=0,synth-if=0", "leaves out every task")],
)
def test_train_rejects_a_bad_mix(capsys, tmp_path, mix, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--out", str(tmp_path / "run"), "--mix", mix])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()  # nothing half-written


def test_train_rejects_a_missing_warm_start(capsys, tmp_path):
    code, _, err = run(capsys, "train", "--out", str(tmp_path / "run"), "--init", str(tmp_path / "nope"))
    assert code == 2 and "no checkpoint directory" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("flag", ["--max-minutes", "--checkpoint-minutes"])
@pytest.mark.parametrize("value", ["0", "-1", "nan", "soon"])
def test_train_rejects_a_bad_time(capsys, tmp_path, flag, value):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--out", str(tmp_path / "run"), flag, value])
    assert exit_info.value.code == 2
    shown = repr(value) if value == "soon" else str(float(value))
    assert capsys.readouterr().err == (f"specfold train: error: argument {flag}: expected a number of minutes > 0, "
                                       f"got {shown} (see --help)\n")
    assert not (tmp_path / "run").exists()
