"""Our transformer against transformers' Qwen2ForCausalLM / Ministral3ForCausalLM with the same weights.

Each case runs the reference over the whole sequence with a float 4D mask that encodes our cache protocol
(prefix chunks, then the active block) and compares the rows of the active block.
Tolerances: fp32 1e-4, fp64 1e-10 (max abs difference of logits). transformers upcasts RMSNorm and the eager
softmax to fp32 even for fp64 weights, so in fp64 the reference runs SDPA (fp64 throughout) and an RMSNorm that
keeps fp64 — the same formula without the fp32 round-trip.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from specfold.model.loading import load_checkpoint

TOL = {torch.float32: 1e-4, torch.float64: 1e-10}


def reference_model(ckpt, dtype):
    import transformers

    cfg = json.loads((ckpt / "config.json").read_text())
    tensors = load_file(str(ckpt / "model.safetensors"))
    common = dict(
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=cfg["num_attention_heads"],
        num_key_value_heads=cfg["num_key_value_heads"],
        max_position_embeddings=cfg["max_position_embeddings"],
        rms_norm_eps=cfg["rms_norm_eps"],
        tie_word_embeddings=cfg["tie_word_embeddings"],
    )
    if cfg["model_type"] == "Fast_dLLM_Qwen":
        hf_cfg = transformers.Qwen2Config(
            **common, rope_parameters={"rope_type": "default", "rope_theta": cfg["rope_theta"]}
        )
        model = transformers.Qwen2ForCausalLM(hf_cfg)
    else:
        hf_cfg = transformers.Ministral3Config(
            **common, head_dim=cfg["head_dim"], rope_parameters=dict(cfg["rope_parameters"])
        )
        model = transformers.Ministral3ForCausalLM(hf_cfg)
        tensors = {
            k.replace("encoder.", "model.", 1).replace("diffusion_head.", "lm_head."): v for k, v in tensors.items()
        }
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    tied = {"lm_head.weight"} if cfg["tie_word_embeddings"] else set()  # filled by the tie, not the file
    assert not unexpected and all("rotary" in m or m in tied for m in missing), (missing, unexpected)
    hf_cfg._attn_implementation = "sdpa" if dtype == torch.float64 else "eager"
    return model.to(dtype).eval()


def _rms_norm_keep_dtype(self, hidden_states):
    work = hidden_states if hidden_states.dtype == torch.float64 else hidden_states.float()
    var = work.pow(2).mean(-1, keepdim=True)
    return self.weight * (work * torch.rsqrt(var + self.variance_epsilon)).to(hidden_states.dtype)


@pytest.fixture(autouse=True)
def _fp64_norms(monkeypatch):
    import transformers.models.ministral3.modeling_ministral3 as m3
    import transformers.models.qwen2.modeling_qwen2 as q2

    monkeypatch.setattr(q2.Qwen2RMSNorm, "forward", _rms_norm_keep_dtype)
    monkeypatch.setattr(m3.Ministral3RMSNorm, "forward", _rms_norm_keep_dtype)


def segment_mask(segments, dtype):
    """Float mask [1, 1, L, L]: each segment sees all earlier segments and itself by its kind."""
    total = sum(n for n, _ in segments)
    allowed = torch.zeros(total, total, dtype=torch.bool)
    start = 0
    for n, kind in segments:
        i = torch.arange(n)
        if kind == "causal":
            inner = i[None, :] <= i[:, None]
        elif kind == "block_causal":
            inner = (i[None, :] // 32) <= (i[:, None] // 32)
        else:
            inner = torch.ones(n, n, dtype=torch.bool)
        allowed[start : start + n, :start] = True
        allowed[start : start + n, start : start + n] = inner
        start += n
    mask = torch.zeros(total, total, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


def run_reference(model, ids, segments, dtype):
    with torch.no_grad():
        out = model(
            input_ids=ids[None],
            attention_mask=segment_mask(segments, dtype),
            position_ids=torch.arange(ids.numel())[None],
        )
    return out.logits[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("family", ["fd", "nld"])
def test_logits_match_transformers(family, dtype, fd_ckpt, nld_ckpt):
    ckpt = fd_ckpt if family == "fd" else nld_ckpt
    _, cfg, ours = load_checkpoint(ckpt, dtype=dtype)
    ref = reference_model(ckpt, dtype)
    tol = TOL[dtype]
    g = torch.Generator().manual_seed(3)
    prefill_kind = "block_causal" if family == "fd" else "causal"
    refresh_kind = "bidirectional" if family == "fd" else "causal"
    prompt = torch.randint(0, cfg.vocab_size, (64 if family == "fd" else 45,), generator=g)
    block1 = torch.randint(0, cfg.vocab_size, (32,), generator=g)
    block2 = torch.randint(0, cfg.vocab_size, (32,), generator=g)

    cache = ours.new_cache(8)  # deliberately small: exercises growth
    with torch.no_grad():
        # 1. prefill
        got = ours(prompt[None], cache, mask=prefill_kind, write_cache=True)[0]
    want = run_reference(ref, prompt, [(prompt.numel(), prefill_kind)], dtype)
    assert (got - want).abs().max() < tol

    # 2. an active block (several branches) attending to the cached prefix, bidirectional inside
    branches = torch.stack([block1, block2, block1.flip(0)])
    with torch.no_grad():
        got = ours(branches, cache, mask="bidirectional")
    for b in range(branches.shape[0]):
        seq = torch.cat([prompt, branches[b]])
        want = run_reference(ref, seq, [(prompt.numel(), prefill_kind), (32, "bidirectional")], dtype)[-32:]
        assert (got[b] - want).abs().max() < tol

    # 3. the cache-writing / refresh forward of a finished block, then a block attending to the longer prefix
    with torch.no_grad():
        got_w = ours(block1[None], cache, mask=refresh_kind, write_cache=True)[0]
        got = ours(block2[None], cache, mask="bidirectional")[0]
    seq = torch.cat([prompt, block1, block2])
    segs = [(prompt.numel(), prefill_kind), (32, refresh_kind), (32, "bidirectional")]
    want = run_reference(ref, seq, segs, dtype)
    assert (got_w - want[prompt.numel() : prompt.numel() + 32]).abs().max() < tol
    assert (got - want[-32:]).abs().max() < tol
    assert cache.length == prompt.numel() + 32


def test_tied_head_bf16_matches_transformers(tmp_path):
    """The tied-head path (no lm_head in the file: logits through the embedding matrix) in bf16 against transformers'
    Qwen2 with tied embeddings. Weights are bf16-exact, so fp64 and bf16 runs share them; FlashAttention's rule for
    low precision: our error against the fp64 reference is at most 2× transformers' own bf16 error, plus a floor."""
    from safetensors.torch import save_file

    from specfold.model.random_checkpoint import write_random_checkpoint

    ckpt = write_random_checkpoint(tmp_path / "tied", "fast_dllm_v2", seed=4, tie_word_embeddings=True,
                                   mask_token_id=300)
    tensors = load_file(str(ckpt / "model.safetensors"))
    assert "lm_head.weight" not in tensors
    save_file({k: v.to(torch.bfloat16).float() for k, v in tensors.items()}, str(ckpt / "model.safetensors"),
              metadata={"format": "pt"})
    _, cfg, ours = load_checkpoint(ckpt, dtype="bf16")
    assert ours.head is None and ours.dtype == torch.bfloat16
    ref64, ref16 = reference_model(ckpt, torch.float64), reference_model(ckpt, torch.bfloat16)
    for ref in (ref64, ref16):  # really tied: the head is the embedding matrix
        assert ref.lm_head.weight.data_ptr() == ref.model.embed_tokens.weight.data_ptr()

    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, cfg.vocab_size, (40,), generator=g)
    block = torch.randint(0, cfg.vocab_size, (32,), generator=g)
    cache = ours.new_cache(80)
    with torch.no_grad():
        got_prefill = ours(prompt[None], cache, mask="block_causal", write_cache=True)[0].double()
        got_block = ours(block[None], cache, mask="bidirectional")[0].double()
    seq, segs = torch.cat([prompt, block]), [(40, "block_causal"), (32, "bidirectional")]
    want = run_reference(ref64, seq, segs, torch.float64)
    ctrl = run_reference(ref16, seq, segs, torch.bfloat16).double()
    for got, rows in ((got_prefill, slice(0, 40)), (got_block, slice(40, 72))):
        err, err_ctrl = (got - want[rows]).abs().max().item(), (ctrl[rows] - want[rows]).abs().max().item()
        assert err <= 2 * err_ctrl + 1e-3, (err, err_ctrl)
    scale = want.abs().max().item()
    assert 0 < err_ctrl < 0.1 * scale  # the bf16 control is a real, small error (not 0, not noise-sized)
