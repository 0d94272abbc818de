"""What one batched pass costs: the measurements behind docs/results.md's "Batched decoding" figures.

1. A dense forward of R requests' blocks (one branch each; ``forward_ragged``) at R = 1 and R = --batch, and the
   same forward's GEMMs alone (every layer's Q/K/V, output, gate/up and down projections and the LM head, at the
   pass's row count), interleaved, medians: ``forward_gain`` = R · forward(1) / forward(R), ``ideal_gain`` =
   R · GEMMs(1) / GEMMs(R) (every other op free), ``amortised_gain`` = R · forward(1) / GEMMs(R) (R = 1 keeps its
   other costs, R = --batch pays none); ``other_ms`` = forward − GEMMs, ``other_growth_for_3x`` the most the
   other ops may grow from R = 1 to R = --batch for a 3× gain (below 1: 3× is out of reach).
2. The drafting passes of a spiffy batch decode at R = --batch, recorded as they run and each re-timed (a warm-up
   call, then one timed call each, interleaved) with the dense verifier and the folded verifier at δ = 0.1 in three
   settings: the default cost rule (``auto``), and folding wherever the gate says with attention ``direct`` or
   ``correct`` (Eq. 8); ``vs_dense`` = each setting's time ÷ dense's.
3. ``extra_ops_per_layer``: on the largest recorded pass, the framework ops a folded layer dispatches for each
   choice of the cost rule beyond its dense counterpart inside the same folded layer: the counts behind
   ``OPS_DIRECT``, ``OPS_CORRECT`` and ``OPS_FFN`` in ``specfold/engine/cost.py``.

    python scripts/batch_pass_costs.py [--prompts 24] [--batch 8] [--dtype bf16]
    python scripts/batch_pass_costs.py --shape fast-dllm-v2-1.5b [--layers 2] [--vocab 32768]   # part 1 only

``--shape``: part 1 on the random-weight model of ``specfold bench batch --shape`` (its prompts too). Prints one JSON
object. One CPU thread; run it on a quiet machine. The free-branch and any-policy bounds quoted in docs/results.md
came from this script's longer version, ``git show d9101ac:scripts/batch_pass_costs.py``.
"""

from __future__ import annotations

import argparse
import collections
import json
from functools import partial

import torch

from specfold.api import decode_config_for, load_model, prepare_method
from specfold.bench.batch import held_out_prompts, random_shape_model
from specfold.bench.ops import count_ops
from specfold.config import MethodConfig
from specfold.decoding.decoder import decode_batch
from specfold.engine.folded import FoldedVerifier
from specfold.model.cache import BatchCache
from specfold.model.linear import linear
from specfold.model.loading import parse_dtype
from specfold.timing import interleaved


def forward_and_gemms_ms(model, prompts, r: int, repeats: int = 20) -> dict[str, float]:
    """Median ms of a dense forward of ``r`` requests' blocks and of its GEMMs alone (model's weights and buckets)."""
    net, c = model.net, model.config
    cache = BatchCache(c.num_layers, r, c.num_kv_heads, c.head_dim, 512, net.dtype)
    for s in range(r):
        net.prefill(torch.tensor(prompts[s][:64]), cache.slot(s), mask="block_causal")
    tokens = torch.randint(0, c.vocab_size - 2, (r, 1, c.block_size), generator=torch.Generator().manual_seed(0))
    slots, lengths = torch.arange(r), torch.tensor([cache.slot(s).length for s in range(r)])
    x = torch.randn(r * c.block_size, c.hidden_size).to(net.dtype)
    wide = torch.randn(r * c.block_size, c.intermediate_size).to(net.dtype)

    def gemms() -> None:
        for layer in net.layers:
            linear(x, layer.wqkv, layer.bqkv)
            linear(x, layer.wo)
            linear(x, layer.w_gate_up)
            linear(wide, layer.w_down)
        linear(x, net.head_weight())

    with torch.no_grad():
        t = interleaved({"forward": lambda: net.forward_ragged(tokens, cache, slots, lengths), "gemms": gemms},
                        repeats, device=net.device)
    return {name: timing.median * 1e3 for name, timing in t.items()}


class Forced:
    """A cost rule that always makes the same choices (for counting what each choice dispatches)."""

    def __init__(self, attention: str, ffn: bool) -> None:
        self.attention, self.ffn = attention, ffn

    def attention_plan(self, *args, **kwargs) -> str:
        return self.attention

    def ffn_folds(self, *args) -> bool:
        return self.ffn


def extra_ops_per_layer(model, batch) -> dict[str, float]:
    """Ops per layer of each choice minus its dense counterpart's, on one recorded pass (part 3)."""
    def ops(attention: str, ffn: bool) -> float:
        v = FoldedVerifier(model.net, 0.1, cost=Forced(attention, ffn))
        return count_ops(lambda: v.verify_batch(batch)).total / len(model.net.layers)

    base = ops("dense", True)
    return {"direct": ops("direct", True) - base, "correct": ops("correct", True) - base,
            "ffn": base - ops("dense", False)}


def drafting_passes(model, prompts, batch: int) -> dict:
    """Part 2 (and 3) of the module docstring."""
    cfg = decode_config_for(model, 64)
    spiffy = prepare_method(model, MethodConfig(method="spiffy"), cfg)
    dense = spiffy.verifier.verify_batch
    always = {"cost": None, "dense_fallback": False}
    verifiers = {"dense": dense, "auto": FoldedVerifier(model.net, 0.1).verify_batch,
                 "direct": FoldedVerifier(model.net, 0.1, attention="direct", **always).verify_batch,
                 "correct": FoldedVerifier(model.net, 0.1, attention="correct", **always).verify_batch}
    seconds, counts, recorded = collections.Counter(), collections.Counter(), []

    def timed(batch):
        if batch.states.shape[1] > 1:  # a drafting pass
            t = interleaved({name: partial(f, batch) for name, f in verifiers.items()}, repeats=1,
                            device=model.net.device)
            seconds.update({name: timing.median for name, timing in t.items()})
            counts["passes"] += 1
            counts["branch_rows"] += batch.states.shape[0] * batch.states.shape[1]
            counts["real_branches"] += sum(batch.branches)
            recorded.append(batch)
        return dense(batch)

    spiffy.verifier.verify_batch = timed
    try:
        decode_batch(model, prompts, cfg, spiffy, max_batch=batch)
    finally:
        spiffy.verifier.verify_batch = dense
    return {"drafting_passes": dict(counts),
            "pass_ms": {k: 1e3 * v / counts["passes"] for k, v in seconds.items()},
            "vs_dense": {k: v / seconds["dense"] for k, v in seconds.items()},
            "extra_ops_per_layer": extra_ops_per_layer(model, max(recorded, key=lambda b: sum(b.branches)))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=24)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--shape", default=None, help="part 1 on a random-weight model at this shape")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    model = load_model(None, dtype=args.dtype)
    tasks = ["synth-math", "synth-code", "synth-if"]
    if args.shape is not None:
        text = model
        model = random_shape_model(args.shape, args.layers, args.vocab, parse_dtype(args.dtype))
        prompts = held_out_prompts(text, tasks, args.prompts, model.config.vocab_size)
    else:
        prompts = held_out_prompts(model, tasks, args.prompts)
    r = args.batch
    ms = {n: forward_and_gemms_ms(model, prompts, n) for n in (1, r)}
    forward, gemms = {n: m["forward"] for n, m in ms.items()}, {n: m["gemms"] for n, m in ms.items()}
    other = {n: forward[n] - gemms[n] for n in ms}
    report = {"dtype": args.dtype, "batch": r, "dense_forward_ms": forward, "gemm_only_ms": gemms,
              "forward_gain": r * forward[1] / forward[r], "ideal_gain": r * gemms[1] / gemms[r],
              "amortised_gain": r * forward[1] / gemms[r], "other_ms": other, "other_growth": other[r] / other[1],
              "other_growth_for_3x": (r * forward[1] - 3 * gemms[r]) / 3 / other[1]}
    if args.shape is not None:
        report["shape"] = f"{args.shape} x{args.layers}L vocab {model.config.vocab_size}"
    else:
        report.update(drafting_passes(model, prompts, r))
    print(json.dumps(report))


if __name__ == "__main__":
    main()
