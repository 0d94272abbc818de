"""``specfold bench pass --shape embedded --fold-ratio F``: the shipped model's own pass at an imposed fold ratio,
with the rows limit timed beside (what the folded pass is judged against)."""

from __future__ import annotations

import pytest
import torch

from specfold.bench.verify_pass import bench_pass


@pytest.mark.usefixtures("one_thread")
def test_embedded_shape_at_an_imposed_fold_ratio():
    res = bench_pass("embedded", 0.1, prefix=48, repeats=1, dtype=torch.float32, imposed_fold=0.6)
    assert res.shape == "embedded" and res.layers == 8  # all of the shipped model's layers
    assert res.imposed_fold == 0.6 and abs(res.fold_ratio - 0.6) < 0.1  # every layer folds ~60% of its drafts
    assert res.rows_seconds > 0 and res.rows_ratio == pytest.approx(res.folded_seconds / res.rows_seconds)
    from specfold.engine.pass_measure import _PASS_MEASURED  # the per-pass rule's constants, as the verifiers use them

    assert res.rule_dense_layer_seconds > 0 and res.rule_gate_seconds >= 0
    assert (res.rule_dense_layer_seconds, res.rule_gate_seconds) in [v[:2] for v in _PASS_MEASURED.values()]
    plain = bench_pass("embedded", 0.1, prefix=48, repeats=1, dtype=torch.float32)
    assert plain.imposed_fold is None and plain.rows_seconds is None and plain.rows_ratio is None
    with pytest.raises(ValueError, match="embedded"):
        bench_pass("no-such-shape", 0.1)
