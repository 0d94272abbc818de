"""What one batched pass costs, for the README's "Batched decoding" section.

1. A dense forward of R requests' blocks (one branch each; ``forward_ragged``), R = 1 and R = --batch: the bound on
   vanilla's batch gain (R times the rows for how much more time). Beside it, the forward's GEMMs alone (every
   layer's Q/K/V, output, gate/up and down projections and the LM head, timed on their own at the pass's row
   count): ``ideal_gain`` = R · GEMMs(1) / GEMMs(R) is the gain with every other op free, ``amortised_gain`` =
   R · forward(1) / GEMMs(R) the gain if R = 1 kept all its other costs and R = --batch paid none,
   ``forward_gain`` the measured R · forward(1) / forward(R). ``other_ms`` is the forward's time outside the GEMMs;
   ``other_growth`` how much it grows from R = 1 to R = --batch, ``other_growth_for_3x`` the most it may grow for a
   3× gain with the GEMMs as measured (below 1: 3× is out of reach even if the other ops cost nothing more).
2. The drafting passes of a spiffy batch decode at R = --batch, recorded as they happen and each re-timed (after a
   warm-up call) with the dense verifier and with the folded verifier in three settings: the default cost rule
   (``auto``), and folding wherever the gate says with attention ``direct`` or ``correct`` (Eq. 8).
3. ``free_branch_bound``: a clean spiffy batch decode at R = --batch (wall time, and the time of its drafting passes
   as they ran); then each drafting pass re-timed, interleaved, dense and as the forward of its main rows alone (one
   block per request: what the pass would cost if every draft row were free). ``bound`` = wall / (wall − drafting
   time · main-only / dense) is the most any verifier that drafts what spiffy drafts (specfold included, whatever
   it folds) can gain over spiffy at R = --batch: prefill, the cache-writing forwards and the passes without drafts
   stay as they are. ``bound_at_fold``: the same with the draft rows charged only for the share of their work that
   folding at δ = 0.1 leaves to compute on those passes (attention-part and FFN rows weighted by their MACs) and no
   folding overhead at all; beside them specfold's own decode of the queue (``specfold_vs_spiffy``, measured).
4. ``any_policy_bound``: part 3's bound for a verifier free to draft with any cost-aware policy of the shipped
   graph (:func:`~specfold.decoding.calibration.select_policy` at each draft cost in ``DRAFT_COSTS``, replayed on
   the shipped calibration paths). A request's pass is charged part 3's measured time per main row plus, per draft
   row, the measured dense time per draft row times the share folding leaves: ``zero_overhead`` (part 3's
   ``branch_work_kept_at_delta_0.1``) or ``measured`` (what part 2's ``auto`` pass costs over its main rows, as a
   share of the dense pass's). The best policy's verify time relative to spiffy's shipped policy
   (``verify_vs_spiffy``, a model from the replayed paths) scales spiffy's measured verify time;
   ``bound`` = wall / (wall − verify time · (1 − verify_vs_spiffy)); ``bound_only_prefill_kept`` the same if
   everything outside the verification passes but prefill (cache-writing forwards, drafting, host work) were free.
5. ``extra_ops_per_layer``: on the largest recorded pass, the framework ops a folded layer dispatches for each
   choice of the cost rule beyond its dense counterpart inside the same folded layer (the gate is paid either way):
   attention ``direct`` and ``correct`` against a dense attention part, a folded FFN against a dense one — the
   counts behind ``OPS_DIRECT``, ``OPS_CORRECT`` and ``OPS_FFN`` in ``specfold/engine/cost.py``.

    python scripts/batch_pass_costs.py [--prompts 24] [--batch 8] [--dtype bf16]
    python scripts/batch_pass_costs.py --shape fast-dllm-v2-1.5b [--layers 2] [--vocab 32768]   # part 1 only

``--shape``: part 1 on the random-weight model of ``specfold bench batch --shape`` (its prompts too).

Prints one JSON object. One CPU thread; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import collections
import json
import time

import torch

from specfold.api import PATHS_FILE, decode_config_for, load_model, prepare_method
from specfold.bench.batch import held_out_prompts, random_shape_model
from specfold.bench.ops import count_ops
from specfold.decoding.acceptance import CalibrationPaths, replay_paths
from specfold.decoding.batch import decode_batch
from specfold.decoding.calibration import select_policy
from specfold.engine.base import fold_ratio
from specfold.engine.cost import LayerCost
from specfold.engine.folded import FoldedVerifier
from specfold.model.cache import BatchCache
from specfold.model.linear import linear
from specfold.model.loading import parse_dtype

DRAFT_COSTS = (0.0, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5)  # policies tried by part 4 (0.5: no drafting here)


def forward_ms(model, prompts, r: int, repeats: int = 20) -> float:
    net, c = model.net, model.config
    cache = BatchCache(c.num_layers, r, c.num_kv_heads, c.head_dim, 512, net.dtype)
    for s in range(r):
        net.prefill(torch.tensor(prompts[s][:64]), cache.slot(s), mask="block_causal")
    tokens = torch.randint(0, c.vocab_size - 2, (r, 1, c.block_size), generator=torch.Generator().manual_seed(0))
    slots, lengths = torch.arange(r), torch.tensor([cache.slot(s).length for s in range(r)])
    with torch.no_grad():
        net.forward_ragged(tokens, cache, slots, lengths)
        t = time.perf_counter()
        for _ in range(repeats):
            net.forward_ragged(tokens, cache, slots, lengths)
    return (time.perf_counter() - t) / repeats * 1e3


def gemm_ms(model, rows: int, repeats: int = 20) -> float:
    """The GEMMs of one forward over ``rows`` block rows, timed alone (the model's weights, bucketed like the model)."""
    net, c = model.net, model.config
    x = torch.randn(rows, c.hidden_size).to(net.dtype)
    wide = torch.randn(rows, c.intermediate_size).to(net.dtype)

    def run() -> None:
        for layer in net.layers:
            linear(x, layer.wqkv, layer.bqkv)
            linear(x, layer.wo)
            linear(x, layer.w_gate_up)
            linear(wide, layer.w_down)
        linear(x, net.head_weight())

    with torch.no_grad():
        run()
        t = time.perf_counter()
        for _ in range(repeats):
            run()
    return (time.perf_counter() - t) / repeats * 1e3


class Forced:
    """A cost rule that always makes the same choices (for counting what each choice dispatches)."""

    def __init__(self, attention: str, ffn: bool) -> None:
        self.attention, self.ffn = attention, ffn

    def attention_plan(self, *args, **kwargs) -> str:
        return self.attention

    def ffn_folds(self, *args) -> bool:
        return self.ffn


def extra_ops_per_layer(model, batch) -> dict[str, float]:
    """Ops per layer of each choice minus its dense counterpart's, on one recorded pass."""
    def ops(attention: str, ffn: bool) -> float:
        v = FoldedVerifier(model.net, 0.1, cost=Forced(attention, ffn))
        return count_ops(lambda: v.verify_batch(batch)).total / len(model.net.layers)

    base = ops("dense", True)
    return {"direct": ops("direct", True) - base, "correct": ops("correct", True) - base,
            "ffn": base - ops("dense", False)}


def free_branch_bound(model, prompts, cfg, method, r: int) -> dict[str, float]:
    """Part 3 of the module docstring."""
    verifier = method.verifier
    dense = verifier.verify_batch
    drafting: list = []
    spent = verifying = 0.0

    def timed(batch):
        nonlocal spent, verifying
        t = time.perf_counter()
        out = dense(batch)
        took = time.perf_counter() - t
        verifying += took
        if batch.states.shape[1] > 1:
            spent += took
            drafting.append(batch)
        return out

    decode_batch(model, prompts[:r], cfg, method, max_batch=r)  # warm-up
    verifier.verify_batch = timed
    try:
        t0 = time.perf_counter()
        prefill = sum(res.prefill_seconds for res in decode_batch(model, prompts, cfg, method, max_batch=r))
        wall = time.perf_counter() - t0
    finally:
        verifier.verify_batch = dense
    net, again, main_only = model.net, 0.0, 0.0
    with torch.no_grad():
        for batch in drafting:  # interleaved: the pass as run, then its main rows alone
            t = time.perf_counter()
            dense(batch)
            t1 = time.perf_counter()
            net.forward_ragged(batch.states[:, 0], batch.cache, batch.slots, batch.lengths)
            again += t1 - t
            main_only += time.perf_counter() - t1
    x = main_only / again
    request_passes = sum(b.states.shape[0] for b in drafting)
    draft_rows = sum(sum(b.branches) for b in drafting) - request_passes
    # The share of the draft rows' work that folding at δ = 0.1 leaves to compute (attention-part rows at the
    # layer-input gate, FFN rows at the FFN gate, weighted by their MACs), from a specfold decode of the same queue:
    # how far below dense a folded pass with no folding overhead could get.
    c = model.config
    per_row = LayerCost.of(c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size, 0.0)
    specfold = prepare_method(model, "specfold", cfg.small_block_size, block_size=cfg.block_size, delta=0.1)
    stats = collections.Counter()
    decode_batch(model, prompts[:r], cfg, specfold, max_batch=r)  # warm-up
    t0 = time.perf_counter()
    results = decode_batch(model, prompts, cfg, specfold, max_batch=r)
    specfold_wall = time.perf_counter() - t0
    for res in results:
        stats.update(res.engine_stats)
    attention = per_row.qkv + per_row.o
    kept = (attention * (1 - fold_ratio(stats)) + per_row.ffn * (1 - fold_ratio(stats, "ffn"))) / (
        attention + per_row.ffn)
    at_fold = x + kept * (1 - x)
    return {"wall_s": wall, "drafting_passes": len(drafting), "drafting_s": spent, "main_only_vs_dense": x,
            "wall_free_branches_s": wall - spent * (1 - x), "bound": wall / (wall - spent * (1 - x)),
            "branch_work_kept_at_delta_0.1": kept, "zero_overhead_fold_vs_dense": at_fold,
            "bound_at_fold": wall / (wall - spent * (1 - at_fold)),
            "specfold_wall_s": specfold_wall, "specfold_vs_spiffy": wall / specfold_wall,
            "verify_s": verifying, "prefill_s": prefill, "main_row_s": main_only / request_passes,
            "draft_row_s": (again - main_only) / draft_rows}


def any_policy_bound(model, graph, part3: dict, folded_vs_dense: float) -> dict:
    """Part 4 of the module docstring."""
    paths = CalibrationPaths.load(model.path / PATHS_FILE)
    nodes = list(graph.nodes[1:])
    shipped = replay_paths(paths.blocks, nodes, {c: graph.active_formulas(c) for c, _ in graph.policy})
    u, v = part3["main_row_s"], part3["draft_row_s"]
    x = part3["main_only_vs_dense"]
    share = {"zero_overhead": part3["branch_work_kept_at_delta_0.1"],
             "measured": max(0.0, (folded_vs_dense - x) / (1 - x))}
    spiffy_cost = shipped.passes * (u + shipped.drafted_per_pass * v)
    wall, verify, prefill = part3["wall_s"], part3["verify_s"], part3["prefill_s"]
    out: dict = {"spiffy_policy": shipped.to_dict(), "draft_row_share": share}
    replays = {c: replay_paths(paths.blocks, nodes, select_policy(paths.blocks, nodes, c)) for c in DRAFT_COSTS}
    for name, kept in share.items():
        cost, ratio, a = min(((c, a.passes * (u + a.drafted_per_pass * v * kept) / spiffy_cost, a)
                              for c, a in replays.items()), key=lambda t: t[1])  # the first of equals wins
        out[name] = {"best_draft_cost": cost, "verify_vs_spiffy": ratio, "passes": a.passes,
                     "drafted_per_pass": a.drafted_per_pass, "bound": wall / (wall - verify * (1 - ratio)),
                     "bound_only_prefill_kept": (prefill + verify) / (prefill + verify * ratio)}
    return out


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
    forward = {r: forward_ms(model, prompts, r) for r in (1, args.batch)}
    gemms = {r: gemm_ms(model, r * model.config.block_size) for r in (1, args.batch)}
    report = {"dtype": args.dtype, "batch": args.batch, "dense_forward_ms": forward, "gemm_only_ms": gemms,
              "forward_gain": args.batch * forward[1] / forward[args.batch],
              "ideal_gain": args.batch * gemms[1] / gemms[args.batch],
              "amortised_gain": args.batch * forward[1] / gemms[args.batch]}
    other = {r: forward[r] - gemms[r] for r in forward}
    report["other_ms"] = other
    report["other_growth"] = other[args.batch] / other[1]
    report["other_growth_for_3x"] = (args.batch * forward[1] - 3 * gemms[args.batch]) / 3 / other[1]
    if args.shape is not None:
        report["shape"] = f"{args.shape} x{args.layers}L vocab {model.config.vocab_size}"
        print(json.dumps(report))
        return
    cfg = decode_config_for(model, 64, 0.9, None, "auto", None)
    spiffy = prepare_method(model, "spiffy", cfg.small_block_size, block_size=cfg.block_size)
    always = {"cost": None, "dense_fallback": False}
    verifiers = {"dense": spiffy.verifier, "auto": FoldedVerifier(model.net, 0.1),
                 "direct": FoldedVerifier(model.net, 0.1, attention="direct", **always),
                 "correct": FoldedVerifier(model.net, 0.1, attention="correct", **always)}
    seconds, counts = collections.Counter(), collections.Counter()
    recorded = []
    dense_verify = spiffy.verifier.verify_batch

    def timed(batch):
        if batch.states.shape[1] > 1:  # a drafting pass
            for name, v in verifiers.items():
                f = dense_verify if name == "dense" else v.verify_batch
                f(batch)
                t = time.perf_counter()
                f(batch)
                seconds[name] += time.perf_counter() - t
            counts["passes"] += 1
            counts["branch_rows"] += batch.states.shape[0] * batch.states.shape[1]
            counts["real_branches"] += sum(batch.branches)
            recorded.append(batch)
        return dense_verify(batch)

    spiffy.verifier.verify_batch = timed
    decode_batch(model, prompts, cfg, spiffy, max_batch=args.batch)
    report["drafting_passes"] = dict(counts)
    report["pass_ms"] = {k: 1e3 * v / counts["passes"] for k, v in seconds.items()}
    report["vs_dense"] = {k: v / seconds["dense"] for k, v in seconds.items()}
    report["extra_ops_per_layer"] = extra_ops_per_layer(model, max(recorded, key=lambda b: sum(b.branches)))
    spiffy.verifier.verify_batch = dense_verify
    report["free_branch_bound"] = free_branch_bound(model, prompts, cfg, spiffy, args.batch)
    report["any_policy_bound"] = any_policy_bound(model, spiffy.graph, report["free_branch_bound"],
                                                  report["vs_dense"]["auto"])
    print(json.dumps(report))


if __name__ == "__main__":
    main()
