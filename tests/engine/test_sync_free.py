"""The sync-free triton pass: count-limited launches (upper-bound grids, device-side counts) and the host-read bound.

Host reads are counted with :func:`specfold.bench.ops.count_ops` (ops that need a host value: ``item``,
``nonzero``, ``bool``/``int`` of a tensor, …) plus every ``Tensor.tolist``/``numpy`` call, which the dispatcher
does not see on CPU (``tolist`` of a CPU tensor dispatches nothing; on CUDA it is a device-to-host copy) — so the
bound below is a bound on what a GPU would wait for.
"""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

pytest.importorskip("triton")

from specfold.bench.ops import count_ops  # noqa: E402
from specfold.engine.folded import FoldedVerifier  # noqa: E402
from specfold.engine.kernels.attention import attend_rows  # noqa: E402
from specfold.engine.kernels.ffn import ffn_rows, linear_rows  # noqa: E402
from specfold.engine.kernels.qkv import qkv_rope  # noqa: E402
from specfold.engine.reference import attend_rows_ref, ffn_rows_ref, linear_rows_ref, qkv_rope_ref  # noqa: E402
from specfold.model.loading import load_checkpoint  # noqa: E402

EPS = 1e-6
HOST_READ_METHODS = frozenset({torch.Tensor.tolist, torch.Tensor.numpy})


class _HostReads(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.reads += func in HOST_READ_METHODS
        return func(*args, **(kwargs or {}))


def host_reads(fn) -> tuple[int, dict[str, int]]:
    """Host reads of ``fn()``: dispatched syncs + ``tolist``/``numpy`` calls, and the dispatched ones by op."""
    mode = _HostReads()
    with mode:
        ops = count_ops(fn)
    return ops.syncs + mode.reads, {**ops.sync_ops(), "tolist/numpy": mode.reads}


def _count(r: int, device) -> torch.Tensor:
    return torch.tensor([r], dtype=torch.int32, device=device)


def test_qkv_and_ffn_stop_at_the_device_count(device, matches) -> None:
    m, e, f, hq, hkv, d, live = 48, 40, 56, 4, 2, 16, 19
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(m, e, generator=gen)
    rows = torch.randperm(m, generator=gen).to(torch.int32)
    rows[live:] = -1  # the gate's padding: never read past the count
    nw = 1 + 0.1 * torch.randn(e, generator=gen)
    w = torch.randn((hq + 2 * hkv) * d, e, generator=gen) * e**-0.5
    cos, sin = torch.randn(8, d, generator=gen), torch.randn(8, d, generator=gen)
    got = qkv_rope(h.to(device), rows.to(device), nw.to(device), EPS, w.to(device), None, cos.to(device),
                   sin.to(device), None, hq, hkv, count=_count(live, device))
    want = qkv_rope_ref(h.double(), rows, nw.double(), EPS, w.double(), None, cos.double(), sin.double(), None, hq,
                        hkv, count=_count(live, "cpu"))
    for g, w64 in zip(got, want, strict=True):
        assert g.shape[0] == m
        matches(g[:live].cpu(), w64[:live])
    wgu = torch.randn(2 * f, e, generator=gen) * e**-0.5
    wd = torch.randn(e, f, generator=gen) * f**-0.5
    sentinel = 7.0
    out = ffn_rows(h.to(device), rows.to(device), nw.to(device), EPS, wgu.to(device), wd.to(device),
                   torch.full((m, e), sentinel, device=device), count=_count(live, device)).cpu()
    ref = ffn_rows_ref(h.double(), rows, nw.double(), EPS, wgu.double(), wd.double(),
                       torch.full((m, e), sentinel, dtype=torch.float64), count=_count(live, "cpu"))
    done = rows[:live].long()
    skipped = torch.ones(m, dtype=torch.bool)
    skipped[done] = False
    assert (out[skipped] == sentinel).all()  # rows past the count are never written
    matches(out[done], ref[done])


def test_linear_rows_gathers_and_stops_at_the_count(device, matches) -> None:
    m, e, f, live = 40, 24, 72, 13
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(m, f, generator=gen)
    w = torch.randn(e, f, generator=gen) * f**-0.5
    rows = torch.randperm(m, generator=gen).to(torch.int32)
    sentinel = -3.0
    out = linear_rows(x.to(device), rows.to(device), w.to(device), torch.full((m, e), sentinel, device=device),
                      _count(live, device), gather=True).cpu()
    ref = linear_rows_ref(x.double(), rows, w.double(), torch.full((m, e), sentinel, dtype=torch.float64),
                          _count(live, "cpu"), gather=True)
    done = rows[:live].long()
    skipped = torch.ones(m, dtype=torch.bool)
    skipped[done] = False
    assert (out[skipped] == sentinel).all()
    matches(out[done], ref[done])


def test_attention_with_a_device_prefix_length(device, matches) -> None:
    """A prefix view longer than the live prefix (a graph bucket): keys past ``prefix_len`` are ignored."""
    k, n, hq, hkv, d, p, live = 2, 8, 4, 2, 16, 40, 23
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(k * n, hq, d, generator=gen)
    pool_k, pool_v = torch.randn(k * n, hkv, d, generator=gen), torch.randn(k * n, hkv, d, generator=gen)
    pk, pv = torch.randn(hkv, p, d, generator=gen), torch.randn(hkv, p, d, generator=gen)
    table = torch.arange(k * n).view(k, n)
    lists = torch.arange(n).repeat(k, 1).to(torch.int32)
    counts = torch.tensor([n, 5], dtype=torch.int32)
    args = (q, table, lists, counts, pk, pv, pool_k, pool_v, table)
    got = attend_rows(*(t.to(device) for t in args), d**-0.5, table.to(device), k * n,
                      prefix_len=_count(live, device))
    want = attend_rows_ref(*(t.double() if t.is_floating_point() else t for t in args), d**-0.5, table, k * n,
                           prefix_len=_count(live, "cpu"))
    listed = torch.cat([torch.arange(n), n + torch.arange(5)])
    matches(got.o.cpu()[listed], want.o[listed])
    matches(got.z.cpu()[listed], want.z[listed])


def _tiny_pass(ckpt, device):
    _, cfg, net = load_checkpoint(ckpt, dtype=torch.float32)
    net = net.to(device)
    gen = torch.Generator().manual_seed(3)
    cache = net.new_cache(32)
    net(torch.randint(0, 299, (9,), generator=gen)[None].to(device), cache, mask="causal", write_cache=True)
    parents = torch.tensor([-1, 0, 1, 0])  # a chain 0 → 1 → 2 and a sibling 3
    states = torch.full((4, 8), cfg.mask_token_id, dtype=torch.long)
    states[0, :3] = torch.randint(0, 299, (3,), generator=gen)
    for i in range(1, 4):
        states[i] = states[parents[i]]
        states[i, 3 + i] = 7
    return net, cache, states.to(device), parents.to(device)


def test_one_host_read_per_triton_pass(fd_ckpt, device) -> None:
    """The triton pass reads the host once (statistics + parents, after the LM head); the torch engine, documented
    here, reads it per layer: ``pool_index`` and the corrected-row list (``nonzero``), the guard's fallback rows
    (``nonzero``), the FFN gate's count (``int``) and the FFN pool (``nonzero``), plus parents and statistics."""
    net, cache, states, parents = _tiny_pass(fd_ckpt, device)
    always = {"attention": "correct", "cost": None, "dense_fallback": False, "delta": 0.1}
    triton_v = FoldedVerifier(net, backend="triton", **always)
    torch_v = FoldedVerifier(net, backend="torch", **always)
    want = torch_v.verify(cache, states, parents)
    reads, by_op = host_reads(lambda: triton_v.verify(cache, states, parents))
    assert reads == 1, by_op
    layers = len(net.layers)
    t_reads, t_by_op = host_reads(lambda: torch_v.verify(cache, states, parents))
    assert t_reads == 5 * layers + 2, t_by_op
    got = triton_v.verify(cache, states, parents)
    assert got.stats.folded_triples == want.stats.folded_triples > 0
    assert (got.logits - want.logits).abs().max().item() <= 1e-3


def test_triton_pass_rejects_bad_parents_after_reading_them(fd_ckpt, device) -> None:
    net, cache, states, _ = _tiny_pass(fd_ckpt, device)
    v = FoldedVerifier(net, backend="triton", attention="correct", cost=None, dense_fallback=False)
    with pytest.raises(ValueError, match="parents must be -1 for row 0"):
        v.verify(cache, states, torch.tensor([-1, 0, 3, 0], device=device))  # 3 is not an earlier row


def test_imposed_fold_ratio_is_the_same_on_triton_and_torch(fd_ckpt, device) -> None:
    """The GPU check's imposed fold ratios: both backends fold the same rows and agree, still one host read."""
    net, cache, states, parents = _tiny_pass(fd_ckpt, device)
    always = {"attention": "correct", "cost": None, "dense_fallback": False, "delta": 0.0, "ffn": "paper",
              "imposed_fold": 0.6}
    triton_v = FoldedVerifier(net, backend="triton", **always)
    want = FoldedVerifier(net, backend="torch", **always).verify(cache, states, parents)
    reads, by_op = host_reads(lambda: triton_v.verify(cache, states, parents))
    assert reads == 1, by_op
    got = triton_v.verify(cache, states, parents)
    assert got.stats.folded_triples == want.stats.folded_triples > 0
    assert (got.logits - want.logits).abs().max().item() <= 1e-3
