"""CUDA checks (``-m gpu``; scripts/gpu_check.sh runs them on a device, they skip elsewhere): the shipped model on
CUDA — its forward against the CPU, full decodes with the Triton backend (compiled kernels, not the interpreter)
token for token against vanilla — and the layer benchmark's triton path at a real shape.

fp32 throughout except the benchmark (bf16, as it is run). CUDA fp32 GEMMs and SDPA reassociate sums differently
from the CPU: logits agree within 1e-3 absolute, not bitwise."""

from __future__ import annotations

import pytest
import torch

from specfold.api import decode_config_for, encode_prompt, prepare_method
from specfold.config import MethodConfig
from specfold.decoding.decoder import decode
from specfold.eval.tasks.synthetic import TASKS, load_split
from specfold.model.loading import load_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (scripts/gpu_check.sh runs these)"),
]

DEVICE = "cuda"
PER_TASK = 4  # held-out prompts per domain
MAX_NEW = 64
LOGIT_ATOL = 1e-3


@pytest.fixture(scope="module")
def model():
    return load_model(dtype="fp32", device=DEVICE)


@pytest.fixture(scope="module")
def prompts(model):
    return [encode_prompt(model, s.prompt) for t in TASKS for s in load_split(t, "test", limit=PER_TASK)]


def test_forward_on_cuda_matches_the_cpu(model, prompts):
    cpu = load_model(dtype="fp32", device="cpu")
    ids = torch.tensor(prompts[0])
    block = torch.full((1, model.config.block_size), model.mask_id)
    block[0, :3] = ids[-3:]
    out = {}
    for name, m in (("cuda", model), ("cpu", cpu)):
        cache = m.net.new_cache(ids.numel() + block.shape[1])
        with torch.no_grad():
            prefill = m.net(ids[None].to(m.net.device), cache, mask="block_causal", write_cache=True)[0]
            active = m.net(block.to(m.net.device), cache)[0]
        out[name] = (prefill.cpu(), active.cpu())
    for got, want in zip(out["cuda"], out["cpu"], strict=True):
        err = (got - want).abs().max().item()
        assert err <= LOGIT_ATOL, err


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_specfold_at_delta_zero_is_token_identical_on_cuda(model, prompts, backend):
    cfg = decode_config_for(model, MAX_NEW)
    m = prepare_method(model, MethodConfig("specfold", delta=0.0, backend=backend), cfg)
    folded = accepted = 0.0
    for ids in prompts:
        want = decode(model, ids, cfg).token_ids
        got = decode(model, ids, cfg, verifier=m.verifier, drafter=m.drafter)
        assert got.token_ids == want
        folded += got.engine_stats.folded_triples
        accepted += got.accepted_drafts
    assert folded > 0 and accepted > 0  # rows folded and drafts were accepted: the identity is not vacuous


def layer_errors(shape: str, device: str, fold_ratio: float = 0.6) -> dict[str, float]:
    """The folded layer of ``bench layer`` (one drawn input and fold mask) on both backends and dtypes, against the
    fp32 torch engine: max |error| of each, and the reference's max |value|."""
    from specfold.bench.layer import layer_case

    kw = dict(branches=7, block=32, prefix=512, seed=0, device=device)
    with torch.inference_mode():
        out = {(dt, be): layer_case(shape, fold_ratio, dtype=dt, backend=be, **kw).folded().float()
               for dt in (torch.float32, torch.bfloat16) for be in ("torch", "triton")}
    ref = out[(torch.float32, "torch")]
    errs = {f"{str(dt).removeprefix('torch.')}_{be}": (o - ref).abs().max().item() for (dt, be), o in out.items()}
    return {**errs, "scale": ref.abs().max().item()}


def test_bench_layer_triton_on_cuda():
    from specfold.bench.layer import bench_layer

    # the layer's outputs: fp32 triton = fp32 torch up to reassociation; bf16 triton by the FlashAttention rule
    e = layer_errors("fast-dllm-v2-1.5b", DEVICE)
    assert e["float32_triton"] <= 1e-4 * e["scale"], e
    assert e["bfloat16_triton"] <= 2 * e["bfloat16_torch"] + 1e-3 * e["scale"], e
    kw = dict(branches=7, block=32, prefix=512, dtype=torch.bfloat16, repeats=5, warmup=2)
    got = bench_layer("fast-dllm-v2-1.5b", 0.6, backend="triton", device=DEVICE, **kw)
    ref = bench_layer("fast-dllm-v2-1.5b", 0.6, backend="torch", device=DEVICE, **kw)
    # the fold mask is drawn on the CPU from the seed: the same mask, hence the same realised ratio and FLOP limit
    assert got.realised_fold_ratio == ref.realised_fold_ratio and 0.4 < got.realised_fold_ratio < 0.8
    assert got.flop_limit_ratio == ref.flop_limit_ratio and 0 < got.flop_limit_ratio < 1
