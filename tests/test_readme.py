"""The README's examples of the embedded model: every ``$ specfold generate`` of a ``console`` block is run and
prints exactly the output shown beneath it, and every ``# ->`` comment of a ``python`` block is a line the block
prints. Any other ``specfold generate`` in a code block must name a ``--model`` (the real-checkpoint recipe, which
needs weights this machine does not have)."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from specfold.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"^```(\w*)\n(.*?)^```", README.read_text(), flags=re.S | re.M)


def transcripts() -> list[tuple[str, str]]:
    """``(command, expected stdout)`` of each ``$ specfold generate`` line in a console block."""
    out = []
    for lang, body in BLOCKS:
        if lang != "console":
            continue
        for chunk in re.split(r"^(?=\$ )", body, flags=re.M):
            if chunk.startswith("$ specfold generate "):
                command, _, expected = chunk.partition("\n")
                out.append((command[2:], expected))
    return out


pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_readme_has_embedded_examples_and_every_other_names_a_model():
    assert len(transcripts()) >= 5
    commands = [line for lang, body in BLOCKS if lang != "console" for line in body.splitlines()
                if "specfold generate" in line]
    assert commands and all("--model" in line for line in commands), commands


@pytest.mark.parametrize(("command", "expected"), transcripts(), ids=lambda v: v[18:60])
def test_readme_generate_example_prints_its_answer(capsys, command, expected):
    assert main(shlex.split(command)[1:]) == 0
    assert capsys.readouterr().out == expected


def test_readme_python_example_prints_its_answers():
    blocks = [body for lang, body in BLOCKS if lang == "python" and "specfold.generate" in body]
    assert blocks
    for body in blocks:
        expected = [line.split("# -> ", 1)[1] for line in body.splitlines() if "# -> " in line]
        assert expected
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(body, str(README), "exec"), {})
        lines = printed.getvalue().splitlines()
        assert all(e in lines for e in expected), (expected, lines)
