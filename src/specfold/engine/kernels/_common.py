"""Helpers shared by the kernel launchers: argument checks, the launch configuration, and the dot product policy.

Launch configuration: every launcher asks its op's ``<op>_config(...)`` (in the op's module) for a
:class:`LaunchConfig` — grid, tile constexprs, ``num_warps``, ``num_stages`` — and starts the kernel through
:func:`launch`. ``specfold bench kernels --compile-only`` (:mod:`specfold.bench.kernels`) runs the same launchers
on ``meta`` tensors under :func:`capture_launches`, which records each launch instead of running it and compiles
it for a GPU target: the compile check sees exactly the configuration a GPU run would use.

Dot policy (``NATIVE_DOT``): on a GPU, bf16/fp16 tiles go to ``tl.dot`` as they are (fp32 accumulation, as
cuBLAS/FlashAttention do); fp32 tiles use ``input_precision="ieee"`` (no TF32, so fp32 models stay fp32-exact).
In the interpreter low-precision arithmetic is unreliable, so every tile is widened before the dot (to fp64, see
``_WIDE``) and the result rounded to fp32 — bf16 × bf16 products are exact in fp32, so this is the GPU's
fp32-accumulating MMA up to the accumulation's rounding.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import triton
import triton.language as tl

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _check_interpreter_numpy() -> None:
    """Triton < 3.7's interpreter reads a scalar argument with ``int()`` of a one-element array, which numpy >= 2.4
    refuses ("only 0-dimensional arrays can be converted to Python scalars", from inside the first kernel): say so
    at import. Compiled kernels (a GPU) are not affected."""
    if not interpreting():
        return
    import numpy

    def version(v: str) -> tuple[int, ...]:
        return tuple(int("".join(c for c in x if c.isdigit()) or 0) for x in v.split(".")[:2])

    if version(triton.__version__) < (3, 7) and version(numpy.__version__) >= (2, 4):
        raise ImportError(f"Triton {triton.__version__}'s interpreter (TRITON_INTERPRET=1) needs numpy < 2.4, found "
                          f"{numpy.__version__}: install numpy<2.4 or triton>=3.7")


_check_interpreter_numpy()


def native_dot(dtype: torch.dtype) -> bool:
    """Whether tiles of ``dtype`` go to ``tl.dot`` unwidened (GPU, bf16/fp16)."""
    return not interpreting() and dtype in (torch.bfloat16, torch.float16)


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def check_tensor(name: str, t: torch.Tensor, ndim: int, dtypes: tuple[torch.dtype, ...] | None = None) -> None:
    check(isinstance(t, torch.Tensor), f"{name} must be a tensor")
    check(t.dim() == ndim, f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    if dtypes is not None:
        check(t.dtype in dtypes, f"{name} must be one of {[str(d) for d in dtypes]}, got {t.dtype}")


def check_inner_contiguous(name: str, t: torch.Tensor) -> None:
    check(t.stride(-1) == 1, f"{name} must be contiguous in its last dim, got strides {t.stride()}")


def check_device(*tensors: torch.Tensor | None) -> None:
    devices = {t.device for t in tensors if t is not None}
    check(len(devices) == 1, f"all tensors must be on one device, got {sorted(map(str, devices))}")
    dev = next(iter(devices))
    if dev.type == "meta":
        check(_CAPTURED is not None, "meta tensors are only accepted under capture_launches() (the compile check)")
    elif dev.type != "cuda":
        check(interpreting(), f"tensors on {dev} need TRITON_INTERPRET=1 (set before importing the kernels)")


def pow2(x: int, lo: int = 1) -> int:
    return max(lo, triton.next_power_of_2(int(x)))


# Triton's defaults; a config names its own where a kernel needs other values.
DEFAULT_WARPS = 4
DEFAULT_STAGES = 3


@dataclass(frozen=True)
class LaunchConfig:
    """What a launcher picks for one launch: the grid, the tile constexprs (block sizes), warps and pipeline stages.
    Shape-derived constexprs that are not a choice (head counts, padded head dim, flags) stay in the launcher."""

    grid: tuple[int, ...]
    tiles: dict[str, int] = field(default_factory=dict)
    num_warps: int = DEFAULT_WARPS
    num_stages: int = DEFAULT_STAGES


@dataclass
class Launch:
    """One recorded launch (:func:`capture_launches`): the kernel and the exact arguments the launcher passed."""

    kernel: Any  # triton JITFunction
    config: LaunchConfig
    args: tuple
    constexprs: dict[str, Any]


_CAPTURED: list[Launch] | None = None


@contextlib.contextmanager
def capture_launches() -> Iterator[list[Launch]]:
    """Record every :func:`launch` in the block instead of running it; launchers then accept ``meta`` tensors (their
    outputs are ``meta`` too). The compile check's way to see what a layer launches at a shape without a GPU."""
    global _CAPTURED
    before, _CAPTURED = _CAPTURED, []
    try:
        yield _CAPTURED
    finally:
        _CAPTURED = before


def launch(kernel, cfg: LaunchConfig, *args, **constexprs) -> None:
    """``kernel[cfg.grid](*args, **cfg.tiles, **constexprs)`` with the config's warps and stages (or, under
    :func:`capture_launches`, the record of it)."""
    if _CAPTURED is not None:
        _CAPTURED.append(Launch(kernel, cfg, args, {**cfg.tiles, **constexprs}))
        return
    kernel[cfg.grid](*args, **cfg.tiles, **constexprs, num_warps=cfg.num_warps, num_stages=cfg.num_stages)


# NOTE: the interpreter's dot is a BLAS call whose rounding can depend on a row's place in the tile; on a GPU every
# row of a tile runs the same MMA sequence. Widening to fp64 there (then rounding to fp32) keeps identical rows
# bit-identical wherever they sit — what δ = 0 folding relies on — and is only more accurate.
_WIDE = tl.constexpr(tl.float64 if interpreting() else tl.float32)


@triton.jit
def dot(a, b, NATIVE: tl.constexpr):
    """``a @ b`` with fp32 accumulation (see the module docstring for the policy)."""
    if NATIVE:
        return tl.dot(a, b)
    return tl.dot(a.to(_WIDE), b.to(_WIDE), input_precision="ieee").to(tl.float32)


def fix_rounding(dtype: torch.dtype) -> bool:
    """Whether casts to ``dtype`` need :func:`cast`'s explicit rounding: the interpreter truncates fp32 → bf16."""
    return interpreting() and dtype == torch.bfloat16


@triton.jit
def cast(x, dtype: tl.constexpr, FIX: tl.constexpr):
    """``x.to(dtype)`` rounding to nearest even. With ``FIX`` (interpreter, bf16 target) the fp32 value is rounded
    to bf16's 8-bit mantissa by hand first, so that the interpreter's truncating cast is exact."""
    if FIX:
        b = x.to(tl.float32).to(tl.uint32, bitcast=True)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
        x = b.to(tl.float32, bitcast=True)
    return x.to(dtype)
