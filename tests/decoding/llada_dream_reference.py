"""Independent transcriptions of the LLaDA and Dream reference decoders, greedy, over transformers' own models.

* :func:`mlgsai_generate` — ML-GSAI/LLaDA ``generate.py`` ``generate()``: every step a full forward of prompt + the
  whole generation, low-confidence remasking by the per-step quota (``get_num_transfer_tokens``), confidence in the
  logits' dtype, every scheduled step run (a zero quota included).
* :func:`fastdllm_llada_generate` — NVlabs/Fast-dLLM ``llada/generate.py``: ``generate`` (no cache),
  ``generate_with_prefix_cache`` and ``generate_with_dual_cache``, threshold (``top-1`` + every masked position with
  ``conf >= τ``) or steps, confidence in fp64.
* :func:`fastdllm_dream_generate` — Fast-dLLM ``dream/model/generation_utils_block.py`` ``_sample`` with
  ``alg='confidence_threshold'``, prefix or dual cache, confidence in the logits' dtype, shifted logits.

LLaDA is run as ``LlamaForCausalLM`` and Dream as ``Qwen2ForCausalLM`` with the weights of our loaded model, always
with an explicit all-zeros float 4D mask (bidirectional; an omitted mask may run causally). Caches are
transformers' ``DynamicCache`` built from the boundary forward's per-layer keys/values: the prefix (prefix cache),
or the prefix and the suffix with the block's rows cut out (dual cache: the block's fresh keys join them at the
end, which attention does not see as an order). Each returns the generated ids (``gen_length`` of them, as
upstream: no early stop) and the forwards it ran.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def hf_twin(net, dtype=torch.float64):
    """transformers' ``LlamaForCausalLM`` (no q/k/v bias: LLaDA) or ``Qwen2ForCausalLM`` (bias: Dream) holding the
    weights of our :class:`~specfold.model.transformer.DLLM` ``net``."""
    import transformers

    c = net.cfg
    common = dict(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_dim, max_position_embeddings=c.max_position_embeddings, rms_norm_eps=c.rms_norm_eps,
        tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": c.rope.theta},
    )
    if c.qkv_bias:
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common, attention_bias=False,
                                                                       mlp_bias=False))
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    sd = {"model.embed_tokens.weight": net.embed, "model.norm.weight": net.final_norm,
          "lm_head.weight": net.head_weight()}
    for i, layer in enumerate(net.layers):
        p = f"model.layers.{i}."
        wq, wk, wv = layer.wqkv.split([q, kv, kv])
        gate, up = layer.w_gate_up.chunk(2)
        sd.update({p + "self_attn.q_proj.weight": wq, p + "self_attn.k_proj.weight": wk,
                   p + "self_attn.v_proj.weight": wv, p + "self_attn.o_proj.weight": layer.wo,
                   p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up, p + "mlp.down_proj.weight":
                   layer.w_down, p + "input_layernorm.weight": layer.input_norm,
                   p + "post_attention_layernorm.weight": layer.post_norm})
        if c.qkv_bias:
            bq, bk, bv = layer.bqkv.split([q, kv, kv])
            sd.update({p + "self_attn.q_proj.bias": bq, p + "self_attn.k_proj.bias": bk,
                       p + "self_attn.v_proj.bias": bv})
    missing, unexpected = model.load_state_dict({k: v.detach().clone() for k, v in sd.items()}, strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    model.config._attn_implementation = "sdpa"
    return model.to(dtype).eval()


def _zeros_mask(q: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(1, 1, q, k, dtype=dtype)


@torch.no_grad()
def forward(hf, x: torch.Tensor, start: int = 0, cache_kv=None, keep: bool = False):
    """Bidirectional forward of ``x [1, T]`` at positions ``start ..`` over ``cache_kv`` (per-layer ``(k, v)``
    ``[1, Hkv, P, D]``, or None). Returns (logits ``[1, T, V]``, the forward's per-layer keys/values when ``keep``)."""
    from transformers import DynamicCache

    dtype = next(hf.parameters()).dtype
    t = x.shape[1]
    past = 0 if cache_kv is None else cache_kv[0][0].shape[2]
    cache = DynamicCache(ddp_cache_data=cache_kv) if cache_kv is not None else None
    out = hf(input_ids=x, attention_mask=_zeros_mask(t, past + t, dtype),
             position_ids=torch.arange(start, start + t)[None], cache=cache, use_cache=keep or cache is not None)
    kv = [(layer.keys, layer.values) for layer in out.cache.layers] if keep else None
    return out.logits, kv


def get_num_transfer_tokens(mask_index: torch.Tensor, steps: int) -> torch.Tensor:
    mask_num = mask_index.sum(dim=1, keepdim=True)
    base, remainder = mask_num // steps, mask_num % steps
    num = torch.zeros(mask_num.size(0), steps, dtype=torch.int64) + base
    for i in range(mask_num.size(0)):
        num[i, : remainder[i]] += 1
    return num


@torch.no_grad()
def mlgsai_generate(hf, prompt, steps, gen_length, block_length, mask_id):
    """ML-GSAI ``generate()``, temperature 0, ``low_confidence``, no CFG."""
    prompt = torch.tensor(prompt)[None]
    x = torch.full((1, prompt.shape[1] + gen_length), mask_id, dtype=torch.long)
    x[:, : prompt.shape[1]] = prompt
    assert gen_length % block_length == 0
    num_blocks = gen_length // block_length
    assert steps % num_blocks == 0
    steps = steps // num_blocks
    nfe = 0
    for b in range(num_blocks):
        lo = prompt.shape[1] + b * block_length
        num_transfer = get_num_transfer_tokens(x[:, lo : lo + block_length] == mask_id, steps)
        for i in range(steps):
            mask_index = x == mask_id
            logits, _ = forward(hf, x)
            nfe += 1
            x0 = torch.argmax(logits, dim=-1)
            p = F.softmax(logits, dim=-1)  # the logits' dtype
            x0_p = torch.gather(p, -1, x0[..., None]).squeeze(-1)
            x0_p[:, lo + block_length :] = -np.inf
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, x0_p, -np.inf)
            transfer = torch.zeros_like(x0, dtype=torch.bool)
            _, select = torch.topk(confidence[0], k=int(num_transfer[0, i]))
            transfer[0, select] = True
            x[transfer] = x0[transfer]
    return x[0, prompt.shape[1] :].tolist(), nfe


def _transfer_index(logits, mask_index, x, num_transfer, threshold, fp64):
    """Fast-dLLM's ``get_transfer_index`` (LLaDA: fp64) / Dream's threshold branch (logits' dtype), greedy."""
    x0 = torch.argmax(logits, dim=-1)
    p = F.softmax(logits.to(torch.float64) if fp64 else logits, dim=-1)
    x0_p = torch.gather(p, -1, x0[..., None]).squeeze(-1)
    x0 = torch.where(mask_index, x0, x)
    confidence = torch.where(mask_index, x0_p, torch.tensor(-np.inf, dtype=x0_p.dtype))
    transfer = torch.zeros_like(x0, dtype=torch.bool)
    k = int(mask_index.sum()) if threshold is not None else int(num_transfer)
    values, select = torch.topk(confidence[0], k=k)
    transfer[0, select] = True
    if threshold is not None:
        for j in range(1, k):
            if values[j] < threshold:
                transfer[0, select[j]] = False
    return x0, transfer


@torch.no_grad()
def fastdllm_llada_generate(hf, prompt, gen_length, block_length, mask_id, cache, threshold=None, steps=None):
    """Fast-dLLM v1 LLaDA decoding, ``cache`` in none / prefix / dual; ``threshold`` or ``steps`` (total)."""
    prompt = torch.tensor(prompt)[None]
    length = prompt.shape[1]
    x = torch.full((1, length + gen_length), mask_id, dtype=torch.long)
    x[:, :length] = prompt
    assert gen_length % block_length == 0
    num_blocks = gen_length // block_length
    steps = steps if steps is not None else gen_length  # unused with a threshold
    assert steps % num_blocks == 0
    steps //= num_blocks
    nfe = 0
    for b in range(num_blocks):
        lo, hi = length + b * block_length, length + (b + 1) * block_length
        num_transfer = get_num_transfer_tokens(x[:, lo:hi] == mask_id, steps)
        if cache == "none":
            i = 0
            while True:
                nfe += 1
                mask_index = x == mask_id
                logits, _ = forward(hf, x)
                mask_index[:, hi:] = 0
                x0, transfer = _transfer_index(logits, mask_index, x, num_transfer[0, i] if threshold is None
                                               else None, threshold, fp64=True)
                x[transfer] = x0[transfer]
                i += 1
                if (x[:, lo:hi] == mask_id).sum() == 0:
                    break
            continue
        # the boundary: a full forward fills the cache and commits tokens
        logits, kv = forward(hf, x, keep=True)
        mask_index = x == mask_id
        mask_index[:, hi:] = 0
        x0, transfer = _transfer_index(logits, mask_index, x, num_transfer[0, 0] if threshold is None else None,
                                       threshold, fp64=True)
        x[transfer] = x0[transfer]
        nfe += 1
        if cache == "prefix":
            past = [(k[:, :, :lo], v[:, :, :lo]) for k, v in kv]
        else:
            past = [(torch.cat([k[:, :, :lo], k[:, :, hi:]], 2), torch.cat([v[:, :, :lo], v[:, :, hi:]], 2))
                    for k, v in kv]
        i = 1
        while True:
            nfe += 1
            end = None if cache == "prefix" else hi
            mask_index = x[:, lo:end] == mask_id
            mask_index[:, block_length:] = 0
            logits, _ = forward(hf, x[:, lo:end], start=lo, cache_kv=past)
            x0, transfer = _transfer_index(logits, mask_index, x[:, lo:end], num_transfer[0, i] if threshold is None
                                           else None, threshold, fp64=True)
            x[:, lo:end][transfer] = x0[transfer]
            if (x[:, lo:hi] == mask_id).sum() == 0:
                break
            i += 1
    return x[0, length:].tolist(), nfe


def _shift(logits: torch.Tensor) -> torch.Tensor:
    return torch.cat([logits[:, :1], logits[:, :-1]], dim=1)


@torch.no_grad()
def fastdllm_dream_generate(hf, prompt, gen_length, block_length, mask_id, cache, threshold):
    """Fast-dLLM v1 Dream block decoding (``confidence_threshold``), ``cache`` in prefix / dual."""
    prompt = torch.tensor(prompt)[None]
    length = prompt.shape[1]
    x = torch.full((1, length + gen_length), mask_id, dtype=torch.long)
    x[:, :length] = prompt
    assert gen_length % block_length == 0
    nfe = 0
    for b in range(gen_length // block_length):
        lo, hi = length + b * block_length, length + (b + 1) * block_length
        logits, kv = forward(hf, x, keep=True)
        nfe += 1
        logits = _shift(logits)
        x[:, lo] = torch.argmax(logits, dim=-1)[:, lo]  # the block's first token, unconditionally
        if cache == "prefix":
            past = [(k[:, :, :lo], v[:, :, :lo]) for k, v in kv]
        else:
            past = [(torch.cat([k[:, :, :lo], k[:, :, hi:]], 2), torch.cat([v[:, :, :lo], v[:, :, hi:]], 2))
                    for k, v in kv]
        while True:
            end = None if cache == "prefix" else hi
            mask_index = x[:, lo:end] == mask_id
            logits, _ = forward(hf, x[:, lo:end], start=lo, cache_kv=past)
            nfe += 1
            logits = _shift(logits)
            mask_index[:, block_length:] = False  # (the reference's -inf confidence past the block)
            current = int((x[:, lo:hi] == mask_id).sum())
            x0, transfer = _transfer_index(logits, mask_index, x[:, lo:end], current, threshold, fp64=False)
            x[:, lo:end][transfer] = x0[transfer]
            if (x[:, lo:hi] == mask_id).sum() == 0:
                break
    return x[0, length:].tolist(), nfe


def cut_at_stop(tokens: list[int], stop_ids) -> list[int]:
    """The generated ids up to and including the first stop id (the text is cut there, as upstream's callers do)."""
    first = next((i for i, t in enumerate(tokens) if t in tuple(stop_ids)), None)
    return tokens if first is None else tokens[: first + 1]
