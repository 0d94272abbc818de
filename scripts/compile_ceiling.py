"""How much ``torch.compile`` can gain on a dense verification pass of the embedded model, on this machine.

A compiler fuses the framework ops around the heavy kernels; it does not make those kernels faster (inductor calls
the same BLAS for the GEMMs and the same fused SDPA kernel for attention). So a pass can run at best at its *kernel
floor*: the same linear layers (QKV, o_proj, gate/up, down in every layer, then the LM head) at the pass's row
count, with the model's own weights, and every layer's attention kernel (the pass's queries over the prefix and
their own block), one after the other and nothing else. ``eager ÷ floor`` is the most any compilation of the pass
can gain; ``eager ÷ compiled`` is what :mod:`specfold.engine.compiled` gains. Passes of K branches of 32 rows over a
prefix of P keys, one thread, the four timed side by side (interleaved rounds, medians).

    python scripts/compile_ceiling.py [--branches 1,3,8] [--prefix 160] [--dtype fp32] [--repeats 15] [--json]

``--decode N``: the same bound for whole decodes instead of passes. Each method decodes N held-out prompts per domain
eager at batch 1 under the profiler; ``kernels`` is the time inside the GEMM and attention kernels (``aten::mm``,
``addmm``, SDPA's flash kernel) — everything compiling cannot shrink — and ``wall ÷ kernels`` the most compiling
could raise its tokens/s (the profiler's own overhead lands in ``wall``, so the bound is generous).

    python scripts/compile_ceiling.py --decode 5 [--methods vanilla,spiffy,specfold] [--json]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

import specfold
from specfold.engine.compiled import compiled_forwards
from specfold.timing import interleaved


def gemm_floor(net, rows: int):
    """The pass's GEMMs alone: every layer's four linears and the head over ``rows`` rows (inputs made once)."""
    e = net.cfg.hidden_size
    x = torch.randn(rows, e, dtype=net.dtype)
    xo = torch.randn(rows, net.layers[0].wo.shape[1], dtype=net.dtype)
    xd = torch.randn(rows, net.layers[0].w_down.shape[1], dtype=net.dtype)

    def run() -> None:
        for layer in net.layers:
            F.linear(x, layer.wqkv, layer.bqkv)
            F.linear(xo, layer.wo)
            F.linear(x, layer.w_gate_up)
            F.linear(xd, layer.w_down)
        F.linear(x, net.head_weight())

    return run


def attention_floor(net, k: int, prefix: int):
    """Every layer's attention kernel alone: ``k`` branches of 32 queries over ``prefix + 32`` keys each (the fused
    SDPA call of :func:`specfold.model.attention.attend_fused`, its inputs made once)."""
    layer = net.layers[0]
    q = torch.randn(k, layer.hq, 32, layer.d, dtype=net.dtype)
    kv = torch.randn(k, layer.hkv, prefix + 32, layer.d, dtype=net.dtype)

    def run() -> None:
        for _ in net.layers:
            F.scaled_dot_product_attention(q, kv, kv, scale=net.scale, enable_gqa=layer.hq != layer.hkv)

    return run


# the kernels compiling reuses as they are: inductor calls the same BLAS and the same flash attention
KERNELS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::_scaled_dot_product_flash_attention_for_cpu")


def decode_bound(methods: list[str], per_domain: int, dtype: str) -> list[dict]:
    """Each method's eager batch-1 decode of ``per_domain`` held-out prompts per domain: wall seconds, seconds in
    :data:`KERNELS`, and their ratio (see the module docstring)."""
    from torch.profiler import profile

    from specfold.api import decode_config_for, encode_prompt, prepare_method
    from specfold.config import MethodConfig
    from specfold.decoding.decoder import decode
    from specfold.eval.tasks.synthetic import TASKS, load_split

    model = specfold.load_model(dtype=dtype)
    cfg = decode_config_for(model, 64)
    prompts = [encode_prompt(model, s.prompt) for t in TASKS for s in load_split(t, "test", limit=per_domain)]
    out = []
    for name in methods:
        m = prepare_method(model, MethodConfig(name, compile=False), cfg)
        with torch.no_grad():
            decode(model, prompts[0], cfg, verifier=m.verifier, drafter=m.drafter)  # warm-up
            with profile() as prof:
                t0 = time.perf_counter()
                tokens = sum(len(decode(model, ids, cfg, verifier=m.verifier, drafter=m.drafter).token_ids)
                             for ids in prompts)
                wall = time.perf_counter() - t0
        kernels = sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in KERNELS) / 1e6
        out.append({"method": name, "prompts": len(prompts), "tokens": tokens, "dtype": dtype, "wall_s": wall,
                    "kernel_s": kernels, "bound": wall / kernels})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--branches", default="1,3,8", help="K values, comma-separated (default 1,3,8)")
    ap.add_argument("--prefix", type=int, default=160, help="cached prefix keys (default 160)")
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--json", action="store_true", help="one JSON object per K")
    ap.add_argument("--decode", type=int, default=0, metavar="N",
                    help="instead: whole eager decodes of N held-out prompts per domain (see above)")
    ap.add_argument("--methods", default="vanilla,spiffy,specfold", help="with --decode (default: all three)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.decode:
        rows = decode_bound(args.methods.split(","), args.decode, args.dtype)
        for r in rows:
            if args.json:
                print(json.dumps(r))
            else:
                print(f"{r['method']:>9}: {r['prompts']} prompts, {r['tokens']} tokens, wall {r['wall_s']:.2f} s, in "
                      f"GEMM + attention kernels {r['kernel_s']:.2f} s: compiling can raise tokens/s at most "
                      f"{r['bound']:.2f}x")
        return
    net = specfold.load_model(dtype=args.dtype).net
    gen = torch.Generator().manual_seed(0)
    cache = net.new_cache(args.prefix + 32)
    net.prefill(torch.randint(0, net.cfg.vocab_size - 1, (args.prefix,), generator=gen), cache, mask="block_causal")
    forwards = compiled_forwards(net)
    results = []
    with torch.no_grad():
        for k in [int(x) for x in args.branches.split(",")]:
            states = torch.randint(0, net.cfg.vocab_size - 1, (k, 32), generator=gen)
            t0 = time.perf_counter()
            forwards.forward(states, cache, mask="bidirectional")
            compile_s = time.perf_counter() - t0
            gemms, attention = gemm_floor(net, k * 32), attention_floor(net, k, args.prefix)
            runs = {
                "eager": lambda s=states: net(s, cache, mask="bidirectional"),
                "compiled": lambda s=states: forwards.forward(s, cache, mask="bidirectional"),
                "gemms": gemms,
                "floor": lambda g=gemms, a=attention: (g(), a()),
            }
            t = interleaved(runs, args.repeats, warmup=2)
            e, c, g, f = (t[x].median for x in ("eager", "compiled", "gemms", "floor"))
            results.append({"branches": k, "rows": k * 32, "prefix": args.prefix, "dtype": args.dtype,
                            "eager_ms": e * 1e3, "compiled_ms": c * 1e3, "gemm_ms": g * 1e3, "floor_ms": f * 1e3,
                            "compiled_gain": e / c, "ceiling": e / f, "first_call_s": compile_s})
    if args.json:
        for r in results:
            print(json.dumps(r))
        return
    print(f"embedded model, {args.dtype}, one thread, prefix {args.prefix}, "
          f"medians of {args.repeats} interleaved rounds")
    print(f"{'K':>3} {'rows':>5} {'eager ms':>9} {'compiled':>9} {'GEMMs':>7} {'floor':>7} {'gain':>6} {'ceiling':>8}")
    for r in results:
        print(f"{r['branches']:>3} {r['rows']:>5} {r['eager_ms']:>9.2f} {r['compiled_ms']:>9.2f} "
              f"{r['gemm_ms']:>7.2f} {r['floor_ms']:>7.2f} {r['compiled_gain']:>6.2f} {r['ceiling']:>8.2f}")
    print("floor: the GEMMs and the attention kernels alone; ceiling = eager / floor, the most compiling can gain")


if __name__ == "__main__":
    main()
