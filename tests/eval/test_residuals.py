"""Residual analysis (Fig. 6): the parent–child pair, ρ's shape and exact zeros, labels, the figure, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specfold.api import decode_config_for, encode_prompt, load_model
from specfold.cli import main
from specfold.eval.residuals import plot_residual_map, residual_map

PROMPT_IDS = list(range(10, 30))


@pytest.mark.parametrize("ckpt_name", ["fd_ckpt", "nld_ckpt"])
def test_child_is_parent_plus_one_rule_token(request, ckpt_name: str):
    model = load_model(request.getfixturevalue(ckpt_name))
    cfg = decode_config_for(model, 32, block_size=16)
    rmap = residual_map(model, PROMPT_IDS, cfg)
    n_layers = model.config.num_layers
    assert len(rmap.rho) == n_layers and all(len(row) == 16 for row in rmap.rho)
    parent, child = torch.tensor(rmap.parent), torch.tensor(rmap.child)
    diff = (parent != child).nonzero().flatten().tolist()
    assert diff == [rmap.new_position] and rmap.parent[rmap.new_position] == model.mask_id
    assert rmap.labels.count("new") == 1 and rmap.labels[rmap.new_position] == "new"
    assert rmap.labels.count("masked") >= 3  # the parent keeps >= 4 masks, one of which the child fills
    for j, lab in enumerate(rmap.labels):
        assert (lab == "committed") == (rmap.parent[j] != model.mask_id)
    # Layer 0's input is the embedding: only the newly unmasked position differs, every other ρ is exactly 0.
    assert rmap.rho[0][rmap.new_position] > 0
    assert all(v == 0.0 for j, v in enumerate(rmap.rho[0]) if j != rmap.new_position)
    # Deeper layers: attention spreads the change to every position of the block.
    assert all(v > 0 for v in rmap.rho[-1])


def test_explicit_step_follows_the_vanilla_rule(fd_ckpt):
    model = load_model(fd_ckpt)
    cfg = decode_config_for(model, 32, block_size=16)
    first = residual_map(model, PROMPT_IDS, cfg, step=0)
    second = residual_map(model, PROMPT_IDS, cfg, step=1)
    assert (first.step, second.step) == (0, 1)
    # one rule step later: every committed token stays, and the rule's always-unmasked token (the child's) is in
    kept = [j for j, t in enumerate(first.parent) if t != model.mask_id]
    assert all(second.parent[j] == first.parent[j] for j in kept)
    assert second.parent[first.new_position] == first.new_token
    with pytest.raises(ValueError, match="fewer than 4"):
        residual_map(model, PROMPT_IDS, cfg, step=14)


VIRIDIS_MIN, VIRIDIS_MAX = (68, 1, 84), (253, 231, 36)  # ρ = 0 (drawn at the scale's floor) and the largest ρ
STRIP = {"committed": (44, 160, 44), "masked": (127, 127, 127), "new": (214, 39, 40)}  # tab:green / gray / red


def test_heatmap_and_cli(text_ckpt: Path, tmp_path: Path, capsys, png_pixels):
    model = load_model(text_ckpt)
    rmap = residual_map(model, encode_prompt(model, "What is 3 + 4?"), decode_config_for(model, 32))
    png = plot_residual_map(rmap, tmp_path / "heat.png")
    px = png_pixels.read(png)
    n_layers, n_pos = len(rmap.rho), len(rmap.labels)
    assert px.shape[:2] == (round(150 * max(3.0, 0.35 * n_layers + 2.2)), round(150 * max(6.0, 0.28 * n_pos + 2.5)))
    # layer 0's exact zeros at the bottom of the colour scale, the largest ρ at its top (one cell at least: the
    # cells are tens of pixels each way; 800 px is a safe floor), every label colour in the strip
    cell = 40 * 20
    assert png_pixels.count(px, VIRIDIS_MIN) > (n_pos - 1) * cell and png_pixels.count(px, VIRIDIS_MAX) > cell
    for label in set(rmap.labels):
        assert png_pixels.count(px, STRIP[label]) > cell, label

    out = tmp_path / "fig6.svg"
    assert main(["analyze", "residuals", "--model", str(text_ckpt), "--out", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert info["figure"] == str(out) and out.read_text().lstrip().startswith("<?xml")
    assert info["rho"] == rmap.rho and info["labels"] == rmap.labels  # default prompt, deterministic
    assert set(info["labels"]) == {"committed", "masked", "new"}
