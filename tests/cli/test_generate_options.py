"""``specfold generate``'s conversation, stop-string and multi-prompt options, and the global ``--threads``: each
output is compared with the library computing the same thing (``specfold.generate``, ``encode_messages``,
``truncate_at_stop``); bad combinations end in one line naming the problem."""

from __future__ import annotations

import json

import pytest
import torch

import specfold
import specfold.api
from specfold.api import encode_messages, encode_prompt, load_model, truncate_at_stop
from specfold.cli import main

MATH = "Lucy has 23 cards. She buys 6 packs with 8 cards in each. How many cards does Lucy have now?"
METALS = "Write exactly 4 metals on one line, separated by spaces."
CODE = "Write a function calc(num) that returns num plus 19."
TOKENS = 48


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def embedded():
    return load_model(None)


def run_json(capsys, *argv: str) -> list[dict]:
    assert main(["generate", *argv, "--max-new-tokens", str(TOKENS), "--json"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_encode_messages_is_the_chat_template(embedded):
    tok = embedded.tokenizer
    assert encode_messages(embedded, [{"role": "user", "content": MATH}]) == encode_prompt(embedded, MATH)
    conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": METALS},
            {"role": "assistant", "content": "Iron Gold Silver Copper"}, {"role": "user", "content": CODE}]
    want = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n" + METALS + "<|im_end|>\n<|im_start|>"
            "assistant\nIron Gold Silver Copper<|im_end|>\n<|im_start|>user\n" + CODE + "<|im_end|>\n"
            "<|im_start|>assistant\n")
    assert encode_messages(embedded, conv) == list(tok.encode(want, add_special_tokens=False))


@pytest.mark.parametrize(
    "messages, message",
    [([], "messages must be a non-empty list of {role, content} objects"),
     ({"role": "user", "content": "hi"}, "messages must be a non-empty list"),
     ([{"role": "user"}], "message 0 must be an object with string 'role' and 'content'"),
     ([{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}],
      "message 1 has role 'bot'; expected one of system, user, assistant")],
)
def test_encode_messages_rejects_a_bad_list(embedded, messages, message):
    with pytest.raises(ValueError) as info:
        encode_messages(embedded, messages)
    assert str(info.value).startswith(message)


def test_truncate_at_stop():
    assert truncate_at_stop("6*8=48\n23+48=71\nAnswer: 71", ["Answer", "\n"]) == ("6*8=48", "\n")  # earliest wins
    assert truncate_at_stop("Iron Gold Silver", ["Gold", "Go"]) == ("Iron ", "Gold")  # a tie: the first listed
    assert truncate_at_stop("Iron Gold", ["Tin"]) == ("Iron Gold", None)
    assert truncate_at_stop("Iron", []) == ("Iron", None)
    with pytest.raises(ValueError, match="empty stop string"):
        truncate_at_stop("Iron", ["x", ""])


def test_system_prompt_is_a_system_message(capsys, embedded):
    [rec] = run_json(capsys, METALS, "--system", "Answer in lower case.")
    ids = encode_messages(embedded, [{"role": "system", "content": "Answer in lower case."},
                                     {"role": "user", "content": METALS}])
    want = specfold.generate(embedded, ids, max_new_tokens=TOKENS)
    assert (rec["token_ids"], rec["text"]) == (want.token_ids, want.text)
    assert ids != encode_prompt(embedded, METALS)  # the system message reached the prompt


def test_messages_file_is_one_conversation(capsys, embedded, tmp_path):
    conv = [{"role": "user", "content": METALS}, {"role": "assistant", "content": "Iron Gold Silver Copper"},
            {"role": "user", "content": CODE}]
    (tmp_path / "chat.json").write_text(json.dumps(conv))
    [rec] = run_json(capsys, "--messages", str(tmp_path / "chat.json"))
    want = specfold.generate(embedded, encode_messages(embedded, conv), max_new_tokens=TOKENS)
    assert (rec["token_ids"], rec["text"]) == (want.token_ids, want.text)


def test_stop_cuts_the_text_not_the_tokens(capsys, embedded):
    full = specfold.generate(embedded, MATH, max_new_tokens=TOKENS)
    assert full.text == "6*8=48\n23+48=71\nAnswer: 71"
    [rec] = run_json(capsys, MATH, "--stop", "Answer", "--stop", "+")
    assert (rec["text"], rec["stop_string"]) == ("6*8=48\n23", "+") == truncate_at_stop(full.text, ["Answer", "+"])
    assert rec["token_ids"] == full.token_ids
    assert main(["generate", MATH, "--max-new-tokens", str(TOKENS), "--stop", "\nAnswer"]) == 0
    assert capsys.readouterr().out == "6*8=48\n23+48=71\n"
    [rec] = run_json(capsys, MATH, "--stop", "never")
    assert (rec["text"], rec["stop_string"]) == (full.text, None)


def test_several_prompts_are_one_generate_call_in_order(capsys, embedded, tmp_path):
    conv = [{"role": "user", "content": CODE}]
    (tmp_path / "more.txt").write_text(f"{METALS}\n\n{CODE}\n")
    (tmp_path / "more.jsonl").write_text(f'{json.dumps(METALS)}\n{json.dumps({"messages": conv})}\n'
                                         f'{json.dumps({"prompt": MATH})}\n')
    want = specfold.generate(embedded, [MATH, METALS, CODE], max_new_tokens=TOKENS)
    recs = run_json(capsys, MATH, "--prompts-file", str(tmp_path / "more.txt"))
    assert [r["index"] for r in recs] == [0, 1, 2]
    assert [(r["token_ids"], r["text"]) for r in recs] == [(w.token_ids, w.text) for w in want]
    recs = run_json(capsys, "--prompts-file", str(tmp_path / "more.jsonl"))
    order = [want[1], want[2], want[0]]  # the conversation is CODE as one user message
    assert [(r["token_ids"], r["text"]) for r in recs] == [(w.token_ids, w.text) for w in order]
    assert main(["generate", METALS, CODE, "--max-new-tokens", str(TOKENS)]) == 0
    assert capsys.readouterr().out == f"=== 1/2 ===\n{want[1].text}\n=== 2/2 ===\n{want[2].text}\n"


@pytest.mark.parametrize("where", ["before", "after"])
def test_threads_sets_torch_threads_for_the_command(capsys, embedded, monkeypatch, where):
    seen: list[int] = []
    real = specfold.api.generate

    def recording(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(specfold.api, "generate", recording)
    argv = ["generate", METALS, "--max-new-tokens", "16", "--json"]
    argv = ["--threads", "2", *argv] if where == "before" else [*argv, "--threads", "2"]
    assert main(argv) == 0
    assert seen == [2] and torch.get_num_threads() == 1  # set for the command, then restored
    want = real(embedded, METALS, max_new_tokens=16)
    assert json.loads(capsys.readouterr().out)["token_ids"] == want.token_ids


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--prompt-ids", "1,2", "hello"], "give either --prompt-ids or text prompts (PROMPT, --prompts-file, "
         "--messages)"),
        ([], "give a PROMPT, --prompts-file, --messages or --prompt-ids"),
        (["--prompt-ids", "1,2", "--system", "x"], "--system applies to text prompts, not --prompt-ids"),
        (["hi", "--system", "x", "--no-chat"], "--system and message lists go through the chat template; drop "
         "--no-chat"),
        (["--messages", "@CHAT", "--system", "x"], "--system applies to text prompts; put the system message in "
         "the message list"),
        (["--messages", "@MISSING"], "cannot read --messages '@MISSING': No such file or directory"),
        (["--messages", "@BAD"], "--messages '@BAD' is not JSON: Expecting value (line 1)"),
        (["--messages", "@ROLE"], "message 0 has role 'bot'; expected one of system, user, assistant"),
        (["--prompts-file", "@JSONL"], "@JSONL line 2: expected a JSON string, {\"prompt\": TEXT} or "
         "{\"messages\": [...]}"),
        (["hi", "--stop", ""], "--stop needs a non-empty string"),
        (["--threads", "0", "hi"], "argument --threads: expected a positive integer, got 0"),
    ],
)
def test_bad_generate_input_is_one_line(capsys, tmp_path, argv, message):
    files = {"@CHAT": ("chat.json", '[{"role": "user", "content": "hi"}]'), "@BAD": ("bad.json", "not json"),
             "@ROLE": ("role.json", '[{"role": "bot", "content": "hi"}]'), "@JSONL": ("p.jsonl", '"fine"\n42\n'),
             "@MISSING": ("missing.json", None)}
    for name, text in files.values():
        if text is not None:
            (tmp_path / name).write_text(text)
    paths = {key: str(tmp_path / name) for key, (name, _) in files.items()}
    argv = [paths.get(a, a) for a in argv]
    for key, path in paths.items():
        message = message.replace(key, path)
    try:
        code = main(["generate", *argv])
    except SystemExit as exit_info:
        code = exit_info.code
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
