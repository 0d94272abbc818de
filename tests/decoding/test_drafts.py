"""Draft contexts and build_drafts: hand-made cases with exact states, and a property test against a slow
per-node reference."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specfold.decoding.draft_graph import DraftGraph, formula_pairs
from specfold.decoding.drafts import build_drafts, compile_graph, draft_context, stops_reached
from specfold.decoding.unmasking import confidence, eligible_mask, stop_reached

M = 9  # mask id in the hand-made cases (V = 10)


def hand_logits(n: int, v: int, spec: dict[int, list[tuple[int, float]]], dtype=torch.float32) -> torch.Tensor:
    """``[n, v]`` zeros except ``logits[pos, tok] = value`` for the listed pairs."""
    logits = torch.zeros(n, v, dtype=dtype)
    for pos, pairs in spec.items():
        for tok, val in pairs:
            logits[pos, tok] = val
    return logits


def run(graph, logits, x0, *, small_block_size=None, stop_id=None, gen_start=0, max_vocab_rank=4, mask_id=M):
    ctx = draft_context(logits, x0, mask_id, small_block_size, max_vocab_rank)
    batch = build_drafts(compile_graph(graph), ctx, x0, mask_id, small_block_size, stop_id, gen_start)
    return ctx, batch


def ids(graph: DraftGraph, strings: list[str]) -> list[int]:
    return [graph.strings().index(s) for s in strings]


def test_context_ranks_and_exact_states():
    x0 = torch.tensor([1, M, M, M, M, 2])
    logits = hand_logits(
        6,
        10,
        {
            0: [(8, 20.0)],  # unmasked positions never rank, however confident
            1: [(3, 5.0), (4, 4.5)],  # confidence ~0.60
            2: [(4, 9.0), (3, 7.0)],  # ~0.88
            3: [(5, 7.0), (6, 6.0)],  # ~0.73
            4: [(6, 2.0)],  # ~0.45
            5: [(8, 30.0)],
        },
    )
    g = DraftGraph.from_strings(["(1,1)", "(1,2)", "(2,1)+(3,2)", "(1,1)|(4,1)"])
    ctx, batch = run(g, logits, x0, gen_start=1)
    assert ctx.n_masked == 4
    assert torch.equal(ctx.order[:4], torch.tensor([2, 3, 1, 4]))
    assert torch.equal(ctx.top_tokens[2, :2], torch.tensor([4, 3]))
    assert torch.equal(ctx.rank_of_position(), torch.tensor([0, 3, 1, 2, 4, 0]))
    expected = torch.tensor(
        [
            [1, M, M, M, M, 2],
            [1, M, 4, M, M, 2],  # (1,1)
            [1, M, 3, M, M, 2],  # (1,2)
            [1, 4, M, 5, M, 2],  # (2,1)+(3,2)
            [1, M, 4, M, 6, 2],  # (1,1)|(4,1)
        ]
    )
    assert torch.equal(batch.states, expected)
    assert torch.equal(batch.parents, torch.tensor([-1, 0, 0, 0, 1]))
    assert torch.equal(batch.node_ids, torch.tensor([0, 1, 2, 3, 4]))
    assert batch.num_drafts == 4


def test_ties_lowest_position_and_lowest_token():
    x0 = torch.tensor([M, M, M, M])
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        logits = torch.zeros(4, 10, dtype=dtype)
        logits[:, 7] = 2.0  # token 7 is the argmax everywhere; tokens 0..6, 8, 9 tie behind it
        ctx = draft_context(logits, x0, M, None, 3)
        assert torch.equal(ctx.order, torch.tensor([0, 1, 2, 3]))
        assert torch.equal(ctx.top_tokens, torch.tensor([[7, 0, 1]] * 4))
        assert torch.equal(ctx.top_tokens[:, 0], confidence(logits)[1])


def test_context_clamps_vocab_ranks_to_vocab():
    ctx = draft_context(torch.randn(4, 3), torch.tensor([0, 5, 5, 1]), 5, None, 8)
    assert ctx.top_tokens.shape == (4, 3)
    assert ctx.n_masked == 2


def test_small_block_boundary_reachability():
    # S = 4: small block 0 = positions 0..3 (masks at 1..3), small block 1 = 4..7. Block 1 is more confident but
    # ranks after block 0: r1..r3 = positions 3, 2, 1; r4..r7 = positions 4..7 (ties -> position order).
    x0 = torch.tensor([1, M, M, M, M, M, M, M])
    spec = {1: [(2, 3.0)], 2: [(3, 4.0)], 3: [(4, 5.0)]}
    spec.update({p: [(5, 9.0)] for p in range(4, 8)})
    logits = hand_logits(8, 10, spec)
    strings = [
        "(1,1)",
        "(1,1)+(2,1)+(3,1)",  # completes small block 0
        "(4,1)",  # not eligible: block 0 still has masks
        "(1,1)+(2,1)+(3,1)+(4,1)",  # rank 4 not eligible in the same step
        "(1,1)+(2,1)+(3,1)|(4,1)",  # reachable: step 2 lands in block 1 after step 1 completed block 0
        "(1,1)|(4,1)",  # unreachable: block 0 still has masks after step 1
        "(4,1)|(1,1)",  # own step fine, but its parent is unreachable -> dropped with it
    ]
    g = DraftGraph.from_strings(strings)
    ctx, batch = run(g, logits, x0, small_block_size=4, gen_start=1)
    assert torch.equal(ctx.order[:7], torch.tensor([3, 2, 1, 4, 5, 6, 7]))
    assert batch.node_ids.tolist() == [0, *ids(g, ["(1,1)", "(1,1)+(2,1)+(3,1)", "(1,1)+(2,1)+(3,1)|(4,1)"])]
    expected = torch.tensor(
        [
            [1, M, M, M, M, M, M, M],
            [1, M, M, 4, M, M, M, M],
            [1, 2, 3, 4, M, M, M, M],
            [1, 2, 3, 4, 5, M, M, M],
        ]
    )
    assert torch.equal(batch.states, expected)
    assert batch.parents.tolist() == [-1, 0, 0, 2]


def test_block_end_and_missing_ranks_pruned():
    x0 = torch.tensor([M, M, 7, 7])
    logits = hand_logits(4, 10, {0: [(1, 5.0)], 1: [(2, 4.0)]})
    g = DraftGraph.from_strings(["(1,1)", "(1,1)+(2,1)", "(1,1)|(2,1)", "(3,1)", "(2,1)"])
    _, batch = run(g, logits, x0)
    assert batch.node_ids.tolist() == [0, *ids(g, ["(1,1)", "(2,1)"])]
    assert torch.equal(batch.states, torch.tensor([[M, M, 7, 7], [1, M, 7, 7], [M, 2, 7, 7]]))


def test_stop_pruning():
    stop = 5
    x0 = torch.tensor([stop, M, M, M])  # a stop token in the prompt tail does not count
    logits = hand_logits(4, 10, {1: [(stop, 9.0), (3, 8.0)], 2: [(4, 7.0), (stop, 6.0)], 3: [(6, 1.0)]})
    strings = ["(1,1)", "(1,2)", "(2,1)", "(2,2)", "(2,1)|(1,1)", "(1,1)|(2,1)", "(2,2)|(3,1)"]
    g = DraftGraph.from_strings(strings)
    _, batch = run(g, logits, x0, stop_id=stop, gen_start=1)
    # (1,1) puts the stop at position 1 with no mask before -> dropped with its child; (2,2) puts it at position 2
    # behind a mask -> kept; (2,1)|(1,1) reaches the stop -> dropped.
    kept = ["(1,2)", "(2,1)", "(2,2)", "(2,2)|(3,1)"]
    assert batch.node_ids.tolist() == [0, *ids(g, kept)]
    expected = torch.tensor([[stop, M, M, M], [stop, 3, M, M], [stop, M, 4, M], [stop, M, stop, M], [stop, M, stop, 6]])
    assert torch.equal(batch.states, expected)
    assert batch.parents.tolist() == [-1, 0, 0, 0, 3]
    assert not stops_reached(batch.states, 1, M, stop).any()


def test_dedup_and_reparenting():
    x0 = torch.tensor([M, M, M, M, M, M])
    logits = hand_logits(6, 10, {p: [(p, 9.0 - p)] for p in range(6)})  # rank r -> position r-1, token r-1
    strings = ["(1,1)+(2,1)", "(1,1)", "(1,1)|(2,1)", "(1,1)+(2,1)|(4,1)", "(1,1)|(2,1)|(3,1)"]
    g = DraftGraph.from_strings(strings)
    _, batch = run(g, logits, x0)
    # (1,1)|(2,1) has the state of (1,1)+(2,1): dropped, its child re-parented to the (1,1)+(2,1) row.
    assert batch.node_ids.tolist() == [0, *ids(g, ["(1,1)+(2,1)", "(1,1)", "(1,1)+(2,1)|(4,1)", "(1,1)|(2,1)|(3,1)"])]
    expected = torch.tensor(
        [[M, M, M, M, M, M], [0, 1, M, M, M, M], [0, M, M, M, M, M], [0, 1, M, 3, M, M], [0, 1, 2, M, M, M]]
    )
    assert torch.equal(batch.states, expected)
    assert batch.parents.tolist() == [-1, 0, 0, 1, 1]


def test_mask_token_and_unavailable_vocab_rank_dropped():
    x0 = torch.tensor([M, M, M, M])
    logits = hand_logits(4, 10, {0: [(M, 9.0), (1, 8.0)], 1: [(2, 5.0), (3, 4.0)]})
    g = DraftGraph.from_strings(["(1,1)", "(1,2)", "(2,1)", "(2,2)"])
    _, batch = run(g, logits, x0, max_vocab_rank=1)  # J = 1: vocab rank 2 unavailable
    assert batch.node_ids.tolist() == [0, *ids(g, ["(2,1)"])]
    _, batch = run(g, logits, x0, max_vocab_rank=2)
    assert batch.node_ids.tolist() == [0, *ids(g, ["(1,2)", "(2,1)", "(2,2)"])]  # (1,1) would write the mask id


def test_compile_graph_vocab_rank_check():
    g = DraftGraph.from_strings(["(1,3)"])
    assert compile_graph(g).max_vocab_rank == 3
    assert compile_graph(g, max_vocab_rank=8).max_vocab_rank == 8
    try:
        compile_graph(g, max_vocab_rank=2)
    except ValueError as err:
        assert "below the graph's largest vocab rank 3" in str(err)
    else:
        raise AssertionError("expected ValueError")


def test_root_only_graph():
    g = DraftGraph.from_strings([])
    x0 = torch.tensor([M, 1])
    _, batch = run(g, torch.randn(2, 10), x0)
    assert torch.equal(batch.states, x0.unsqueeze(0)) and batch.parents.tolist() == [-1]


# ---------------------------------------------------------------------------------------------------------------
# Property test against a slow per-node reference
# ---------------------------------------------------------------------------------------------------------------

N, V, MASK = 8, 10, 9


@st.composite
def graphs(draw):
    formulas = [()]
    for _ in range(draw(st.integers(0, 10))):
        parent = draw(st.sampled_from(formulas))
        if len(parent) >= 2 and draw(st.booleans()):
            # Merge the last two steps: same state as `parent`, so dedup and re-parenting get exercised.
            merged = (*parent[:-2], parent[-2] | parent[-1])
            if merged not in formulas:
                formulas.append(merged)  # and fall through: give `parent` (now a duplicate) a child
        used = {r for step in parent for r, _ in step}
        free = [r for r in (1, 1, 2, 2, 3, 3, 4, 5, 6, 9) if r not in used]  # rank 9 > N never exists
        if not free:
            continue
        rs = draw(st.lists(st.sampled_from(free), min_size=1, max_size=2, unique=True))
        f = (*parent, frozenset((r, draw(st.sampled_from([1, 1, 1, 2, 3]))) for r in rs))
        if f not in formulas:
            formulas.append(f)
    return DraftGraph.from_formulas(formulas[1:])


def reference(graph, logits, x0, small_block_size, stop_id, gen_start, j_max):
    """Per-node replay straight from the definitions (Python loops, unmasking.py's primitives)."""
    conf, _ = confidence(logits)
    probs = torch.softmax(logits.float(), -1).tolist()
    conf = conf.tolist()
    masked = [int(p) for p in (x0 == MASK).nonzero().squeeze(1).tolist()]
    sb = (lambda p: p // small_block_size) if small_block_size else (lambda p: 0)
    order = sorted(masked, key=lambda p: (sb(p), -conf[p], p))
    vocab = [sorted(range(V), key=lambda t: (-probs[p][t], t))[:j_max] for p in range(N)]
    states, alive = [x0.clone()], [True]
    for k in range(1, len(graph.nodes)):
        f, par = graph.nodes[k], graph.parents[k]
        ok = alive[par]
        state = states[par].clone()
        if ok:
            elig = eligible_mask(states[par], MASK, small_block_size)
            for r, j in graph.nodes[k][-1]:
                if r > len(order) or j > len(vocab[0]):
                    ok = False
                    break
                p = order[r - 1]
                tok = vocab[p][j - 1]
                if not bool(elig[p]) or tok == MASK:
                    ok = False
                    break
                state[p] = tok
        if ok:
            ok = bool((state == MASK).any()) and stop_reached(state, gen_start, MASK, stop_id) is None
        assert len(f) == len(graph.nodes[par]) + 1
        states.append(state)
        alive.append(ok)
    rows, row_of, parents = [], {}, []
    for k in range(len(graph.nodes)):
        if not alive[k]:
            continue
        twin = next((i for i in rows if torch.equal(states[i], states[k])), None)
        if twin is not None:
            row_of[k] = row_of[twin]
            continue
        row_of[k] = len(rows)
        parents.append(-1 if k == 0 else row_of[graph.parents[k]])
        rows.append(k)
    return torch.stack([states[k] for k in rows]), parents, rows


@settings(max_examples=120, deadline=None)
@given(
    graph=graphs(),
    seed=st.integers(0, 2**31 - 1),
    small_block_size=st.sampled_from([None, None, 2, 4, 8]),
    stop_id=st.sampled_from([None, None, 0]),
    gen_start=st.integers(0, 2),
    mask_p=st.floats(0.7, 1.0),
    j_max=st.integers(1, 4),
)
def test_build_drafts_property(graph, seed, small_block_size, stop_id, gen_start, mask_p, j_max):
    check_against_reference(graph, seed, small_block_size, stop_id, gen_start, mask_p, j_max)


@settings(max_examples=60, deadline=None)
@given(graph=graphs(), seed=st.integers(0, 2**31 - 1))
def test_build_drafts_property_dense(graph, seed):
    """All masked, no small blocks, no stop: most nodes survive, so dedup and re-parenting are exercised."""
    check_against_reference(graph, seed, None, None, 0, 1.0, 3)


def check_against_reference(graph, seed, small_block_size, stop_id, gen_start, mask_p, j_max):
    gen = torch.Generator().manual_seed(seed)
    # Logits on a coarse grid so that confidence and probability ties happen.
    logits = (torch.randint(-4, 5, (N, V), generator=gen) * 0.5).float()
    x0 = torch.randint(0, MASK, (N,), generator=gen)
    masked = (torch.rand(N, generator=gen) < mask_p) & (torch.arange(N) >= gen_start)
    x0 = torch.where(masked, torch.full_like(x0, MASK), x0)
    ctx = draft_context(logits, x0, MASK, small_block_size, j_max)
    assert torch.equal(ctx.top_tokens[:, 0], confidence(logits)[1])  # vocab rank 1 is the rule's token
    batch = build_drafts(compile_graph(graph), ctx, x0, MASK, small_block_size, stop_id, gen_start)
    states, parents, node_ids = batch.states, batch.parents, batch.node_ids

    ref_states, ref_parents, ref_rows = reference(graph, logits, x0, small_block_size, stop_id, gen_start, j_max)
    assert torch.equal(states, ref_states)
    assert parents.tolist() == ref_parents
    assert node_ids.tolist() == ref_rows

    # Invariants, checked directly on the batch.
    assert torch.equal(states[0], x0) and parents[0] == -1 and node_ids[0] == 0
    k1 = states.shape[0]
    assert (states.unsqueeze(0) != states.unsqueeze(1)).any(-1).sum() == k1 * (k1 - 1)  # pairwise distinct
    for k in range(1, k1):
        p = int(parents[k])
        assert 0 <= p < k
        parent_row, row = states[p], states[k]
        new = parent_row != row
        assert new.any()
        assert (parent_row[new] == MASK).all() and (row[new] != MASK).all()  # only newly unmasked positions
        assert eligible_mask(parent_row, MASK, small_block_size)[new].all()  # the step is reachable
        assert int(new.sum()) == len(graph.nodes[int(node_ids[k])][-1])
        assert (row == MASK).any() and stop_reached(row, gen_start, MASK, stop_id) is None
        assert len(formula_pairs(graph.nodes[int(node_ids[k])])) == int((x0 != row).sum())
