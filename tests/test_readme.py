"""The README and docs/ say only what works.

* Every ``$ specfold generate`` of a ``console`` block in the README is run and prints exactly the output shown
  beneath it, and every ``# ->`` comment of a ``python`` block is a line the block prints.
* Every other ``specfold ...`` command in a code block of the README or ``docs/*.md``, and every one of
  ``scripts/reproduce_embedded.sh``, is accepted by the CLI's own parser (flags, subcommands and choices exist); the
  README's that would need weights this machine lacks name a ``--model``.
* The scripts, make targets and docs files they name exist, and the README stays short (≤ 250 lines, issue 35).
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from specfold.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", flags=re.S | re.M)
BLOCKS = FENCE.findall(README.read_text())
MAX_README_LINES = 250


def transcripts() -> list[tuple[str, str]]:
    """``(command, expected stdout)`` of each ``$ specfold generate`` line in a README console block."""
    out = []
    for lang, body in BLOCKS:
        if lang != "console":
            continue
        for chunk in re.split(r"^(?=\$ )", body, flags=re.M):
            if chunk.startswith("$ specfold generate "):
                command, _, expected = chunk.partition("\n")
                out.append((command[2:], expected))
    return out


def shown_commands() -> list[tuple[str, str]]:
    """``(file, command line)`` of every ``specfold`` command in a bash/console block of the README and docs/ (line
    continuations joined, ``$ `` prompts and comments dropped), except the README transcripts, which are run."""
    out = []
    for path in [README, *DOCS]:
        for lang, body in FENCE.findall(path.read_text()):
            if lang not in ("bash", "console", "sh"):
                continue
            for line in body.replace("\\\n", " ").splitlines():
                line = line.removeprefix("$ ")
                if line.startswith("specfold ") and not (path == README and lang == "console"):
                    out.append((path.name, line))
    return out


def reproduce_commands() -> list[tuple[str, str]]:
    """``("reproduce_embedded.sh", command)`` of every ``$S ...`` (specfold) line of the script that rebuilds the
    shipped model and its figures, with its shell variables filled in and redirections dropped."""
    script = (ROOT / "scripts" / "reproduce_embedded.sh").read_text().replace("\\\n", " ")
    fill = {"$TASKS": "synth-math,synth-code,synth-if", "$kind": "delta", '"$ASSET"': "assets", '"$RUN"': "runs/x",
            "$ASSET": "assets", "$RUN": "runs/x"}
    out = []
    for line in script.splitlines():
        if "$S " not in line:
            continue
        line = line[line.index("$S ") + 3:].split(" || ")[0].split(" > ")[0]
        for var, value in fill.items():
            line = line.replace(var, value)
        out.append(("reproduce_embedded.sh", "specfold " + line.strip()))
    return out


pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_readme_is_short_and_has_embedded_examples():
    assert len(README.read_text().splitlines()) <= MAX_README_LINES
    assert len(transcripts()) >= 5
    generate = [line for _, line in shown_commands() if line.startswith("specfold generate")]
    assert generate and all("--model" in line for line in generate), generate


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


@pytest.mark.parametrize(("where", "command"), shown_commands() + reproduce_commands(), ids=lambda v: v[:60])
def test_every_shown_command_parses(where, command):
    words = shlex.split(command.replace("$M", "some/model"), comments=True)
    try:
        args = build_parser().parse_args(words[1:])
    except SystemExit as exc:
        pytest.fail(f"{where}: the CLI refuses `{command}` (exit {exc.code})")
    assert callable(args.func)


def test_named_scripts_targets_and_docs_exist():
    text = "\n".join(p.read_text() for p in [README, *DOCS])
    scripts = set(re.findall(r"\bscripts/[\w.]+\.(?:py|sh)", text))
    missing = sorted(s for s in scripts if not (ROOT / s).is_file())
    assert scripts and not missing, missing
    links = set(re.findall(r"\]\((docs/[\w.]+)", README.read_text()))
    assert {"docs/results.md", "docs/serving.md"} <= links and all((ROOT / link).is_file() for link in links)
    makefile = (ROOT / "Makefile").read_text()
    for target in set(re.findall(r"\bmake (\w+)", README.read_text())):
        assert re.search(rf"^{target}:", makefile, flags=re.M), target
