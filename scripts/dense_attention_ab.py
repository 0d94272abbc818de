"""The dense forward's attention, fused (``attend_fused``: one SDPA flash call per group of branches) against the
explicit-score form it replaced (``attend(...).o``: score GEMMs, exp and reductions over rows x keys per head), in
the embedded model's dense pass, eager and compiled, side by side in one process (interleaved rounds, medians).
Passes of K branches of 32 rows over a prefix of P keys, one thread.

    python scripts/dense_attention_ab.py [--branches 1,3,8] [--prefix 160] [--dtype fp32] [--repeats 15]
"""

from __future__ import annotations

import argparse

import torch

import specfold
from specfold.engine.compiled import compiled_forwards
from specfold.model import transformer
from specfold.model.attention import attend, attend_fused
from specfold.timing import interleaved


def explicit(q, prefix_k, prefix_v, block_k, block_v, bias, scale):
    return attend(q, prefix_k, prefix_v, block_k, block_v, bias, scale).o


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--branches", default="1,3,8")
    ap.add_argument("--prefix", type=int, default=160)
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(1)
    net = specfold.load_model(dtype=args.dtype).net
    gen = torch.Generator().manual_seed(0)
    cache = net.new_cache(args.prefix + 32)
    net.prefill(torch.randint(0, net.cfg.vocab_size - 1, (args.prefix,), generator=gen), cache, mask="block_causal")
    forwards = compiled_forwards(net)

    def with_attention(fn, run):
        def go():
            transformer.attend_fused = fn  # the forward reads it at call time (dynamo guards on it: one graph each)
            return run()
        return go

    print(f"embedded model, {args.dtype}, one thread, prefix {args.prefix}, ms, medians of {args.repeats} rounds")
    print(f"{'K':>3} {'eager explicit':>15} {'eager fused':>12} {'compiled explicit':>18} {'compiled fused':>15}")
    with torch.no_grad():
        for k in [int(x) for x in args.branches.split(",")]:
            s = torch.randint(0, net.cfg.vocab_size - 1, (k, 32), generator=gen)
            eager = lambda s=s: net(s, cache, mask="bidirectional")
            comp = lambda s=s: forwards.forward(s, cache, mask="bidirectional")
            runs = {"eager explicit": with_attention(explicit, eager),
                    "eager fused": with_attention(attend_fused, eager),
                    "compiled explicit": with_attention(explicit, comp),
                    "compiled fused": with_attention(attend_fused, comp)}
            for run in runs.values():  # compile each variant before timing
                run()
            t = interleaved(runs, args.repeats, warmup=2)
            transformer.attend_fused = attend_fused
            print(f"{k:>3} " + " ".join(f"{t[n].median * 1e3:>{len(n)}.2f}" for n in runs))


if __name__ == "__main__":
    main()
