"""Residual analysis (the paper's Fig. 6): how far a child draft's hidden states move from its parent's, per layer.

Dims: ``L`` layers, ``N`` block positions.

A prompt is decoded vanilla (prefill + the unmasking rule on the first generated block) up to a *parent* state with
enough masks left; the *child* is the parent plus the rule's most confident eligible position set to its top token
— exactly one newly unmasked token, the smallest draft edge. Both run through one folded verification pass at
δ = 0 with parents ``[-1, 0]`` (at δ = 0 only bit-identical rows fold, so every layer input is the dense one), and
Eq. 4's ρ of the child against the parent is read from the pass's per-layer trace:

    ρ[ℓ, n] = ‖H_child[ℓ, n] − H_parent[ℓ, n]‖₂ / ‖H_parent[ℓ, n]‖₂      (input of layer ℓ)

Positions are labelled ``committed`` (a token in the parent: prompt tail, seed, earlier unmasks), ``masked`` (mask in
both) or ``new`` (the newly unmasked one). At layer 0 (embeddings) only the new position differs; the spread of
ρ across committed and masked positions at deeper layers is what folding exploits.

    >>> rmap = residual_map(model, encode_prompt(model, "What is 3 + 4?"), decode_config_for(model, 64))
    >>> plot_residual_map(rmap, Path("fig6.png"))
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from specfold.config import DecodeConfig
from specfold.decoding.unmasking import confidence, eligible_mask, unmask_step
from specfold.engine.dense import DenseVerifier
from specfold.engine.folded import FoldedVerifier
from specfold.io import atomic_output
from specfold.model.families import family_of
from specfold.model.loading import LoadedModel

LABELS = ("committed", "masked", "new")
LABEL_COLORS = {"committed": "tab:green", "masked": "tab:gray", "new": "tab:red"}
MIN_MASKS = 4
LOG_FLOOR = 1e-12  # lowest value of the log colour scale; ρ = 0 (bit-identical rows) is drawn at its bottom


@dataclass
class ResidualMap:
    rho: list[list[float]]  # [L, N] ρ of the child vs the parent at each layer's input
    labels: list[str]  # [N] committed | masked | new
    parent: list[int]  # [N] parent block state (mask id where masked)
    child: list[int]  # [N]
    new_position: int
    new_token: int
    step: int  # rule applications on the first generated block before the parent state
    mask_id: int
    gen_start: int  # first generated position of the block (a Fast-dLLM-v2 prompt tail sits before it)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        # JSON has no inf/nan; ρ is finite except for a zero-norm parent row that changed (documented in gate.py)
        out["rho"] = [[v if math.isfinite(v) else None for v in row] for row in self.rho]
        return out


def _parent_state(
    model: LoadedModel,
    prompt_ids: list[int] | torch.Tensor,
    cfg: DecodeConfig,
    step: int | None,
    min_masks: int,
):
    """Prefill, then walk the rule on the first block to the parent state. Returns (cache, parent, logits, step,
    gen_start)."""
    net = model.net
    prompt = torch.as_tensor(prompt_ids, dtype=torch.long, device=net.device).flatten()
    if prompt.numel() == 0:
        raise ValueError("empty prompt")
    if bool((prompt == model.mask_id).any()):
        raise ValueError(f"the prompt contains the mask token id {model.mask_id}")
    n = cfg.block_size
    if prompt.numel() + 2 * n > model.config.max_position_embeddings:
        raise ValueError(f"prompt ({prompt.numel()} tokens) + two blocks exceeds the model's position limit")
    cache = net.new_cache(prompt.numel() + 2 * n)
    family = family_of(model.config)
    block, gen_start, _ = family.start(net, prompt, cache, n, model.mask_id, None)
    dense = DenseVerifier(net)
    no_parent = torch.tensor([-1], device=net.device)
    # Default: the last state that still has at least half the block (and min_masks) masked — a mix of committed
    # and masked positions, with room for the child's one new token.
    want = max(min_masks, n // 2)
    i = 0
    while True:
        masks = int((block == model.mask_id).sum())
        if masks < min_masks:
            shown = f"step {step}" if step is not None else "the first state"
            raise ValueError(
                f"{shown} of the first block has {masks} masks, fewer than {min_masks}: "
                "use a larger --block-size, a smaller --step or a shorter prompt tail"
            )
        logits = dense.verify(cache, block[None], no_parent).logits[0]  # [N, V]
        nxt = unmask_step(logits, block, model.mask_id, cfg.small_block_size, cfg.threshold, family.rule)
        next_masks = int((nxt == model.mask_id).sum())
        done = i == step if step is not None else next_masks < want or masks <= want
        if done:
            return cache, block, logits, i, gen_start
        block, i = nxt, i + 1


@torch.no_grad()
def residual_map(
    model: LoadedModel,
    prompt_ids: list[int] | torch.Tensor,
    cfg: DecodeConfig,
    step: int | None = None,
    min_masks: int = MIN_MASKS,
) -> ResidualMap:
    """ρ over layers × positions for a parent–child pair one unmasked token apart (see the module docstring).

    ``step``: rule applications on the first block before taking the parent (default: the last state with at least
    half the block, and ``min_masks``, still masked)."""
    if min_masks < 2:
        raise ValueError(f"min_masks must be >= 2 (a masked position must remain beside the new one), got {min_masks}")
    if step is not None and step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    cache, parent, logits, at, gen_start = _parent_state(model, prompt_ids, cfg, step, min_masks)
    conf, top = confidence(logits)
    eligible = eligible_mask(parent, model.mask_id, cfg.small_block_size)
    pos = int(torch.where(eligible, conf, torch.full_like(conf, -1.0)).argmax())  # the rule's always-unmasked one
    child = parent.clone()
    child[pos] = top[pos]
    states = torch.stack([parent, child])  # [2, N]
    parents = torch.tensor([-1, 0], device=model.net.device)
    _, trace = FoldedVerifier(model.net, delta=0.0).run(cache, states, parents, trace=True)
    rho = torch.stack([layer.rho[1] for layer in trace.layers])  # [L, N] fp64
    masked = parent == model.mask_id
    labels = ["new" if j == pos else "masked" if bool(masked[j]) else "committed" for j in range(parent.numel())]
    return ResidualMap(
        rho=rho.cpu().tolist(),
        labels=labels,
        parent=parent.cpu().tolist(),
        child=child.cpu().tolist(),
        new_position=pos,
        new_token=int(top[pos]),
        step=at,
        mask_id=model.mask_id,
        gen_start=gen_start,
    )


def plot_residual_map(rmap: ResidualMap, out: Path, title: str | None = None) -> Path:
    """Heatmap of ρ (layers × positions, log colour scale) with the positions' labels colour-coded below."""
    import numpy as np
    from matplotlib.colors import LogNorm
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    rho = np.array([[v if v is not None else np.nan for v in row] for row in rmap.rho], dtype=float)  # [L, N]
    finite = rho[np.isfinite(rho) & (rho > 0)]
    vmax = float(finite.max()) if finite.size else 1.0
    # a decade below the smallest non-zero ρ, so that exact zeros stay visibly apart from small residuals
    vmin = max(LOG_FLOOR, min(float(finite.min()) / 10 if finite.size else LOG_FLOOR, vmax / 10))
    shown = np.clip(np.nan_to_num(rho, nan=vmax, posinf=vmax), vmin, vmax)
    n_layers, n_pos = rho.shape
    fig = Figure(figsize=(max(6.0, 0.28 * n_pos + 2.5), max(3.0, 0.35 * n_layers + 2.2)), layout="constrained")
    ax, strip = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [max(n_layers, 2), 1]})
    im = ax.imshow(shown, aspect="auto", origin="lower", norm=LogNorm(vmin=vmin, vmax=vmax), cmap="viridis",
                   interpolation="nearest")
    ax.set_ylabel("layer (input of)")
    ax.set_yticks(range(n_layers))
    ax.set_title(title or f"Relative residual ρ of a child draft vs its parent (one token newly unmasked at "
                 f"position {rmap.new_position}; cf. paper Fig. 6)", fontsize=9)
    cbar = fig.colorbar(im, ax=[ax, strip], shrink=0.9)
    cbar.set_label(f"ρ (log scale; ρ = 0 drawn at {vmin:.0e})")
    codes = np.array([[LABELS.index(lab) for lab in rmap.labels]])
    from matplotlib.colors import ListedColormap

    strip.imshow(codes, aspect="auto", cmap=ListedColormap([LABEL_COLORS[lab] for lab in LABELS]), vmin=0,
                 vmax=len(LABELS) - 1, interpolation="nearest")
    if rmap.gen_start > 0:  # a Fast-dLLM-v2 prompt tail fills the block's first positions
        for a in (ax, strip):
            a.axvline(rmap.gen_start - 0.5, color="white" if a is ax else "black", lw=1, ls="--")
    strip.set_yticks([])
    strip.set_xticks(range(n_pos))
    strip.set_xticklabels([str(j) for j in range(n_pos)], fontsize=6)
    for tick, lab in zip(strip.get_xticklabels(), rmap.labels, strict=True):
        tick.set_color(LABEL_COLORS[lab])
    strip.set_xlabel("block position (colour: committed / masked / newly unmasked; dashed: generation starts)"
                     if rmap.gen_start > 0 else "block position (colour: committed / masked / newly unmasked)")
    strip.legend(
        handles=[Patch(color=LABEL_COLORS[lab], label="newly unmasked" if lab == "new" else lab) for lab in LABELS],
        loc="upper center", bbox_to_anchor=(0.5, -0.9), ncol=3, fontsize=7, frameon=False,
    )
    with atomic_output(out) as tmp:
        fig.savefig(tmp, dpi=150)
    return out
