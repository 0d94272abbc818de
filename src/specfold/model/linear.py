"""``linear``: ``F.linear`` with the row count rounded up to a bucket where the GEMM library builds a kernel per
shape.

On CPU, bf16/fp16 GEMMs go to oneDNN, which creates (JIT-compiles) a primitive for every new input shape and caches
it. Measured on this project's CPU (AMX, one thread): the first ``[372, 256] x [256, 2048]`` bf16 GEMM costs
≈ 10 ms, the next ones ≈ 0.5 ms. Folded verification and batched decoding produce a new row count nearly every
call (the recomputed pool of a layer, the valid blocks of a batch), so unbucketed they pay that creation on nearly
every GEMM. Rounding the rows up to :func:`bucket_rows` bounds the shapes (80 up to 2048 rows, each created once per
weight shape: a one-time ≈ 10 ms each on that CPU), while padding stays under 1/8 of the rows; the
padding rows are zeros and their outputs are dropped (each output row depends on its own input row only). fp32/fp64
(MKL, no per-shape JIT) and CUDA (cuBLAS) take the plain call: the exactness tests run exactly the unpadded GEMM.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_PADDED_DTYPES = (torch.bfloat16, torch.float16)


def bucket_rows(m: int) -> int:
    """The row count a GEMM of ``m`` rows runs at: ``m`` up to 32, then eight buckets per power of two (the next
    multiple of 4 up to 64, of 8 up to 128, … of 32 up to 512, of 64 up to 1024): under 1/8 of the rows are padding
    (where a GEMM's time is per-row work, as on a CPU without bf16 GEMM units, padding costs its share of the time),
    in 80 shapes up to 2048."""
    if m <= 32:
        return m
    step = 1 << ((m - 1).bit_length() - 4)  # 2^k / 8 for 2^k < m <= 2^(k+1)
    return -(-m // step) * step


def linear(
    x: torch.Tensor,  # [..., F] input rows
    w: torch.Tensor,  # [E, F]
    b: torch.Tensor | None = None,  # [E]
) -> torch.Tensor:
    """``F.linear(x, w, b)`` ``[..., E]``; on CPU in bf16/fp16 computed on the rows padded to :func:`bucket_rows`."""
    if not pads(x):
        return F.linear(x, w, b)
    rows = x.reshape(-1, x.shape[-1])
    m = rows.shape[0]
    mb = bucket_rows(m)
    if mb == m:
        return F.linear(x, w, b)
    padded = torch.cat([rows, rows.new_zeros(mb - m, rows.shape[1])])
    return F.linear(padded, w, b)[:m].view(*x.shape[:-1], w.shape[0])


def pads(x: torch.Tensor) -> bool:
    """Whether :func:`linear` pads rows of ``x``'s device and dtype to :func:`bucket_rows`. Never while
    ``torch.compile`` traces: the row count is symbolic there, and rounding it would specialise the graph on every
    bucket (one recompilation each); the compiled folded layer buckets its pools before the graph."""
    return x.device.type == "cpu" and x.dtype in _PADDED_DTYPES and not torch.compiler.is_compiling()


def pad_rows(x: torch.Tensor) -> torch.Tensor:
    """``x [M, F]`` with zero rows appended up to :func:`bucket_rows` where :func:`linear` would pad it (one copy
    before a chain of GEMMs instead of one per GEMM); otherwise ``x`` itself."""
    m = x.shape[0]
    mb = bucket_rows(m) if pads(x) else m
    return x if mb == m else torch.cat([x, x.new_zeros(mb - m, *x.shape[1:])])


def bucket_index(index: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``index [R]`` extended with 0s up to :func:`bucket_rows` where :func:`linear` pads rows of ``like``'s
    device and dtype: a gather through it yields GEMM-ready rows without a padding copy (the extra rows are
    duplicates of row 0, their outputs dropped)."""
    r = index.shape[0]
    rb = bucket_rows(r) if pads(like) else r
    return index if rb == r else torch.cat([index, index.new_zeros(rb - r)])
