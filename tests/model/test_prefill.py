"""Chunked prefill and streamed attention against the one-shot forward they replace.

Exactness claims are checked in fp64 at 1e-10 (max abs difference): the last row's logits and every cached K/V row,
for both families, at prompt lengths on either side of block (32) and default-chunk (1024) boundaries, with the
default chunk and with small chunks that put boundaries everywhere. The models are tiny (hidden 16) so that the
one-shot reference, which builds the full ``[T, T]`` scores, stays cheap at 4097 rows; GQA has its own case.
"""

from __future__ import annotations

import pytest
import torch

from specfold.model.attention import attend, block_bias
from specfold.model.families import config_from_dict
from specfold.model.random_checkpoint import random_config, random_model
from specfold.model.transformer import DEFAULT_PREFILL_CHUNK, prefill_chunk_size

TOL = 1e-10
LENGTHS = [31, 32, 33, 1023, 1024, 1025, 4097]
MASK = {"fast_dllm_v2": "block_causal", "nld": "causal"}


def tiny_net(family: str, dtype: torch.dtype = torch.float64, **shape):
    # NLD: YaRN with original max 64 and Llama-4 query scaling, so positions past 64 change the tables per chunk.
    dims = dict(vocab_size=301, hidden_size=16, num_heads=1, num_kv_heads=1, intermediate_size=24,
                max_position_embeddings=8192)
    cfg = config_from_dict(random_config(family, **{**dims, **shape}))
    return random_model(cfg, seed=7).to(dtype)


def one_shot(net, prompt, mask):
    cache = net.new_cache(prompt.numel())
    with torch.no_grad():
        last = net(prompt[None], cache, mask=mask, write_cache=True)[0, -1]
    return last, cache


def chunked(net, prompt, mask, chunk):
    cache = net.new_cache(1)  # deliberately small: prefill reserves the room once
    with torch.no_grad():
        pre = net.prefill(prompt, cache, mask=mask, chunk=chunk)
    return pre, cache


def assert_same(pre, cache, ref_last, ref_cache, t):
    assert cache.length == ref_cache.length == t
    assert (pre.last_logits - ref_last).abs().max() < TOL
    for got, want in ((cache.k, ref_cache.k), (cache.v, ref_cache.v)):
        assert (got[:, :, :t] - want[:, :, :t]).abs().max() < TOL


@pytest.mark.parametrize("family", ["fast_dllm_v2", "nld"])
@pytest.mark.parametrize("t", LENGTHS)
def test_chunked_prefill_equals_one_shot(family, t):
    net, mask = tiny_net(family), MASK[family]
    prompt = torch.randint(0, 300, (t,), generator=torch.Generator().manual_seed(t))
    ref_last, ref_cache = one_shot(net, prompt, mask)
    small = 96 if family == "fast_dllm_v2" else 100  # 3 blocks / not a multiple of anything here
    small *= 5 if t > 2000 else 1
    for chunk in (None, small):
        pre, cache = chunked(net, prompt, mask, chunk)
        size = prefill_chunk_size(chunk, mask, net.cfg.block_size)
        assert pre.forwards == -(-t // size)
        assert cache.capacity == t  # grown once, to exactly the prompt
        assert_same(pre, cache, ref_last, ref_cache, t)


def test_chunk_sizes_and_block_alignment():
    assert prefill_chunk_size(None, "causal", 32) == DEFAULT_PREFILL_CHUNK
    assert prefill_chunk_size(100, "causal", 32) == 100
    assert prefill_chunk_size(100, "block_causal", 32) == 96
    assert prefill_chunk_size(5, "block_causal", 32) == 32
    with pytest.raises(ValueError, match="must be positive"):
        prefill_chunk_size(0, "causal", 32)


@pytest.mark.parametrize("family", ["fast_dllm_v2", "nld"])
def test_gqa_and_chunk_of_one_block(family):
    """6 query / 2 KV heads (hidden 48), chunks of one block (NLD: of 7 rows), a prompt that ends mid-chunk."""
    net, mask = tiny_net(family, hidden_size=48, num_heads=6, num_kv_heads=2), MASK[family]
    prompt = torch.randint(0, 300, (203,), generator=torch.Generator().manual_seed(1))
    ref_last, ref_cache = one_shot(net, prompt, mask)
    pre, cache = chunked(net, prompt, mask, 32 if family == "fast_dllm_v2" else 7)
    assert_same(pre, cache, ref_last, ref_cache, 203)


def test_prefill_after_cached_rows_and_fp32():
    """A second causal prefill continues the first (positions and keys); fp32 stays within 1e-4 of one-shot."""
    net = tiny_net("nld")
    prompt = torch.randint(0, 300, (300,), generator=torch.Generator().manual_seed(2))
    ref_last, ref_cache = one_shot(net, prompt, "causal")
    cache = net.new_cache(300)
    with torch.no_grad():
        net.prefill(prompt[:130], cache, chunk=64)
        pre = net.prefill(prompt[130:], cache, chunk=64)
    assert_same(pre, cache, ref_last, ref_cache, 300)

    net32 = net.float()
    ref_last, ref_cache = one_shot(net32, prompt, "causal")
    pre, cache = chunked(net32, prompt, "causal", 64)
    assert (pre.last_logits - ref_last).abs().max() < 1e-4
    assert (cache.k - ref_cache.k).abs().max() < 1e-4


def test_prefill_refuses_bad_input_before_any_work():
    net = tiny_net("nld", max_position_embeddings=256)
    cache = net.new_cache(8)
    too_long = torch.zeros(257, dtype=torch.long)
    with pytest.raises(ValueError, match="past the model's position limit 256"):
        net.prefill(too_long, cache)
    with pytest.raises(ValueError, match="causal or block_causal"):
        net.prefill(too_long[:8], cache, mask="bidirectional")
    assert cache.length == 0 and cache.capacity == 8  # nothing written, nothing grown


def test_cache_writing_forward_logit_rows():
    net = tiny_net("fast_dllm_v2")
    tokens = torch.randint(0, 300, (1, 32), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = net(tokens, net.new_cache(32), mask="bidirectional", write_cache=True)
        last = net(tokens, net.new_cache(32), mask="bidirectional", write_cache=True, logit_rows=slice(-1, None))
    assert last.shape == (1, 1, net.cfg.vocab_size)
    assert (last[0, 0] - full[0, -1]).abs().max() < TOL


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_streamed_prefix_attention_equals_one_piece(dtype):
    """attend over a prefix in key tiles (a small score budget) = the single-GEMM path; the default budget leaves
    ordinary shapes on the single-GEMM path bit for bit."""
    g = torch.Generator().manual_seed(4)
    b, t, hq, hkv, d, p = 3, 32, 6, 2, 8, 1000
    q = torch.randn(b, t, hq, d, generator=g, dtype=dtype)
    pk, pv = (torch.randn(hkv, p, d, generator=g, dtype=dtype) for _ in range(2))
    bk, bv = (torch.randn(b, t, hkv, d, generator=g, dtype=dtype) for _ in range(2))
    bias = block_bias("causal", t, 32, dtype)
    whole = attend(q, pk, pv, bk, bv, bias, 0.3, budget=None)
    assert torch.equal(attend(q, pk, pv, bk, bv, bias, 0.3).o, whole.o)
    tiled = attend(q, pk, pv, bk, bv, bias, 0.3, budget=b * t * hq * 300)  # tiles of 300 keys: 4 tiles, 1 short
    tol = TOL if dtype == torch.float64 else 1e-5
    for name in ("m", "z", "o"):
        got, want = getattr(tiled, name), getattr(whole, name)
        assert (got - want).abs().max() <= tol * max(1.0, want.abs().max().item()), name
