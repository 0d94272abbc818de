"""Peak RSS and prefill time of ``specfold generate`` against prompt length, two source trees side by side.

    OMP_NUM_THREADS=1 python scripts/long_prompt_bench.py --before /path/to/old/src --out /tmp/long-prompt
    OMP_NUM_THREADS=1 python scripts/long_prompt_bench.py --chunks 256,512,1024,2048 --lengths 4096,16384

Writes (once) a random-weight checkpoint whose config.json is the published Nemotron-Labs-Diffusion-8B config
with 2 layers, 8 query / 2 KV heads, hidden 256 (other dimensions: ``--head-dim``, ``--ffn``, ``--vocab``), and
one prompt file per length. For each length and repeat it runs, interleaved (before, after, before, after …),

    specfold generate --model DIR --prompt-ids @ids-L.txt --max-new-tokens 32 --dtype bf16 --json

(``--chunks`` instead compares ``--prefill-chunk`` values of the new tree; ``--prefill-only`` stops each run after
its prefill) under ``/usr/bin/time -v`` (peak RSS) and an address-space limit (``--mem-limit-gb``, so that a tree
that tries a huge allocation fails instead of swamping the machine). The prefill is timed by wrapping the family's
start protocol (the prefill call) in a timer, the same way for every tree (``model.families`` today,
``decoding.decoder.PROTOCOLS`` in older trees); ``@FILE`` is expanded by the wrapper, since older trees take ids
inline only and 64k ids outgrow one command-line argument. Prints a Markdown table of medians and appends every run to
``OUT/runs.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

# The published NLD-8B config.json (fields as confirmed in SPEC §2); the bench shrinks the dimensions below.
NLD_8B = {
    "architectures": ["NemotronLabsDiffusionModel"],
    "model_type": "nemotron_labs_diffusion",
    "vocab_size": 131072,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 34,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 11,
    "mask_token_id": 100,
    "block_size": 32,
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 1000000.0,
        "factor": 16.0,
        "original_max_position_embeddings": 16384,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "llama_4_scaling_beta": 0.1,
    },
    "torch_dtype": "bfloat16",
}

# Times the prefill (the family's start protocol), expands --prompt-ids @FILE, caps the address space, runs the CLI.
WRAPPER = """
import dataclasses, json, os, resource, sys, time
limit = int(float(os.environ.get("BENCH_MEM_LIMIT_GB", "0")) * 2**30)
if limit:
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
try:  # one module per family, registered by name and model_type
    from specfold.model import families
    registries = [families.FAMILIES, families.MODEL_TYPES]
except ImportError:  # trees before the decoding core: the protocols lived in the decoder
    from specfold.decoding import decoder
    registries = [decoder.PROTOCOLS]
from specfold.cli import main
spent = []
for registry in registries:
    for key, proto in list(registry.items()):
        def timed(*a, _start=proto.start, **k):
            t = time.perf_counter()
            out = _start(*a, **k)
            spent.append(time.perf_counter() - t)
            if os.environ.get("BENCH_PREFILL_ONLY"):
                print("BENCH " + json.dumps({"prefill_seconds": sum(spent)}), file=sys.stderr)
                sys.stderr.flush()
                os._exit(0)
            return out
        registry[key] = dataclasses.replace(proto, start=timed)
argv = sys.argv[1:]
i = argv.index("--prompt-ids") + 1
if argv[i].startswith("@"):
    argv[i] = ",".join(open(argv[i][1:]).read().split())
code = main(argv)
print("BENCH " + json.dumps({"prefill_seconds": sum(spent)}), file=sys.stderr)
sys.exit(code)
"""


def write_checkpoint(out: Path, head_dim: int, ffn: int, vocab: int) -> Path:
    from specfold.model.families import config_from_dict
    from specfold.model.random_checkpoint import random_model, save_checkpoint

    ckpt = out / f"nld8b-2l-256h-d{head_dim}-f{ffn}-v{vocab}"
    if (ckpt / "model.safetensors").is_file():
        return ckpt
    cfg = {**NLD_8B, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
           "hidden_size": 256, "head_dim": head_dim, "intermediate_size": ffn, "vocab_size": vocab}
    model = random_model(config_from_dict(cfg), seed=0)
    save_checkpoint(model, ckpt, cfg)
    return ckpt


def prompt_file(out: Path, length: int, vocab: int) -> Path:
    path = out / f"ids-{length}.txt"
    if not path.is_file():
        lo = 200  # above the special ids (bos 1, eos 11, mask 100)
        path.write_text(",".join(str(lo + (i * 7919 + 13) % (vocab - lo)) for i in range(length)) + "\n")
    return path


def run_once(src: str, extra: list[str], ckpt: Path, ids: Path, args: argparse.Namespace) -> dict:
    argv = ["generate", "--model", str(ckpt), "--prompt-ids", f"@{ids}", "--max-new-tokens", "32", "--dtype", "bf16",
            "--json", *extra]
    env = {**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": "1", "BENCH_MEM_LIMIT_GB": str(args.mem_limit_gb)}
    if args.prefill_only:
        env["BENCH_PREFILL_ONLY"] = "1"
    proc = subprocess.run(["/usr/bin/time", "-v", sys.executable, "-c", WRAPPER, *argv], env=env,
                          capture_output=True, text=True, timeout=args.timeout)
    err = proc.stderr
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", err)
    status = re.search(r"Exit status: (\d+)", err)
    rec: dict = {"peak_rss_mb": int(rss.group(1)) / 1024 if rss else None,
                 "exit": int(status.group(1)) if status else proc.returncode}
    bench = re.search(r"^BENCH (.*)$", err, re.M)
    if bench:
        rec.update(json.loads(bench.group(1)))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if rec["exit"] == 0 and args.prefill_only and bench:
        pass
    elif rec["exit"] == 0 and lines:
        out = json.loads(lines[-1])
        rec.update(decode_seconds=out["seconds"], tokens=out["token_ids"], prefill_forwards=out["prefill_forwards"])
    else:
        # the last informative line of the failure (e.g. "RuntimeError: DefaultCPUAllocator: can't allocate ...")
        tail = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith(("\t", "Command being timed"))]
        rec["error"] = next((ln for ln in tail if "Error" in ln or "error" in ln), tail[-1] if tail else "")[:200]
    return rec


def fmt(runs: list[dict]) -> tuple[str, str, float | None]:
    ok = [r for r in runs if r["exit"] == 0]
    if not ok:
        return f"fails ({runs[0].get('error', '?')[:60]})", f"{max(r['peak_rss_mb'] or 0 for r in runs):,.0f}*", None
    pre = statistics.median(r["prefill_seconds"] for r in ok)
    rss = statistics.median(r["peak_rss_mb"] for r in ok)
    return f"{pre:.2f}", f"{rss:,.0f}", pre


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = str(Path(__file__).resolve().parents[1] / "src")
    p.add_argument("--before", default=None, help="src/ directory of the baseline tree")
    p.add_argument("--after", default=here, help=f"src/ directory of the new tree (default {here})")
    p.add_argument("--out", default="/tmp/long-prompt-bench", help="checkpoint, prompts and runs.jsonl go here")
    p.add_argument("--lengths", default="1024,4096,16384,65536")
    p.add_argument("--repeats", default="3,3,2,1", help="repeats per length (one value, or one per length)")
    p.add_argument("--skip-before-from", type=int, default=None,
                   help="run the baseline only once at and past this length (it fails there; one run shows how)")
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--ffn", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--prefill-chunk", type=int, default=None, help="pass --prefill-chunk to the new tree")
    p.add_argument("--chunks", default=None, help="compare these --prefill-chunk values of the new tree instead")
    p.add_argument("--prefill-only", action="store_true", help="end each run after the prefill (no decoding)")
    p.add_argument("--mem-limit-gb", type=float, default=12.0)
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
    args = p.parse_args()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ckpt = write_checkpoint(out, args.head_dim, args.ffn, args.vocab)
    lengths = [int(x) for x in args.lengths.split(",")]
    reps = [int(x) for x in args.repeats.split(",")]
    reps = reps * len(lengths) if len(reps) == 1 else reps
    if args.chunks:
        sides = [(f"chunk {c}", args.after, ["--prefill-chunk", c]) for c in args.chunks.split(",")]
    elif args.before:
        extra = ["--prefill-chunk", str(args.prefill_chunk)] if args.prefill_chunk else []
        sides = [("before", args.before, []), ("after", args.after, extra)]
    else:
        p.error("give --before SRC (before/after table) or --chunks LIST (chunk-size table)")
    rows = []
    with open(out / "runs.jsonl", "a") as log:
        for length, n in zip(lengths, reps, strict=True):
            ids = prompt_file(out, length, args.vocab)
            runs: dict[str, list[dict]] = {label: [] for label, _, _ in sides}
            for rep in range(n):
                for i, (label, src, extra) in enumerate(sides):
                    if i == 0 and rep and args.skip_before_from and length >= args.skip_before_from:
                        continue
                    rec = run_once(src, extra, ckpt, ids, args)
                    rec.update(side=label, length=length, repeat=rep, checkpoint=ckpt.name)
                    log.write(json.dumps(rec) + "\n")
                    log.flush()
                    shown = {k: v for k, v in rec.items() if k in ("peak_rss_mb", "exit", "prefill_seconds", "error")}
                    print(f"{label:10s} {length:6d} #{rep}: " + json.dumps(shown), file=sys.stderr)
                    runs[label].append(rec)
            cells = [fmt(runs[label]) for label, _, _ in sides]
            base = cells[0][2]
            ratios = [f"{c[2] / base:.2f}" if c[2] and base else "–" for c in cells[1:]]
            same = {tuple(r["tokens"]) for rs in runs.values() for r in rs if "tokens" in r}
            ok = all(r["exit"] == 0 for rs in runs.values() for r in rs)
            verdict = "–" if not (ok and same) else "yes" if len(same) == 1 else "no"
            rows.append(f"| {length:,} | " + " | ".join(f"{rss} | {pre}" for pre, rss, _ in cells)
                        + f" | {' | '.join(ratios)} | {verdict} |")
    first = sides[0][0]
    print(f"checkpoint: {ckpt.name} (bf16, OMP_NUM_THREADS=1, medians; * = peak before the failure)")
    print("| prompt | " + " | ".join(f"{label}: peak RSS MB | {label}: prefill s" for label, _, _ in sides)
          + " | " + " | ".join(f"prefill {label} / {first}" for label, _, _ in sides[1:]) + " | same tokens |")
    print("|---:|" + "---:|" * (3 * len(sides) - 1) + ":---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
