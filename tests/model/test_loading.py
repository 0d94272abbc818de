"""Checkpoint loading: real formats (single file, sharded index, tied head), special ids, and clear errors."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from specfold.model.loading import CheckpointError, load_checkpoint, load_model
from specfold.model.random_checkpoint import write_random_checkpoint


def copy_ckpt(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_sharded_checkpoint_loads_the_same_weights(fd_ckpt, tmp_path):
    ckpt = copy_ckpt(fd_ckpt, tmp_path / "sharded")
    tensors = load_file(str(ckpt / "model.safetensors"))
    (ckpt / "model.safetensors").unlink()
    names = sorted(tensors)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    for fname, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(ckpt / fname))
    index = {"metadata": {}, "weight_map": {k: f for f, ks in shards.items() for k in ks}}
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    _, _, a = load_checkpoint(fd_ckpt)
    _, _, b = load_checkpoint(ckpt)
    for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert na == nb and torch.equal(pa, pb)


def test_tied_head_and_bf16(tmp_path):
    ckpt = write_random_checkpoint(tmp_path / "tied", "fast_dllm_v2", tie_word_embeddings=True, mask_token_id=300)
    assert "lm_head.weight" not in load_file(str(ckpt / "model.safetensors"))
    _, cfg, net = load_checkpoint(ckpt, dtype="bf16")
    assert net.head is None and net.dtype == torch.bfloat16
    with torch.no_grad():
        logits = net(torch.tensor([[1, 2, 3]]), None)
    assert logits.shape == (1, 3, cfg.vocab_size) and torch.isfinite(logits.float()).all()
    # (its values against transformers: tests/model/test_oracle.py::test_tied_head_bf16_matches_transformers)


def test_mask_id_from_the_tokenizer_when_config_has_none(tmp_path):
    from specfold.train.tokenizer import MASK_TOKEN, train_tokenizer

    tok_dir = train_tokenizer(tmp_path / "tok", vocab_size=300, n_samples=300)
    ckpt = write_random_checkpoint(tmp_path / "m", "fast_dllm_v2", vocab_size=300)
    for f in tok_dir.iterdir():
        shutil.copy(f, ckpt / f.name)
    model = load_model(ckpt)
    assert model.mask_id == model.tokenizer.convert_tokens_to_ids(MASK_TOKEN)
    assert model.stop_id == model.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert load_model(ckpt, mask_id=7, eos_id=9).mask_id == 7


def test_stop_id_comes_from_the_config_eos_first_and_the_tokenizer_only_as_a_fallback(tmp_path):
    """NLD-8B's config says eos_token_id 11 while its tokenizer knows other end tokens: the config wins, and the
    loaded model says which source it used. A config `auto_map` (every published DLLM has one) never makes the
    tokenizer load ask about remote code (stdin is closed here: a question would raise)."""
    from specfold.train.tokenizer import train_tokenizer

    tok_dir = train_tokenizer(tmp_path / "tok", vocab_size=300, n_samples=300)
    ckpt = write_random_checkpoint(tmp_path / "m", "fast_dllm_v2", vocab_size=300, eos_token_id=11)
    for f in tok_dir.iterdir():
        shutil.copy(f, ckpt / f.name)
    for name in ("config.json", "tokenizer_config.json"):
        cfg = json.loads((ckpt / name).read_text())
        cfg["auto_map"] = {"AutoModel": "modeling_x.XModel", "AutoTokenizer": ["tokenization_x.XTokenizer", None]}
        (ckpt / name).write_text(json.dumps(cfg))
    model = load_model(ckpt)
    im_end = model.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end != 11
    assert model.stop_id == 11 and model.stop_source == "config.json eos_token_id"
    _edit_config(ckpt, eos_token_id=None)
    fallback = load_model(ckpt)
    assert fallback.stop_id == im_end and fallback.stop_source == "tokenizer '<|im_end|>'"
    assert load_model(ckpt, eos_id=9).stop_source == "--eos-id"


@pytest.mark.parametrize(
    "break_it, message",
    [
        (lambda p: (p / "config.json").unlink(), "config.json is missing"),
        (lambda p: (p / "model.safetensors").unlink(), "no model.safetensors"),
        (lambda p: _edit_config(p, model_type="llama"), "unsupported model_type 'llama'; supported:"),
        (lambda p: _edit_config(p, hidden_size=64), "shape mismatch for 'embed'"),
        (
            lambda p: _drop_tensor(p, "model.layers.1.mlp.down_proj.weight"),
            "lacks tensor 'model.layers.1.mlp.down_proj",
        ),
        (lambda p: _edit_config(p, mask_token_id=None), "cannot find the mask token"),
        (lambda p: _edit_config(p, num_hidden_layers=1), "tensor 'model.layers.1.input_layernorm.weight' is not used"),
        (lambda p: _edit_config(p, attention_bias=False), "tensor 'model.layers.0.self_attn.k_proj.bias' is not used"),
        (lambda p: _edit_config(p, num_key_value_heads=4), "not a multiple of num_key_value_heads"),
    ],
)
def test_broken_checkpoints_give_one_clear_error(fd_ckpt, tmp_path, break_it, message):
    ckpt = copy_ckpt(fd_ckpt, tmp_path / "broken")
    break_it(ckpt)
    with pytest.raises(CheckpointError) as err:
        load_model(ckpt)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_missing_directory_and_unreachable_hub_id(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint directory"):
        load_model(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="could not download 'no-such-org/no-such-model'"):
        load_model("no-such-org/no-such-model")


def _edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (path / "config.json").write_text(json.dumps(cfg))


def _drop_tensor(path, name):
    tensors = load_file(str(path / "model.safetensors"))
    del tensors[name]
    save_file(tensors, str(path / "model.safetensors"))
