"""Accepted drafts per pass against the draft budget B, replayed exactly on held-out trajectories (no timing).

Records the vanilla trajectories of the first ``--limit`` test prompts per synthetic task (embedded model, fp32),
then, for B = 1 .. 8, selects a graph from the shipped calibration paths (drafting every node, and with the
shipped graph's draft cost) and replays the acceptance rule on those trajectories (graph drafts only; boundary
drafts are not graph nodes). Prints one JSON object per (draft cost, B).

    python scripts/budget_acceptance.py [--limit 50]
"""

from __future__ import annotations

import argparse
import json

import torch

from specfold.api import decode_config_for, encode_prompt, load_model, record_traces
from specfold.decoding.acceptance import CalibrationPaths, replay
from specfold.decoding.calibration import graph_from_paths
from specfold.decoding.draft_graph import DraftGraph
from specfold.eval.tasks.synthetic import TASKS, load_split


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=50)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = load_model()
    cfg = decode_config_for(model, 64)
    prompts = [encode_prompt(model, s.prompt) for t in TASKS for s in load_split(t, "test", limit=args.limit)]
    traces = [t for blocks in record_traces(model, prompts, cfg) for t in blocks]
    paths = CalibrationPaths.load(model.path / "draft_graph.paths.json")
    shipped = DraftGraph.load(model.path / "draft_graph.json").provenance.get("draft_cost", 0.0)
    for cost in sorted({0.0, shipped}):
        for budget in range(1, 9):
            a = replay(traces, graph_from_paths(paths, budget, folds=0, draft_cost=cost))
            print(json.dumps({"draft_cost": cost, "budget": budget, **a.to_dict()}))


if __name__ == "__main__":
    main()
