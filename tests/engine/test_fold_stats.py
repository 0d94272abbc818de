"""FoldStats: per-request sums of a folded pass's layer counts, adding passes, and the flat record keys."""

from __future__ import annotations

import pytest
import torch

from specfold.engine.layer_types import LayerCounts
from specfold.engine.stats import FoldStats, fold_stats, fold_stats_batch


def _counts(*per_branch: list[int]) -> LayerCounts:  # folded, ffn_folded, guard, recomputed, corrected: [K] each
    return LayerCounts(*(torch.tensor(x, dtype=torch.long) for x in per_branch))


# A 2-layer pass of 4 branches over N = 3 positions: parents [-1, 0, 1, 0] (depths 0, 1, 2, 1).
PARENTS = [-1, 0, 1, 0]
N = 3
COUNTS = [
    _counts([0, 1, 2, 0], [0, 1, 3, 1], [0, 0, 1, 0], [3, 2, 1, 3], [0, 1, 0, 0]),
    _counts([0, 3, 3, 3], [0, 3, 3, 3], [0, 0, 0, 0], [3, 0, 0, 0], [0, 0, 0, 0]),
]


def test_one_pass_sums_by_layer_and_depth() -> None:
    s = fold_stats(COUNTS, PARENTS, N)
    assert s == FoldStats(
        rows=12, layers=2, dense_layers=0, draft_triples=18,
        folded_triples=12, ffn_folded_triples=14, guard_fallbacks=1, corrected_rows=1,
        folded_by_layer=(3, 9), draft_by_layer=(9, 9), recomputed_by_layer=(9, 3),
        folded_by_depth=(0, 7, 5), draft_by_depth=(0, 12, 6),
    )
    assert s.fold_ratio() == 12 / 18 and s.fold_ratio("ffn") == 14 / 18
    assert s.to_dict() == {
        "rows": 12.0, "draft_triples": 18.0,
        "folded_l0": 3.0, "draft_l0": 9.0, "recomputed_rows_l0": 9.0,
        "folded_l1": 9.0, "draft_l1": 9.0, "recomputed_rows_l1": 3.0,
        "folded_d1": 7.0, "draft_d1": 12.0, "folded_d2": 5.0, "draft_d2": 6.0,
        "folded_triples": 12.0, "ffn_folded_triples": 14.0, "guard_fallbacks": 1.0, "corrected_rows": 1.0,
        "dense_layers": 0.0, "dense_passes": 0.0, "layers": 2.0,
    }


def test_requests_of_a_batch_count_their_own_real_rows() -> None:
    """Two requests of K = 4 rows: the second has 2 real rows (the rest padding, never counted); the device-tensor
    parents (triton backend) give the same result as host lists."""
    both = [LayerCounts(c.folded.repeat(2), c.ffn_folded.repeat(2), c.guard.repeat(2), c.recomputed.repeat(2),
                        c.corrected.repeat(2)) for c in COUNTS]
    parents = [PARENTS, [-1, 0, 0, 0]]
    host = fold_stats_batch(both, parents, N, [4, 2])
    assert host == fold_stats_batch(both, torch.tensor(parents), N, [4, 2])
    assert host[0] == fold_stats(COUNTS, PARENTS, N)
    assert host[1] == FoldStats(rows=6, layers=2, dense_layers=0, draft_triples=6, folded_triples=4,
                                ffn_folded_triples=4, guard_fallbacks=0, corrected_rows=1,
                                folded_by_layer=(1, 3), draft_by_layer=(3, 3), recomputed_by_layer=(5, 3),
                                folded_by_depth=(0, 4), draft_by_depth=(0, 6))


def test_every_row_computed_is_a_dense_layer() -> None:
    dense = [_counts([0, 0], [0, 0], [0, 0], [N, N], [0, 0]) for _ in range(3)]
    s = fold_stats(dense, [-1, 0], N)
    assert (s.dense_layers, s.layers, s.fold_ratio()) == (3, 3, 0.0)


def test_passes_add_up_from_the_empty_value() -> None:
    one = fold_stats(COUNTS, PARENTS, N)
    chain = fold_stats(COUNTS[:1], [-1, 0, 1, 2], N)  # one layer, depth 3
    total = FoldStats() + one + chain + FoldStats(rows=5)
    assert total.rows == one.rows + chain.rows + 5
    assert total.draft_triples == one.draft_triples + chain.draft_triples
    assert total.folded_by_layer == (3 + 3, 9)  # the one-layer pass adds to layer 0 only
    assert total.draft_by_depth == (0, 12 + 3, 6 + 3, 3)  # depths padded
    d = total.to_dict()
    keys = set(one.to_dict()) | set(chain.to_dict())
    assert set(d) == keys
    assert all(d[k] == one.to_dict().get(k, 0.0) + chain.to_dict().get(k, 0.0) + (5 if k == "rows" else 0)
               for k in keys)
    assert FoldStats() + one == one


def test_a_dense_pass_reports_rows_only() -> None:
    s = FoldStats(rows=64)
    assert s.to_dict() == {"rows": 64.0}
    assert s.fold_ratio() is None and s.fold_ratio("ffn") is None
    with pytest.raises(ValueError, match="unknown gate 'x'"):
        s.fold_ratio("x")
