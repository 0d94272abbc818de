"""Every prompt path refuses what is not prompt text with one line (exit 2), before loading a model: invalid UTF-8
and lone surrogates, whitespace-only text, every wrong message shape; bad block sizes are refused, not clamped;
``--threads`` is capped at the machine's cores; a valid long prompt prints no tokenizer warning."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specfold.api import encode_messages, encode_prompt, load_model
from specfold.cli import main, usable_cores
from specfold.validation import ValidationError

pytestmark = pytest.mark.usefixtures("one_thread")

NO_MODEL = ["--model", "/nonexistent/model"]  # a refusal must come before the model would load


def refused(capsys, argv: list[str], *needles: str) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("specfold: error: "), err
    assert "Traceback" not in err and "/nonexistent/model" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


@pytest.mark.parametrize(
    "prompt, what",
    [
        ("\udcff\udcfe abc", "undecodable byte 0xff"),  # $'\xff\xfe abc' as Python decodes argv
        ("\ud800", "lone surrogate U+D800"),
        ("   \n\t", "only whitespace"),
    ],
)
def test_a_bad_prompt_argument_is_one_line(capsys, prompt: str, what: str):
    refused(capsys, ["generate", prompt, *NO_MODEL], what)
    refused(capsys, ["generate", "fine", "--system", prompt, *NO_MODEL], "--system", what)


def test_invalid_utf8_argv_in_a_real_process_is_one_line():
    proc = subprocess.run([sys.executable, "-m", "specfold.cli", "generate", b"\xff\xfe abc", *NO_MODEL],
                          capture_output=True, timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and err.count("\n") == 1 and "undecodable byte 0xff" in err, err


PROMPT_FILES = [
    ("p.jsonl", b'"\\ud800"\n', "line 1", "lone surrogate"),
    ("p.jsonl", b'{"prompt": "   "}\n', "line 1", "only whitespace"),
    ("p.jsonl", b'{"messages": "hi"}\n', "line 1", "expected a JSON string"),
    ("p.jsonl", b'{"prompt": ["hi"]}\n', "line 1", "expected a JSON string"),
    ("p.jsonl", b'{"messages": [{"role": "user", "content": ""}]}\n', "line 1", "message 0 content is empty"),
    ("p.jsonl", b'{"messages": [{"role": "user", "content": "\\udfff"}]}\n', "line 1", "lone surrogate"),
    ("p.jsonl", b'{"messages": ["hi"]}\n', "line 1", "message 0 must be an object"),
    ("p.jsonl", b'{"messages": []}\n', "line 1", "non-empty list"),
    ("p.jsonl", b'"ok"\n7\n', "line 2", "expected a JSON string"),
    ("p.txt", b"fine\n\xff\xfe abc\n", "line 2", "not UTF-8"),
    ("p.txt", b"fine\n\xed\xa0\x80\n", "line 2", "not UTF-8"),  # a UTF-8-encoded surrogate
]


@pytest.mark.parametrize("name, data, where, what", PROMPT_FILES, ids=[str(i) for i in range(len(PROMPT_FILES))])
def test_a_bad_prompts_file_line_is_one_line(capsys, tmp_path: Path, name: str, data: bytes, where: str, what: str):
    path = tmp_path / name
    path.write_bytes(data)
    refused(capsys, ["generate", "--prompts-file", str(path), *NO_MODEL], where, what)


@pytest.mark.parametrize(
    "content, what",
    [
        ('"hi"', "got a JSON string"),
        ('{"role": "user", "content": "hi"}', "got a dict"),
        ('[{"role": "user", "content": "  "}]', "message 0 content is only whitespace"),
        ('[{"role": "user", "content": "hi", "extra": 1}]', "unknown field(s) extra"),
        ('[{"role": "robot", "content": "hi"}]', "role 'robot'"),
    ],
)
def test_a_bad_messages_file_is_one_line(capsys, tmp_path: Path, content: str, what: str):
    path = tmp_path / "m.json"
    path.write_text(content)
    refused(capsys, ["generate", "--messages", str(path), *NO_MODEL], what)


@pytest.fixture(scope="module")
def embedded():
    return load_model(None)


def test_the_api_checks_text_and_messages(embedded):
    for bad in ("", "  ", "\ud800", "a\udcffb"):
        with pytest.raises(ValidationError):
            encode_prompt(embedded, bad)
        with pytest.raises(ValidationError):
            encode_messages(embedded, [{"role": "user", "content": bad}])
    with pytest.raises(ValidationError, match="non-empty list"):
        encode_messages(embedded, "hi")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "argv, what",
    [
        (["--block-size", "7"], "does not divide the model's block size 32"),
        (["--block-size", "4", "--small-block-size", "8"], "small_block_size 8 is larger than block_size 4"),
        (["--small-block-size", "64"], "small_block_size 64 is larger than block_size 32"),
        (["--block-size", "16", "--small-block-size", "3"], "not a multiple of small_block_size 3"),
    ],
)
def test_block_sizes_are_refused_not_clamped(capsys, argv: list[str], what: str):
    code = main(["generate", "--prompt-ids", "5,6,7", "--max-new-tokens", "4", *argv])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and what in err, err


def test_threads_are_capped_at_the_cores(capsys, monkeypatch):
    import torch

    seen = []
    real = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (seen.append(n), real(min(n, 1))))
    assert main(["--threads", "10000", "generate", "--prompt-ids", "5,6,7", "--max-new-tokens", "4", "--json"]) == 0
    err = capsys.readouterr().err
    assert f"--threads 10000 capped at this machine's {usable_cores()} cores" in err
    assert seen[0] == usable_cores()


def test_a_valid_long_prompt_prints_no_tokenizer_warning(embedded, capfd):
    text = "word " * 1900
    ids = encode_prompt(embedded, text, chat=False)
    assert embedded.tokenizer.model_max_length < len(ids) < embedded.config.max_position_embeddings
    assert "indexing errors" not in capfd.readouterr().err
    assert json.loads(json.dumps(ids)) == ids
