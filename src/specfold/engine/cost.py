"""When folding pays: a per-layer cost rule, from the layer's shapes and two constants measured on the machine.

Dims: ``K`` branches, ``N`` block positions, ``M = K·N`` rows, ``P`` prefix length, ``R`` rows recomputed at the
layer input, ``C`` folded rows whose attention Eq. 8 corrects, ``R_f`` rows whose FFN runs, ``E`` hidden,
``Hq``/``Hkv`` heads, ``D`` head dim, ``F`` FFN size.

Work is counted in multiply-adds (MACs); framework bookkeeping (the gate, compaction, gathers, scatters: a roughly
fixed number of small ops per layer whatever the row counts) is converted to MACs with the machine's measured
``seconds per op`` and ``MACs per second``::

    per row:   qkv = E·(Hq + 2·Hkv)·D     attn = 2·Hq·D·(P + N)     o = Hq·D·E     ffn = 3·E·F
    dense attention part  = M·(qkv + attn + o)
    folded, direct        = R·qkv + 2·Hq·D·(R·P + M·N) + M·o   + ops_direct · c    (split: prefix per pool row)
    folded, Eq. 8         = R·qkv + R·attn + (R + C)·o + 2·C·R·Hq·D + ops_correct · c
    dense FFN             = M·ffn
    folded FFN            = R_f·ffn                            + ops_ffn · c
    c = seconds_per_op · macs_per_second

Each layer takes the cheapest attention part (dense / direct / Eq. 8) and, separately, the cheaper FFN (dense /
folded). A dense part is exact; at δ = 0 every choice is exact (the identity the tests check), at δ > 0 a dense
part recomputes what folding would have inherited. The op counts below are what each choice dispatches beyond
its dense counterpart inside the same folded layer (the gate runs either way), counted by
``python scripts/batch_pass_costs.py`` (``extra_ops_per_layer``) on a recorded R = 8 pass of the embedded model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

# Framework ops a folded layer dispatches for a choice beyond its dense counterpart (torch engine; see the module
# docstring). Direct attention dispatches no more ops than a dense attention part (measured: -1); it is charged
# the three gathers of the Q/K/V tables it builds over every row.
OPS_DIRECT = 3
OPS_CORRECT = 317
OPS_FFN = 16


@dataclass(frozen=True)
class Machine:
    """What one framework op and one multiply-add cost on this device and dtype (measured once per process)."""

    seconds_per_op: float
    macs_per_second: float

    @property
    def op_macs(self) -> float:
        return self.seconds_per_op * self.macs_per_second


_MEASURED: dict[tuple[str, torch.dtype], Machine] = {}


def measure_machine(device: torch.device | str, dtype: torch.dtype) -> Machine:
    """Median time of a small elementwise op and MACs/s of a GEMM of a verification pass's size, cached per
    (device, dtype). Costs a few tens of milliseconds once."""
    dev = torch.device(device)
    key = (str(dev), dtype)
    if key in _MEASURED:
        return _MEASURED[key]
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def median_seconds(fn, reps: int) -> float:
        fn()
        sync()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t0)
        return sorted(times)[len(times) // 2]

    x = torch.ones(64, 64, dtype=dtype, device=dev)
    ops = 20
    op = median_seconds(lambda: [x.add(1.0) for _ in range(ops)], 7) / ops
    a = torch.randn(256, 512, device=dev).to(dtype)
    w = torch.randn(512, 512, device=dev).to(dtype)
    gemm = median_seconds(lambda: torch.nn.functional.linear(a, w), 5)
    machine = Machine(seconds_per_op=op, macs_per_second=256 * 512 * 512 / max(gemm, 1e-9))
    _MEASURED[key] = machine
    return machine


@dataclass(frozen=True)
class LayerCost:
    """Per-row MACs of one layer's parts (the module docstring's formulas) and the machine's op cost in MACs."""

    qkv: int
    o: int
    ffn: int
    attn_per_key: int  # 2·Hq·D: one score and one value row per key
    op_macs: float

    @classmethod
    def of(cls, hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int, op_macs: float) -> LayerCost:
        return cls(
            qkv=hidden * (heads + 2 * kv_heads) * head_dim, o=heads * head_dim * hidden, ffn=3 * hidden * ffn,
            attn_per_key=2 * heads * head_dim, op_macs=op_macs,
        )

    def attention_plan(
        self, m: int, n: int, prefix: int, r: int, c: int, options: tuple[str, ...] = ("dense", "direct", "correct")
    ) -> str:
        """The cheapest of ``options`` (``"dense"``, ``"direct"``, ``"correct"``) for the attention part with ``r``
        recomputed and ``c`` corrected of ``m`` rows over ``prefix + n`` keys (first of equals wins)."""
        attn = self.attn_per_key * (prefix + n)
        costs = {
            "dense": m * (self.qkv + attn + self.o),
            # split (attention_rows.attend_split): the prefix part per pool row, the block part per row
            "direct": r * self.qkv + (r * prefix + m * n) * self.attn_per_key + m * self.o
            + OPS_DIRECT * self.op_macs,
            "correct": r * (self.qkv + attn) + (r + c) * self.o + c * r * self.attn_per_key
            + OPS_CORRECT * self.op_macs,
        }
        return min(options, key=costs.__getitem__)

    def ffn_folds(self, m: int, r_ffn: int) -> bool:
        """Whether running the FFN on ``r_ffn`` of ``m`` rows (and gathering the rest) beats the dense FFN."""
        return r_ffn * self.ffn + OPS_FFN * self.op_macs < m * self.ffn


# --- the per-pass decision (issue 36.3): fold at all, or run the dense pass -------------------------------------
#
# The per-layer rule above never counts the gate: it runs in every folded layer whatever the layer then does. Before
# a pass's first gate, folding pays only if the rows it is expected to skip cost more than the bookkeeping every
# folded layer adds (the gate, compaction, the table gathers and the FFN gate). Both are measured once per process,
# device, dtype and layer shape on the model's own first layer (:func:`measure_pass`):
#
#     t_dense  one dense layer over M0 rows and a prefix of P0 keys
#     t_fold   the folded layer on the same rows at fold ratio 1/2 (Eq. 5's decisions imposed, direct attention,
#              FFN folded): its gate, packing and the rows it still computes
#     G        = t_fold − t_dense · w(1/2): the bookkeeping of one folded layer (seconds)
#
# with ``w(f)`` the share of a dense layer's MACs that a fold ratio ``f`` leaves (the main branch is never folded;
# the attention scores and o_proj run on every row, as direct attention runs them):
#
#     w(f) = (r · (qkv + ffn) + M · (attn(P) + o)) / (M · (qkv + attn(P) + o + ffn)),   r = S·N + (1 − f)(M − S·N)
#
# (S main branches: one per request of the pass, none of which folds)
#
# A pass of M rows over P keys folds iff  G < t_dense · s(M, P) · (1 − w(f̂)),  s = the pass's dense MACs over the
# calibration's. ``f̂`` is the verifier's running fold ratio (see :class:`specfold.engine.folded.FoldedVerifier`).

PASS_ROWS = 256  # M0: 8 branches of 32 rows, a typical verification pass
PASS_PREFIX = 128  # P0
PASS_BLOCK = 32


@dataclass(frozen=True)
class PassCost:
    """The per-pass rule's measured constants (module comment above) and the layer's per-row MACs."""

    layer: LayerCost
    dense_seconds: float  # t_dense: one dense layer over PASS_ROWS rows, PASS_PREFIX keys
    gate_seconds: float  # G: the bookkeeping one folded layer adds (>= 0)
    measure_seconds: float = 0.0  # wall seconds the measurement took (once per process, device, dtype and shape)

    def _dense_macs(self, m: int, prefix: int, n: int) -> float:
        c = self.layer
        return m * (c.qkv + c.attn_per_key * (prefix + n) + c.o + c.ffn)

    def remaining(self, m: int, n: int, prefix: int, fold: float, roots: int = 1) -> float:
        """``w(f)``: the share of the dense layer's MACs still computed at fold ratio ``fold``, with ``roots`` main
        branches (one per request of a batched pass) that never fold."""
        c = self.layer
        r = roots * n + (1.0 - fold) * max(m - roots * n, 0)
        kept = r * (c.qkv + c.ffn) + m * (c.attn_per_key * (prefix + n) + c.o)
        return kept / self._dense_macs(m, prefix, n)

    def folding_pays(self, m: int, n: int, prefix: int, fold: float, roots: int = 1) -> bool:
        """Whether a pass of ``m`` rows (block ``n``, ``prefix`` keys, ``roots`` requests' main branches) expected to
        fold ``fold`` of its draft triples beats the dense pass, per layer."""
        scale = self._dense_macs(m, prefix, n) / self._dense_macs(PASS_ROWS, PASS_PREFIX, PASS_BLOCK)
        saved = self.dense_seconds * scale * (1.0 - self.remaining(m, n, prefix, fold, roots))
        return self.gate_seconds < saved
