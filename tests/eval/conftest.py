"""Eval fixtures: a random-weight Fast-dLLM-v2 checkpoint that can take text (a tiny tokenizer beside it) and
select a draft graph for any budget (calibration counts beside it), as a real shipped model does."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from specfold.api import COUNTS_FILE, decode_config_for, encode_prompt, load_model, record_counts
from specfold.decoding.calibration import counts_to_json
from specfold.eval.tasks.synthetic import load_split
from specfold.train.tokenizer import train_tokenizer

CALIBRATION_PROMPTS = 3


@pytest.fixture(autouse=True)
def _one_thread(one_thread):  # every eval test: see tests/conftest.py
    yield


@pytest.fixture(scope="session")
def text_ckpt(fd_ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("text_ckpt")
    for name in ("config.json", "model.safetensors"):
        shutil.copy(Path(fd_ckpt) / name, out / name)
    tok = train_tokenizer(tmp_path_factory.mktemp("tok"), vocab_size=300, n_samples=300)
    for f in Path(tok).iterdir():
        shutil.copy(f, out / f.name)
    model = load_model(out)
    cfg = decode_config_for(model, 16, block_size=16)
    prompts = [encode_prompt(model, s.prompt) for s in load_split("synth-math", "calib", CALIBRATION_PROMPTS)]
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # session fixtures run before one_thread
    try:
        counts = record_counts(model, prompts, cfg)
    finally:
        torch.set_num_threads(before)
    (out / COUNTS_FILE).write_text(json.dumps(counts_to_json(counts)))
    return out


@pytest.fixture
def png_pixels():
    """``path -> uint8 array [H, W, 3]`` of a PNG, and ``count(array, rgb)``: the pixels of exactly that colour (a
    figure's line and marker colours survive anti-aliasing at their centres)."""
    import numpy as np
    from PIL import Image

    def read(path: Path):
        return np.asarray(Image.open(path).convert("RGB"))

    def count(pixels, rgb: tuple[int, int, int]) -> int:
        return int((pixels == np.array(rgb, dtype=np.uint8)).all(axis=-1).sum())

    return SimpleNamespace(read=read, count=count)
