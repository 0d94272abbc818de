"""``model.linear``: the bucketed row counts of CPU bf16 GEMMs (bounded padding, bounded shapes) and that padding
never changes a row's output."""

from __future__ import annotations

import torch

from specfold.model.linear import bucket_index, bucket_rows, linear, pad_rows


def test_bucket_rows_pads_under_an_eighth_with_eight_shapes_per_octave() -> None:
    for m in range(1, 9000):
        b = bucket_rows(m)
        assert b >= m
        assert b == m if m <= 32 else (b - m) < m / 8, (m, b)
        assert bucket_rows(b) == b  # a bucket is its own bucket
    for k in range(5, 13):  # (2^k, 2^(k+1)] holds exactly eight buckets
        assert len({bucket_rows(m) for m in range(2**k + 1, 2 ** (k + 1) + 1)}) == 8
    assert len({bucket_rows(m) for m in range(1, 2049)}) == 80
    assert bucket_rows(256) == 256 and bucket_rows(257) == 288  # one request's block past R = 8 blocks: +1/8 at most


def test_padded_linear_equals_the_plain_gemm_row_for_row() -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, 64, generator=g).to(torch.bfloat16)
    b = torch.randn(96, generator=g).to(torch.bfloat16)
    for m in (7, 33, 70, 257, 300):
        x = torch.randn(m, 64, generator=g).to(torch.bfloat16)
        got = linear(x, w, b)
        assert got.shape == (m, 96)
        # each row computed alone: padding rows must not leak into (or reorder) the real ones
        ref = torch.cat([torch.nn.functional.linear(x[i : i + 1].float(), w.float(), b.float()) for i in range(m)])
        torch.testing.assert_close(got.float(), ref, atol=0.15, rtol=0.02)
        padded = pad_rows(x)
        assert padded.shape[0] == bucket_rows(m) and torch.equal(padded[:m], x) and not padded[m:].any()
        idx = bucket_index(torch.arange(m), x)
        assert idx.shape[0] == bucket_rows(m) and torch.equal(idx[:m], torch.arange(m))
    x64 = torch.randn(33, 64, dtype=torch.float64, generator=g)  # fp64 is never padded
    assert pad_rows(x64) is x64 and bucket_index(torch.arange(33), x64).shape[0] == 33
