"""The SDAR family (Qwen3 layers with qk-norm) against transformers' Qwen3ForCausalLM, and its checkpoint format.

The reference runs the whole sequence with a float 4D mask encoding SDAR's protocol: block-causal over blocks of
``B`` from the first prompt token (the prefilled prompt blocks, a finished block written to the cache, then the
active block bidirectional over everything before it). fp64 logits within 1e-10 (max abs difference).
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from specfold.model.families import config_from_dict
from specfold.model.loading import load_checkpoint, load_model
from specfold.model.random_checkpoint import random_config, write_random_checkpoint

TOL = {torch.float32: 1e-4, torch.float64: 1e-10}


@pytest.fixture(scope="module")
def sdar_ckpt(tmp_path_factory):
    return write_random_checkpoint(tmp_path_factory.mktemp("sdar"), "sdar", seed=6, generation_eos=[297, 298])


def _rms_norm_keep_dtype(self, hidden_states):
    work = hidden_states if hidden_states.dtype == torch.float64 else hidden_states.float()
    var = work.pow(2).mean(-1, keepdim=True)
    return self.weight * (work * torch.rsqrt(var + self.variance_epsilon)).to(hidden_states.dtype)


def qwen3_reference(ckpt, dtype, monkeypatch):
    import transformers
    import transformers.models.qwen3.modeling_qwen3 as q3

    # transformers upcasts RMSNorm to fp32 even for fp64 weights; keep fp64 (the same formula)
    monkeypatch.setattr(q3.Qwen3RMSNorm, "forward", _rms_norm_keep_dtype)
    cfg = json.loads((ckpt / "config.json").read_text())
    hf_cfg = transformers.Qwen3Config(
        vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"], intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=cfg["num_hidden_layers"], num_attention_heads=cfg["num_attention_heads"],
        num_key_value_heads=cfg["num_key_value_heads"], head_dim=cfg["head_dim"],
        max_position_embeddings=cfg["max_position_embeddings"], rms_norm_eps=cfg["rms_norm_eps"],
        tie_word_embeddings=cfg["tie_word_embeddings"], attention_bias=cfg["attention_bias"],
        rope_parameters={"rope_type": "default", "rope_theta": cfg["rope_theta"]},
    )
    model = transformers.Qwen3ForCausalLM(hf_cfg)
    missing, unexpected = model.load_state_dict(load_file(str(ckpt / "model.safetensors")), strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    hf_cfg._attn_implementation = "sdpa" if dtype == torch.float64 else "eager"
    return model.to(dtype).eval()


def block_causal_mask(total: int, b: int, dtype: torch.dtype) -> torch.Tensor:
    """Float ``[1, 1, L, L]``: row i sees column j iff ``j // b <= i // b`` (explicit floats: a boolean 4D mask with
    eager attention is not honoured)."""
    i = torch.arange(total)
    allowed = (i[None, :] // b) <= (i[:, None] // b)
    return torch.zeros(total, total, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)[None, None]


def test_config_maps_qwen3_fields(sdar_ckpt):
    raw = json.loads((sdar_ckpt / "config.json").read_text())
    cfg = config_from_dict(raw)
    assert (cfg.family, cfg.qk_norm, cfg.qkv_bias, cfg.shifted_logits, cfg.tie_word_embeddings) == (
        "sdar", True, False, False, False)
    assert cfg.block_size == raw["block_size"] and cfg.mask_token_id == raw["mask_token_id"]
    assert cfg.rope.theta == raw["rope_theta"] and cfg.head_dim == raw["head_dim"]
    tensors = load_file(str(sdar_ckpt / "model.safetensors"))
    assert "model.layers.1.self_attn.q_norm.weight" in tensors and "lm_head.weight" in tensors
    assert not any(k.endswith("_proj.bias") for k in tensors)


def test_stop_ids_from_generation_config(sdar_ckpt):
    model = load_model(sdar_ckpt, dtype="fp64")
    assert model.stop_ids == (297, 298) and model.stop_id == 297
    assert model.stop_source == "generation_config.json eos_token_id"
    given = load_model(sdar_ckpt, dtype="fp64", eos_id=5)  # an explicit stop id replaces the list
    assert given.stop_ids == (5,) and given.stop_id == 5


def test_checkpoint_without_qk_norm_tensor_refused(sdar_ckpt, tmp_path):
    from safetensors.torch import save_file

    from specfold.config import CheckpointError

    tensors = load_file(str(sdar_ckpt / "model.safetensors"))
    del tensors["model.layers.0.self_attn.k_norm.weight"]
    (tmp_path / "config.json").write_text((sdar_ckpt / "config.json").read_text())
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="k_norm"):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("block", [4, 8])
def test_logits_match_qwen3(sdar_ckpt, dtype, block, monkeypatch, tmp_path):
    raw = json.loads((sdar_ckpt / "config.json").read_text())
    ckpt = sdar_ckpt
    if raw["block_size"] != block:  # same weights, another block size
        ckpt = tmp_path / "b"
        ckpt.mkdir()
        (ckpt / "config.json").write_text(json.dumps({**raw, "block_size": block}))
        (ckpt / "model.safetensors").symlink_to(sdar_ckpt / "model.safetensors")
    _, cfg, ours = load_checkpoint(ckpt, dtype=dtype)
    assert cfg.block_size == block
    ref = qwen3_reference(ckpt, dtype, monkeypatch)
    tol = TOL[dtype]
    g = torch.Generator().manual_seed(7)
    prompt = torch.randint(0, cfg.vocab_size - 2, (3 * block,), generator=g)
    finished = torch.randint(0, cfg.vocab_size, (block,), generator=g)
    branches = torch.randint(0, cfg.vocab_size, (3, block), generator=g)

    cache = ours.new_cache(4)  # small: exercises growth
    with torch.no_grad():
        pre = ours.prefill(prompt, cache, mask="block_causal", chunk=block)  # one chunk per block
        got_w = ours(finished[None], cache, mask="bidirectional", write_cache=True)[0]
        got = ours(branches, cache, mask="bidirectional")
    for b in range(branches.shape[0]):
        seq = torch.cat([prompt, finished, branches[b]])
        with torch.no_grad():
            want = ref(input_ids=seq[None], attention_mask=block_causal_mask(seq.numel(), block, dtype),
                       position_ids=torch.arange(seq.numel())[None]).logits[0]
        assert (got[b] - want[-block:]).abs().max() < tol
    assert (pre.last_logits - want[prompt.numel() - 1]).abs().max() < tol
    assert (got_w - want[prompt.numel() : prompt.numel() + block]).abs().max() < tol
    assert cache.length == prompt.numel() + block


def test_random_config_is_the_published_layout():
    raw = random_config("sdar")
    assert raw["model_type"] == "sdar" and raw["architectures"] == ["SDARForCausalLM"]
    assert raw["attention_bias"] is False and "block_size" in raw and "mask_token_id" in raw
