"""Building the draft branches of one verification step from a compiled draft graph (SPEC §3).

Dims: ``N`` block length, ``V`` vocabulary, ``J`` vocab ranks kept per position, ``M`` graph nodes (root
included), ``P`` max ``(r, j)`` pairs of one node, ``K`` drafts kept this step (rows ``1..K`` of a batch).

Terms (see :mod:`specfold.decoding.draft_graph` for formulas): at a verification step the main state is ``X_0``
and the *drafting logits* ``L`` are the (position-aligned) logits that produced ``X_0``. Position rank ``r`` orders
the masked positions of ``X_0`` by (small-block index asc, confidence under ``L`` desc, position asc); vocab rank
``j`` orders a position's tokens by probability under ``L`` desc, ties to the lower token id. Probabilities are the
softmax in the logits' dtype, as :func:`specfold.decoding.unmasking.confidence` computes them, so vocab rank 1 is
exactly the rule's argmax token.

Rules applied by :func:`build_drafts` (a node's *state* is ``X_0`` with all its pairs applied):

- **reachable**: every step unmasks only positions eligible (:func:`eligible_mask`) in the state before that step
  (the parent's state); every rank exists (``r <= n_masked``) and every vocab rank is available (``j <= J``). A
  pair whose token is ``mask_id`` itself is unreachable too (a draft must unmask).
- **useful**: the state still has a mask (a full block is never denoised again) and no stop is reached
  (:func:`stop_reached` over positions ``>= gen_start``).
- Unreachable/useless nodes are dropped with all their descendants.
- **policy**: with a graph policy, only the nodes it lists for this context (:func:`window_masks`) are drafted.
- **dedup**: a node whose state equals the root's or an earlier kept node's state is dropped and its children are
  re-parented to the kept node holding that state, so no two rows are equal.

Everything is vectorised over nodes: one scatter builds all ``M`` candidate states, one gather checks eligibility,
an ancestor matrix propagates drops, an ``[M, M]`` equality matrix dedups. The only host sync is the final
``nonzero`` that compacts the kept rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specfold.decoding.draft_graph import DraftGraph, formula_pairs
from specfold.decoding.unmasking import StopIds, eligible_mask, stop_ids_tuple


@dataclass(frozen=True)
class DraftContext:
    """What drafting needs from the drafting logits ``L`` and the main state ``X_0``.

    order: ``[N]`` long — positions by rank (``order[r - 1]`` is the position of rank ``r``); only the first
        ``n_masked`` entries are meaningful (the unmasked positions follow in unspecified order).
    n_masked: number of masked positions in ``X_0``.
    top_tokens: ``[N, J]`` long — ``top_tokens[n, j - 1]`` is the token of vocab rank ``j`` at position ``n``.
    """

    order: torch.Tensor  # [N]
    n_masked: int
    top_tokens: torch.Tensor  # [N, J]

    @property
    def max_vocab_rank(self) -> int:
        return int(self.top_tokens.shape[1])

    def rank_of_position(self) -> torch.Tensor:
        """``[N]`` long: 1-based position rank of each position (0 where ``X_0`` is not masked)."""
        n = self.order.shape[0]
        rank = torch.zeros(n, dtype=torch.long, device=self.order.device)
        ranks = torch.arange(1, self.n_masked + 1, device=self.order.device)
        return rank.scatter(0, self.order[: self.n_masked], ranks)


def _top_tokens(probs: torch.Tensor, j: int) -> torch.Tensor:  # probs: [N, V] -> [N, J]
    """Token ids by probability desc, ties to the lower id."""
    v = probs.shape[-1]
    if probs.dtype in (torch.bfloat16, torch.float16):
        probs = probs.float()  # exact: the same values, so the same order and ties
    if probs.dtype == torch.float32:
        # NOTE: one topk over a packed int64 key (probability bits, then reversed id) instead of a full sort over V;
        # the key is unique per entry so the result is deterministic. Probabilities are >= 0, so their IEEE bits
        # order like the values (+0.0 normalises -0.0).
        bits = (probs + 0.0).view(torch.int32).to(torch.int64)
        rev_id = (v - 1) - torch.arange(v, device=probs.device, dtype=torch.int64)
        return torch.topk((bits << 32) | rev_id, j, dim=-1).indices
    # fp64 (tests, references): a stable full sort keeps the lower id first among ties.
    return torch.sort(probs, dim=-1, descending=True, stable=True).indices[:, :j]


def draft_context(
    logits: torch.Tensor,  # [N, V] drafting logits L, aligned with positions (logits[n] predicts position n)
    state: torch.Tensor,  # [N] main state X_0
    mask_id: int,
    small_block_size: int | None,
    max_vocab_rank: int,
) -> DraftContext:
    """Position ranks and top-``J`` tokens for drafting from ``X_0`` (``J = min(max_vocab_rank, V)``)."""
    if logits.dim() != 2 or state.dim() != 1 or logits.shape[0] != state.shape[0]:
        raise ValueError(f"expected logits [N, V] and state [N], got {tuple(logits.shape)} and {tuple(state.shape)}")
    if max_vocab_rank < 1:
        raise ValueError(f"max_vocab_rank must be >= 1, got {max_vocab_rank}")
    n, v = logits.shape
    probs = torch.softmax(logits, dim=-1)  # same computation as unmasking.confidence
    top = _top_tokens(probs, min(max_vocab_rank, v))  # [N, J]
    conf = probs.gather(-1, top[:, :1]).squeeze(-1)  # [N]
    masked = state == mask_id
    pos = torch.arange(n, device=state.device)
    sb = pos // small_block_size if small_block_size is not None else torch.zeros_like(pos)
    # Two stable sorts: confidence desc (position asc on ties), then small-block index asc with unmasked last.
    by_conf = torch.sort(conf, descending=True, stable=True).indices
    group = torch.where(masked, sb, torch.full_like(sb, n + 1))[by_conf]
    order = by_conf[torch.sort(group, stable=True).indices]
    return DraftContext(order=order, n_masked=int(masked.sum()), top_tokens=top)


@dataclass(frozen=True)
class CompiledGraph:
    """A :class:`DraftGraph` as padded tensors (built once, reused every step).

    ranks, vranks: ``[M, P]`` long, 0-based position / vocab ranks of each node's pairs (0 in padding).
    steps: ``[M, P]`` long, 1-based step of each pair (0 in padding).
    valid: ``[M, P]`` bool, real pairs.
    parents: ``[M]`` long (``-1`` for the root); depth: ``[M]`` long.
    ancestors: ``[M, M]`` bool, ``ancestors[k, a]`` iff ``a`` is ``k`` or an ancestor of ``k``.
    max_vocab_rank: the ``J`` a :class:`DraftContext` should provide for this graph.
    active: ``[C, M]`` bool, the graph's policy: row ``min(c, C - 1)`` = the nodes drafted at window-mask count
        ``c`` (the last row: every node); None without a policy.
    """

    graph: DraftGraph
    ranks: torch.Tensor  # [M, P]
    vranks: torch.Tensor  # [M, P]
    steps: torch.Tensor  # [M, P]
    valid: torch.Tensor  # [M, P]
    parents: torch.Tensor  # [M]
    depth: torch.Tensor  # [M]
    ancestors: torch.Tensor  # [M, M]
    max_vocab_rank: int
    active: torch.Tensor | None = None  # [C, M]

    @property
    def num_nodes(self) -> int:
        return int(self.parents.shape[0])

    def to(self, device: torch.device | str) -> CompiledGraph:
        return CompiledGraph(
            graph=self.graph,
            ranks=self.ranks.to(device),
            vranks=self.vranks.to(device),
            steps=self.steps.to(device),
            valid=self.valid.to(device),
            parents=self.parents.to(device),
            depth=self.depth.to(device),
            ancestors=self.ancestors.to(device),
            max_vocab_rank=self.max_vocab_rank,
            active=None if self.active is None else self.active.to(device),
        )


def compile_graph(
    graph: DraftGraph, max_vocab_rank: int | None = None, device: torch.device | str | None = None
) -> CompiledGraph:
    """Pad ``graph`` into tensors. ``max_vocab_rank`` (default: the graph's largest ``j``, at least 1) must cover
    every node's vocab ranks."""
    need = max(graph.max_vocab_rank, 1)
    if max_vocab_rank is None:
        max_vocab_rank = need
    if max_vocab_rank < need:
        raise ValueError(f"max_vocab_rank {max_vocab_rank} is below the graph's largest vocab rank {need}")
    m = len(graph.nodes)
    triples = [formula_pairs(f) for f in graph.nodes]
    p = max(1, max(len(t) for t in triples))
    ranks = torch.zeros(m, p, dtype=torch.long)
    vranks = torch.zeros(m, p, dtype=torch.long)
    steps = torch.zeros(m, p, dtype=torch.long)
    valid = torch.zeros(m, p, dtype=torch.bool)
    for k, t in enumerate(triples):  # once per graph, not per step
        for i, (r, j, s) in enumerate(t):
            ranks[k, i], vranks[k, i], steps[k, i], valid[k, i] = r - 1, j - 1, s, True
    ancestors = torch.zeros(m, m, dtype=torch.bool)
    for k in range(m):
        a = k
        while a >= 0:
            ancestors[k, a] = True
            a = graph.parents[a]
    active = None
    if graph.policy:
        active = torch.ones(max(c for c, _ in graph.policy) + 2, m, dtype=torch.bool)
        for c, idx in graph.policy:
            active[c] = False
            active[c, list(idx)] = True
    compiled = CompiledGraph(
        graph=graph,
        ranks=ranks,
        vranks=vranks,
        steps=steps,
        valid=valid,
        parents=torch.tensor(graph.parents, dtype=torch.long),
        depth=torch.tensor([len(f) for f in graph.nodes], dtype=torch.long),
        ancestors=ancestors,
        max_vocab_rank=max_vocab_rank,
        active=active,
    )
    return compiled.to(device) if device is not None else compiled


def window_masks(
    x0: torch.Tensor,  # [N] main state
    mask_id: int,
    small_block_size: int | None,
) -> torch.Tensor:
    """``[]`` long: how many positions the rule may unmask now (:func:`eligible_mask`: the masked positions of the
    first small block that holds a mask, or of the whole block without small blocks). The context a graph's policy
    is keyed by."""
    return eligible_mask(x0, mask_id, small_block_size).sum()


@dataclass(frozen=True)
class DraftBatch:
    """The branches of one verification step.

    states: ``[K+1, N]`` long, row 0 is ``X_0``; rows pairwise distinct.
    parents: ``[K+1]`` long, ``parents[0] == -1`` and ``parents[k] < k`` (row indices).
    node_ids: ``[K+1]`` long, graph node index of each row (``node_ids[0] == 0``).
    """

    states: torch.Tensor  # [K+1, N]
    parents: torch.Tensor  # [K+1]
    node_ids: torch.Tensor  # [K+1]

    @property
    def num_drafts(self) -> int:
        return int(self.states.shape[0]) - 1


def stops_reached(
    states: torch.Tensor,  # [..., N]
    gen_start: int,
    mask_id: int,
    stop_id: StopIds,
) -> torch.Tensor:
    """Vectorised :func:`stop_reached`: ``[..., N]`` -> bool ``[...]``, True where a stop token (any of
    ``stop_id``) at a position ``>= gen_start`` has no mask before it (within ``[gen_start, n)``)."""
    stops = stop_ids_tuple(stop_id)
    if not stops:
        return torch.zeros(states.shape[:-1], dtype=torch.bool, device=states.device)
    gen = states[..., gen_start:]
    masked = (gen == mask_id).long()
    masks_before = masked.cumsum(-1) - masked
    is_stop = torch.isin(gen, torch.tensor(stops, dtype=gen.dtype, device=gen.device))
    return (is_stop & (masks_before == 0)).any(-1)


def node_states(
    compiled: CompiledGraph,
    ctx: DraftContext,
    x0: torch.Tensor,  # [N] main state X_0 (the state ctx was built from)
    mask_id: int,
    small_block_size: int | None,
    stop_id: StopIds,
    gen_start: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every node's state and whether it is kept before dedup: ``(states [M, N], alive [M] bool)``.

    A node's state depends only on its own pairs and its liveness only on its ancestors, so any parent-closed
    sub-graph of ``compiled`` builds the alive states of its own nodes (what offline replay relies on)."""
    n = x0.shape[0]
    m = compiled.num_nodes
    j_avail = ctx.top_tokens.shape[1]
    ranks, vranks, valid = compiled.ranks, compiled.vranks, compiled.valid  # [M, P]

    # All candidate states at once; padding (and out-of-range ranks) write into a scratch column n.
    pos = ctx.order[ranks.clamp(max=n - 1)]  # [M, P]
    tok = ctx.top_tokens[pos, vranks.clamp(max=j_avail - 1)]  # [M, P]
    pair_ok = (ranks < ctx.n_masked) & (vranks < j_avail) & (tok != mask_id)
    target = torch.where(valid & pair_ok, pos, torch.full_like(pos, n))
    ext = torch.cat([x0.unsqueeze(0).expand(m, n), x0.new_zeros(m, 1)], dim=1)  # [M, N+1]
    states = ext.scatter(1, target, torch.where(valid, tok, 0))[:, :n]  # [M, N]

    # Reachability of each node's last step against its parent's state; earlier steps are the ancestors' job.
    eligible = eligible_mask(states, mask_id, small_block_size)  # [M, N]
    par = compiled.parents.clamp(min=0)  # [M]
    elig_pair = eligible[par.unsqueeze(1), pos]  # [M, P]
    last = valid & (compiled.steps == compiled.depth.unsqueeze(1))
    own_ok = (pair_ok | ~valid).all(1) & (elig_pair | ~last).all(1)
    own_ok &= (states == mask_id).any(1) & ~stops_reached(states, gen_start, mask_id, stop_id)
    own_ok[0] = True  # the root is X_0 itself
    if compiled.active is not None:  # the graph's policy for this context (parent-closed rows)
        # row 0 is the root's state, X_0 itself: its eligible positions are window_masks(x0), already computed
        c = eligible[0].sum().clamp(max=compiled.active.shape[0] - 1)
        own_ok &= compiled.active[c]
    alive = ~(compiled.ancestors & ~own_ok.unsqueeze(0)).any(1)  # [M] every ancestor (and self) ok
    return states, alive


def build_drafts(
    compiled: CompiledGraph,
    ctx: DraftContext,
    x0: torch.Tensor,  # [N] main state X_0 (the state ctx was built from)
    mask_id: int,
    small_block_size: int | None,
    stop_id: StopIds,
    gen_start: int,
) -> DraftBatch:
    """The kept draft rows of ``compiled`` for this step (see the module docstring for the rules)."""
    m = compiled.num_nodes
    dev = x0.device
    states, alive = node_states(compiled, ctx, x0, mask_id, small_block_size, stop_id, gen_start)
    par = compiled.parents.clamp(min=0)  # [M]

    # Dedup: each alive node's representative is the first alive node (possibly the root) with the same state.
    same = (states.unsqueeze(1) == states.unsqueeze(0)).all(-1) & alive.unsqueeze(0)  # [M, M]
    rep = same.to(torch.uint8).argmax(1)  # [M] first True (alive rows always match themselves)
    idx = torch.arange(m, device=dev)
    keep = alive & (rep == idx)
    rows = keep.nonzero().squeeze(1)  # [K+1] graph indices; the one host sync
    row_of = keep.long().cumsum(0) - 1  # [M] graph index -> batch row (for kept nodes)
    parents = row_of[rep[par[rows]]]
    parents[0] = -1
    return DraftBatch(states=states[rows], parents=parents, node_ids=rows)
