"""Kernel compile check: every Triton kernel of the folded layer compiled for a GPU target, without a GPU.

Used by ``specfold bench kernels --compile-only``. For each shape (:data:`~specfold.bench.shapes.SHAPES`) and
dtype, :func:`layer_launches` runs the Triton backend's layer (:func:`~specfold.engine.triton_backend.plan_layer`
and :func:`~specfold.engine.triton_backend.folded_layer_triton`) on ``meta`` tensors under
:func:`~specfold.engine.kernels._common.capture_launches`: every launch is recorded, with the arguments, tile sizes,
warps and stages its launcher picked (the launchers' own ``<op>_config`` functions — the compile check has no copy
of that choice), and nothing runs. Three passes cover the variants a GPU run launches: the eager single-request
pass, the CUDA-graph / batched pass (a device-side prefix length) and the imposed-fold benchmark gate.

:func:`compile_launch` then compiles one recorded launch for ``sm_80`` / ``sm_90`` the way Triton's launcher would
(the same argument specialisation: dtypes, 16-byte alignment and divisibility of the integer arguments), with
Triton's bundled ``ptxas``; registers, spills and stack come from ptxas' report, shared memory from the compiled
kernel's metadata (what the launch requests) plus any static shared memory ptxas reports.

Limits checked (:func:`violations`): shared memory within the architecture's per-block opt-in maximum (A100 163
KiB, H100 227 KiB), registers × threads within the 64 Ki registers of a block, no spills beyond
:data:`SPILL_ALLOWANCE`.

Dims: ``B`` draft branches (``K = B + 1``), ``N`` block length, ``P`` prefix length (the check's defaults: the
embedded draft graph's B = 7, N = 32, P = 512; tile choices depend on ``N`` and the shape, not on ``K`` or ``P``).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import torch

from specfold.bench.shapes import SHAPES, LayerShape

# name -> (compute capability, max shared memory per block in bytes: the opt-in limit of cudaFuncSetAttribute)
ARCHS: dict[str, tuple[int, int]] = {
    "sm_80": (80, 163 * 1024),  # A100
    "sm_90": (90, 227 * 1024),  # H100 / H200
}
REGISTERS_PER_BLOCK = 64 * 1024
COMPILE_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}

# Spill bytes (stores) a kernel may have at a dtype, with the reason; a (kernel, dtype) not named here may not spill.
# fp32 tiles take Triton's FMA dot (``input_precision="ieee"``: fp32 models stay fp32-exact), whose operands are held
# in registers along the whole reduction; bf16 — what a GPU serves — runs on the MMA units and spills nowhere.
# Measured with triton 3.7.1 and 3.6.0 (both bundle ptxas 12.8); an fp32 model on a GPU is an exactness check.
SPILL_ALLOWANCE: dict[tuple[str, str], tuple[int, str]] = {
    ("attend_rows", "fp32"): (2048, "sm_90 only (sm_80: none): the FMA score dot over D = 128 at 255 registers "
                                    "(1.3-1.9 KB; fewer rows or more warps did not remove it)"),
    ("correct_folded", "fp32"): (64, "the signed P·V sums, fp32 FMA dots [16, 32] × [32, 128], at 255 registers "
                                     "(16-32 B)"),
    ("qkv_rope", "fp32"): (64, "sm_90, NLD shapes: two [64, 64] fp32 accumulators + the query-scale rows; SDAR "
                               "shapes: + the per-head q/k RMSNorm (24 B each)"),
}

# constexpr flags that make a launch a different variant of its kernel (suffix of the reported kernel name)
_VARIANTS = {"HAS_FOLD": "fold", "HAS_PLEN": "prefix_len", "GATHER": "gather"}


@dataclass
class KernelCompile:
    """One kernel compiled at one (shape, dtype, arch)."""

    kernel: str
    shape: str
    dtype: str
    arch: str
    compiled: bool
    error: str | None
    registers: int | None
    spills: int | None  # bytes of spill stores (ptxas)
    spill_loads: int | None
    stack_bytes: int | None
    shared_bytes: int | None
    num_warps: int
    num_stages: int
    tiles: dict[str, int]
    grid: list[int]
    seconds: float  # compile time

    def as_dict(self) -> dict:
        return asdict(self)


def _kernel_name(launch) -> str:
    base = launch.kernel.__name__.removeprefix("_").removesuffix("_kernel")
    flags = [tag for flag, tag in _VARIANTS.items() if launch.constexprs.get(flag)]
    return base + (f"[{','.join(flags)}]" if flags else "")


def layer_launches(
    shape: LayerShape,
    dtype: torch.dtype,
    branches: int = 7,
    block: int = 32,
    prefix: int = 512,
) -> dict[str, object]:
    """The distinct kernel launches of one folded layer at ``shape`` (name -> :class:`Launch`), recorded on ``meta``
    tensors. Needs the compiled kernels (``TRITON_INTERPRET`` unset when the kernel modules were imported)."""
    from specfold.bench.layer import model_config
    from specfold.engine.kernels._common import capture_launches, interpreting
    from specfold.engine.layer_types import FoldConfig, LayerContext
    from specfold.engine.triton_backend import folded_layer_triton, plan_layer
    from specfold.model.transformer import Layer

    if interpreting():
        raise RuntimeError("the compile check needs TRITON_INTERPRET unset (the interpreter compiles nothing)")
    k, n, e, d, hkv = branches + 1, block, shape.hidden, shape.head_dim, shape.kv_heads
    meta = torch.device("meta")
    with meta:
        layer = Layer(model_config(shape)).to(dtype)
    h = torch.empty(k * n, e, dtype=dtype, device=meta)  # [K*N, E]
    parents = torch.empty(k, dtype=torch.long, device=meta)  # [K]
    cache_k = torch.empty(hkv, 4 * prefix, d, dtype=dtype, device=meta)  # a cache longer than the live prefix
    prefix_k = prefix_v = cache_k[:, :prefix]  # [Hkv, P, D] strided view, as PrefixCache.layer gives it
    cos = torch.empty(n, d, dtype=dtype, device=meta)
    qscale = torch.empty(n, dtype=dtype, device=meta) if shape.family_name == "nld" else None  # Llama-4 query scale
    cfg = FoldConfig(delta=0.1, backend="triton", attention="correct")
    launches: dict[str, object] = {}
    keys: dict[str, tuple] = {}
    with capture_launches() as captured:
        for prefix_len, fold in ((None, None), (torch.empty(1, dtype=torch.int32, device=meta), None),
                                 (None, torch.empty(k, n, dtype=torch.bool, device=meta))):
            ctx = LayerContext(cos=cos, sin=cos, qscale=qscale, scale=d**-0.5, parents=parents, prefix_len=prefix_len)
            plan = plan_layer(h.view(k, n, e), parents, cfg.delta, fold)
            folded_layer_triton(layer, h, plan, ctx, prefix_k, prefix_v, cfg)
    for launch in captured:
        name = _kernel_name(launch)
        key = (launch.config, tuple(sorted(launch.constexprs.items())),
               tuple((str(a.dtype), tuple(a.stride())) if isinstance(a, torch.Tensor) else a for a in launch.args))
        if name in keys and keys[name] != key:  # same kernel and flags, other arguments: report both
            name = f"{name}#{sum(1 for s in keys if s.split('#')[0] == name) + 1}"
        if name not in keys:
            keys[name] = key
            launches[name] = launch
    return launches


_PTXAS = {
    "registers": re.compile(r"Used (\d+) registers"),
    "spills": re.compile(r"(\d+) bytes spill stores"),
    "spill_loads": re.compile(r"(\d+) bytes spill loads"),
    "stack_bytes": re.compile(r"(\d+) bytes stack frame"),
    "smem": re.compile(r"(\d+) bytes smem"),
}


def _ptxas_report(log: str) -> dict[str, int | None]:
    out = {}
    for key, pat in _PTXAS.items():
        found = [int(x) for x in pat.findall(log)]
        out[key] = max(found) if found else (0 if key == "smem" else None)
    return out


def _specialise(launch, arch: str):
    """Triton's launch-time view of one recorded launch on ``arch``: its cache key and what ``triton.compile``
    takes. NOTE: Triton's own binder, so the specialisation (dtypes, 16-byte alignment, divisibility by 16 and
    ``== 1`` of integer arguments) is the one a launch on a GPU would compile."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", ARCHS[arch][0], 32)
    kernel, cfg = launch.kernel, launch.config
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    kwargs = {**launch.constexprs, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    bound, specialization, options = binder(*launch.args, **kwargs)
    key = (kernel.__name__, arch, str(specialization), str(sorted(kwargs.items())))
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    return key, ASTSource(kernel, signature, constexprs, attrs), target, options.__dict__


def compile_launch(launch, arch: str) -> dict:
    """Compile one recorded launch for ``arch`` (``sm_80``, ``sm_90``) as Triton's launcher would specialise it.
    Returns ``compiled``, ``error``, ``registers``, ``spills``, ``spill_loads``, ``stack_bytes``, ``shared_bytes``,
    ``seconds``. Always recompiles (from Triton's cache there would be no ptxas report)."""
    return _compile(*_specialise(launch, arch)[1:])


def _compile(src, target, options: dict) -> dict:
    import triton
    from triton import knobs

    log = io.StringIO()
    t0 = time.perf_counter()
    try:
        with knobs.compilation.scope(), knobs.nvidia.scope():
            knobs.compilation.always_compile = True
            knobs.nvidia.dump_ptxas_log = True  # ptxas -v's report, printed by Triton: captured here
            with contextlib.redirect_stdout(log):
                compiled = triton.compile(src, target=target, options=options)
    except Exception as exc:  # a compile error is a result of the check, not a crash of it
        lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
        return {"compiled": False, "error": f"{type(exc).__name__}: {' | '.join(lines[:3])}"[:2000],
                "registers": None, "spills": None, "spill_loads": None, "stack_bytes": None, "shared_bytes": None,
                "seconds": time.perf_counter() - t0}
    rep = _ptxas_report(log.getvalue())
    return {"compiled": True, "error": None, "registers": rep["registers"], "spills": rep["spills"],
            "spill_loads": rep["spill_loads"], "stack_bytes": rep["stack_bytes"],
            "shared_bytes": int(compiled.metadata.shared) + rep["smem"], "seconds": time.perf_counter() - t0}


def compile_kernels(
    shapes: list[str] | None = None,
    dtypes: list[str] | None = None,
    archs: list[str] | None = None,
    branches: int = 7,
    block: int = 32,
    jobs: int | None = None,
) -> Iterator[KernelCompile]:
    """A :class:`KernelCompile` for every (kernel, shape, dtype, arch), in that order as the results are read (names
    are checked at once: ``ValueError``). A launch that Triton would specialise identically at two shapes (the same
    cache key) is compiled once and reported at both. The distinct compiles run in ``jobs`` worker processes (default:
    the cores this process may use; 1: in this process)."""
    shapes = shapes or list(SHAPES)
    dtypes = dtypes or ["bf16", "fp32"]
    archs = archs or list(ARCHS)
    for what, names, known in (("shape", shapes, SHAPES), ("dtype", dtypes, COMPILE_DTYPES), ("arch", archs, ARCHS)):
        for name in names:
            if name not in known:
                raise ValueError(f"unknown {what} {name!r}; choose from {', '.join(known)}")
    return _compile_all(shapes, dtypes, archs, branches, block, jobs or _cores())


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


# The distinct compiles of one _compile_all, read by its forked workers (passed by index: an ASTSource holds the
# kernel function, which does not pickle).
_JOBS: list[tuple] = []


def _compile_job(i: int) -> dict:
    return _compile(*_JOBS[i])


def _compile_all(shapes, dtypes, archs, branches, block, jobs) -> Iterator[KernelCompile]:
    rows, unique = [], {}
    for s in shapes:
        for dt in dtypes:
            for name, launch in layer_launches(SHAPES[s], COMPILE_DTYPES[dt], branches, block).items():
                for a in archs:
                    key, *job = _specialise(launch, a)
                    unique.setdefault(key, (dt, job))
                    rows.append((name, s, dt, a, launch.config, key))
    keys = list(unique)
    with _Compiles(keys, [unique[k][1] for k in keys], [unique[k][0] for k in keys], jobs) as results:
        for name, s, dt, a, cfg, key in rows:
            yield KernelCompile(kernel=name, shape=s, dtype=dt, arch=a, num_warps=cfg.num_warps,
                                num_stages=cfg.num_stages, tiles=dict(cfg.tiles), grid=list(cfg.grid), **results[key])


class _Compiles:
    """``results[key]``: the compile of ``keys[i]`` (``jobs[i]``), waiting for it. NOTE: with ``workers > 1`` the
    compiles run in forked processes (each is single-threaded LLVM and ptxas work, and Triton's Python parts hold the
    GIL), the fp32 ones first (the slowest: FMA dots) so that the workers finish together; otherwise each runs here
    when its result is first read."""

    def __init__(self, keys: list, jobs: list[tuple], dtypes: list[str], workers: int):
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        self.jobs, self.index, self.done, self.pending = jobs, {k: i for i, k in enumerate(keys)}, {}, {}
        self.pool = None
        if workers > 1 and len(keys) > 1 and "fork" in multiprocessing.get_all_start_methods():
            _JOBS[:] = jobs
            self.pool = ProcessPoolExecutor(min(workers, len(keys)), mp_context=multiprocessing.get_context("fork"))
            for i in sorted(range(len(keys)), key=lambda i: dtypes[i] != "fp32"):  # stable: fp32 first
                self.pending[keys[i]] = self.pool.submit(_compile_job, i)

    def __getitem__(self, key) -> dict:
        if key not in self.done:
            future = self.pending.get(key)
            self.done[key] = future.result() if future else _compile(*self.jobs[self.index[key]])
        return self.done[key]

    def __enter__(self) -> _Compiles:
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            _JOBS.clear()


def spill_allowance(kernel: str, dtype: str) -> int:
    """Bytes of spill stores allowed for a reported kernel name (variants share their kernel's allowance)."""
    return SPILL_ALLOWANCE.get((kernel.split("[")[0], dtype), (0, ""))[0]


def violations(r: KernelCompile) -> list[str]:
    """What is wrong with one compile result: not compiled, shared memory over the arch's per-block limit,
    registers over a block's register file, spills beyond the kernel's allowance."""
    if not r.compiled:
        return [f"does not compile: {r.error}"]
    out = []
    limit = ARCHS[r.arch][1]
    if r.shared_bytes > limit:
        out.append(f"shared memory {r.shared_bytes} B > {limit} B ({r.arch})")
    if r.registers is None:
        out.append("no register count in the ptxas report")
    elif r.registers * 32 * r.num_warps > REGISTERS_PER_BLOCK:
        out.append(f"{r.registers} registers × {32 * r.num_warps} threads > {REGISTERS_PER_BLOCK}")
    allowed = spill_allowance(r.kernel, r.dtype)
    if r.spills is None:
        out.append("no spill figure in the ptxas report")
    elif r.spills > allowed:
        out.append(f"spills {r.spills} B of stores (allowed {allowed})")
    return out
