"""Teacher-forced arithmetic: can the model finish one line of a worked solution when given everything before it?

For each held-out synth-math problem and each line of its worked solution, the prompt is the problem plus the
reference solution up to and including that line's ``=``; the model (vanilla decoding) must produce the right
result. A line is right when the first generated line equals the reference result. This isolates arithmetic from
planning; the model card quotes it. Usage: ``python scripts/teacher_forced_math.py [MODEL_DIR] [--problems 60]``.
"""

import argparse
import json

import specfold
from specfold.api import encode_prompt
from specfold.eval.tasks.synthetic import load_split


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", default=None, help="checkpoint directory (default: the embedded model)")
    ap.add_argument("--problems", type=int, default=60, help="first N problems of the test split (default 60)")
    args = ap.parse_args()
    if args.problems < 1:
        ap.error(f"--problems must be at least 1, got {args.problems}")
    model = specfold.load_model(args.model)
    tok = model.tokenizer
    right = total = 0
    for sample in load_split("synth-math", "test")[: args.problems]:
        prompt = encode_prompt(model, sample.prompt)  # as `specfold eval` encodes it: the model's chat template
        lines = sample.reference.split("\n")[:-1]  # the worked lines; the last is "Answer: N"
        for i, line in enumerate(lines):
            lhs, rhs = line.split("=")
            forced = "\n".join(lines[:i] + [lhs + "="])
            out = specfold.generate(
                model, prompt + tok.encode(forced, add_special_tokens=False), max_new_tokens=8, chat=False
            )
            total += 1
            right += out.text.split("\n")[0] == rhs
    print(
        json.dumps(
            {
                "model": args.model or "embedded",
                "problems": args.problems,
                "lines": total,
                "right": right,
                "accuracy": right / max(total, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
