"""How a verification pass's time grows with the rows it verifies, on this machine: dense passes of the embedded
model over K = 1, 2, 4, 8 branches (bf16, one thread, medians of interleaved repeats). Where the time grows with K
in proportion, a pass over B + 1 branches costs (B + 1)x a vanilla pass, and speculation can only beat vanilla by
cutting NFE by more than 1 - 1/(B + 1).

    python scripts/pass_scaling.py [--dtype bf16] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
from functools import partial

import torch

import specfold
from specfold.engine.dense import DenseVerifier
from specfold.timing import interleaved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prefix", type=int, default=160)
    args = ap.parse_args()
    torch.set_num_threads(1)
    net = specfold.load_model(dtype=args.dtype).net
    gen = torch.Generator().manual_seed(0)
    cache = net.new_cache(args.prefix + 32)
    net(torch.randint(0, net.cfg.vocab_size - 1, (1, args.prefix), generator=gen), cache, mask="block_causal",
        write_cache=True)
    verifier = DenseVerifier(net)
    branches = [1, 2, 4, 8]
    inputs = {k: (torch.randint(0, net.cfg.vocab_size - 1, (k, 32), generator=gen),
                  torch.tensor([-1] + list(range(k - 1)))) for k in branches}
    times = interleaved({k: partial(verifier.verify, cache, *inputs[k]) for k in branches}, args.repeats)
    base = times[1].median
    for k in branches:
        med = times[k].median
        print(json.dumps({"branches": k, "dtype": args.dtype, "seconds": med, "spread": times[k].spread,
                          "vs_one_branch": med / base}))


if __name__ == "__main__":
    main()
