"""Tokenizer: special tokens, digit splitting, chat template through transformers, round trips, lengths."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from specfold.eval.tasks.synthetic import TASKS, load_split
from specfold.train.tokenizer import (
    IM_END,
    SPECIAL_TOKENS,
    build_tokenizer,
    render_chat,
    render_training_text,
    train_tokenizer,
)

MAX_P95_PROMPT_TOKENS = 48  # templated prompt, up to and including the assistant header
MAX_P95_RESPONSE_TOKENS = 64  # reference plus <|im_end|>


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_tokenizer(tmp_path_factory.mktemp("tok"), vocab_size=1024, n_samples=20000)


@pytest.fixture(scope="module")
def hf(tok_dir: Path):  # noqa: ANN201
    return AutoTokenizer.from_pretrained(str(tok_dir))


def test_saved_files_and_config(tok_dir: Path) -> None:
    config = json.loads((tok_dir / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|im_end|>" and config["pad_token"] == "<|endoftext|>"
    assert config["mask_token"] == "|<MASK>|" and "chat_template" in config
    assert Tokenizer.from_file(str(tok_dir / "tokenizer.json")).get_vocab_size() == 1024


def test_special_tokens_are_single_ids(tok_dir: Path, hf) -> None:  # noqa: ANN001
    raw = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    assert [raw.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3]
    for i, t in enumerate(SPECIAL_TOKENS):
        assert hf.encode(t, add_special_tokens=False) == [i]
        assert hf.encode(f"a{t}b", add_special_tokens=False)[1:-1] == [i]
    assert (hf.pad_token_id, hf.eos_token_id, hf.mask_token_id) == (0, 2, 3)
    assert hf.convert_ids_to_tokens(hf.convert_tokens_to_ids("<|im_start|>")) == "<|im_start|>"
    assert hf.bos_token is None
    assert len(hf) == 1024


def test_chat_template_matches_render_chat(hf) -> None:  # noqa: ANN001
    for s in (load_split(task, "test", limit=3)[-1] for task in TASKS):
        messages = [{"role": "user", "content": s.prompt}]
        text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert text == render_chat(s.prompt)
        assert text == f"<|im_start|>user\n{s.prompt}<|im_end|>\n<|im_start|>assistant\n"
        ids = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=True)
        assert list(ids["input_ids"]) == hf.encode(text, add_special_tokens=False)


def test_digits_are_single_tokens(hf) -> None:  # noqa: ANN001
    digit_ids = [hf.encode(str(d), add_special_tokens=False) for d in range(10)]
    assert all(len(ids) == 1 for ids in digit_ids)
    ids = hf.encode("Tom has 507 apples. 12+89=101", add_special_tokens=False)
    toks = hf.convert_ids_to_tokens(ids)
    for d in "50712891":
        assert d in toks
    assert not any(len(t) > 1 and any(c.isdigit() for c in t) for t in toks)


def test_hf_and_raw_tokenizers_agree_and_round_trip(tok_dir: Path, hf) -> None:  # noqa: ANN001
    raw = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    for task in TASKS:
        for s in load_split(task, "test", limit=50):
            prompt_text, response_text = render_training_text(s)
            text = prompt_text + response_text
            ids = hf.encode(text, add_special_tokens=False)
            assert ids == raw.encode(text).ids
            assert hf.decode(ids) == text == raw.decode(ids, skip_special_tokens=False)
            assert hf.decode(hf.encode(s.reference, add_special_tokens=False)) == s.reference


def test_render_training_text() -> None:
    s = load_split("synth-code", "test", limit=1)[0]
    prompt_text, response_text = render_training_text(s)
    assert prompt_text == render_chat(s.prompt)
    assert response_text == s.reference + IM_END and response_text.count(IM_END) == 1


def test_token_lengths_per_task(hf) -> None:  # noqa: ANN001
    for task in TASKS:
        pairs = [render_training_text(s) for s in load_split(task, "test")]
        p = np.array([len(hf.encode(a, add_special_tokens=False)) for a, _ in pairs])
        r = np.array([len(hf.encode(b, add_special_tokens=False)) for _, b in pairs])
        assert np.percentile(p, 95) <= MAX_P95_PROMPT_TOKENS, (task, np.percentile(p, 95))
        assert np.percentile(r, 95) <= MAX_P95_RESPONSE_TOKENS, (task, np.percentile(r, 95))
        assert r.max() <= 2 * MAX_P95_RESPONSE_TOKENS


def test_training_is_deterministic() -> None:
    a = build_tokenizer(vocab_size=400, n_samples=1500)
    b = build_tokenizer(vocab_size=400, n_samples=1500)
    assert a.to_str() == b.to_str()


def test_train_tokenizer_writes_a_loadable_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tok"
    assert train_tokenizer(out, vocab_size=400, n_samples=600) == out
    assert capsys.readouterr() == ("", "")  # library code never prints
    tok = AutoTokenizer.from_pretrained(str(out))
    assert tok.eos_token == "<|im_end|>" and len(tok) == 400
