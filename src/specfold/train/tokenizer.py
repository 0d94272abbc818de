"""Byte-level BPE tokenizer for the embedded DLLM, trained on the synthetic suite's train split.

Pre-tokenisation splits every digit into its own piece (so numbers are digit sequences, which makes
arithmetic learnable), then applies the GPT-2 byte-level split. Special tokens, registered as added
special tokens with ids 0–3 in this order:

    <|endoftext|>  pad
    <|im_start|>   turn start
    <|im_end|>     end of turn: the stop / EOS token
    |<MASK>|       the diffusion mask token

The saved directory (``tokenizer.json`` + ``tokenizer_config.json`` with a Qwen-style ``chat_template``)
loads offline with ``transformers.AutoTokenizer.from_pretrained(dir)`` and with
``tokenizers.Tokenizer.from_file(dir / "tokenizer.json")``.

``specfold train --out OUT [--vocab-size 1024]`` trains one into ``OUT/tokenizer`` when no ``--tokenizer`` is given
(:func:`train_tokenizer`); this module never prints.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from specfold.eval.tasks.synthetic import Sample, iter_train

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
MASK_TOKEN = "|<MASK>|"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, IM_START, IM_END, MASK_TOKEN)

# Qwen-style: every message as <|im_start|>{role}\n{content}<|im_end|>\n, then the assistant header.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def render_chat(prompt: str) -> str:
    """The chat-templated single user turn followed by the assistant header (what the model sees)."""
    return f"{IM_START}user\n{prompt}{IM_END}\n{IM_START}assistant\n"


def render_training_text(sample: Sample) -> tuple[str, str]:
    """``(prompt_text, response_text)``: the templated prompt and the reference ending in ``<|im_end|>``."""
    return render_chat(sample.prompt), sample.reference + IM_END


def _texts(n_samples: int, seed: int) -> Iterator[str]:
    # Whole templated turns, so the template words ("user", "assistant") become single tokens too.
    for sample in itertools.islice(iter_train(None, seed), n_samples):
        prompt_text, response_text = render_training_text(sample)
        yield prompt_text + response_text


def build_tokenizer(vocab_size: int = 1024, n_samples: int = 20000, seed: int = 0) -> Tokenizer:
    """Train the BPE on ``n_samples`` train samples (all tasks interleaved); deterministic."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_texts(n_samples, seed), trainer=trainer, length=n_samples)
    return tok


def train_tokenizer(out_dir: Path, vocab_size: int = 1024, n_samples: int = 20000, seed: int = 0) -> Path:
    """Train and save to ``out_dir`` (created); returns ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(vocab_size, n_samples, seed)
    tok.save(str(out_dir / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    added = {
        str(ids[t]): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t in SPECIAL_TOKENS
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 1024,
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": PAD_TOKEN,
        "mask_token": MASK_TOKEN,
        "unk_token": None,
        "additional_special_tokens": [IM_START],
        "added_tokens_decoder": added,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "padding_side": "right",
        "chat_template": CHAT_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    special_map = {
        "eos_token": IM_END,
        "pad_token": PAD_TOKEN,
        "mask_token": MASK_TOKEN,
        "additional_special_tokens": [IM_START],
    }
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n", encoding="utf-8")
    return out_dir

