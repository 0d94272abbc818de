"""Block-diffusion training of a small Fast-dLLM-v2-family model from scratch (the embedded model).

Dims: ``Bt`` training rows, ``L`` sequence length (a multiple of the block size ``N``), ``E`` hidden, ``V`` vocab.

Each sequence is ``chat(prompt) + response + <|im_end|>`` padded to whole blocks. One forward sees two noisy
copies and the clean copy side by side (``[noisy_a; noisy_b; clean]``, ``3L`` rows, each at positions ``0..L-1``):

* clean row in block ``b`` attends to clean blocks ``<= b`` (block-causal: the prefix cache at inference);
* noisy row in block ``b`` attends to clean blocks ``< b`` and to its own noisy block bidirectionally
  (an active block over a cached prefix at inference).

Loss (logits shifted as in the family: position ``p`` is read from row ``p-1``):

* masked-token loss inside blocks: every masked response position ``p`` with ``p % N != 0`` from noisy row ``p-1``;
* a block's first position is never masked at inference (it is seeded from the previous block's last row), so
  response positions with ``p % N == 0`` are learned from clean row ``p-1``.

Masking is per (sequence, block) with a ratio ``t ~ U(0, 1)``; the two noisy copies carry complementary masks,
so each maskable token is trained in exactly one of them, and they share one clean copy.

With ``causal_copy`` a fourth copy ``causal`` (clean tokens; earlier clean blocks, then its own block causally)
adds an autoregressive loss: row ``p-1`` also predicts every maskable position ``p`` from exactly its left context.
Under random masks a token is a target with all of its left context visible only rarely (about 5 % of the time
for a token five positions into its block), yet that is the state in which inference commits e.g. the result of
``23+48=``; the real family inherits this ability from its autoregressive base model (Fast-dLLM-v2 adapts
Qwen2.5), a model trained from scratch has to get it from somewhere.

Rows that can carry no loss and that no loss row attends to are dropped before the forward (:class:`Layout`): noisy
blocks that hold only prompt in every sequence of the batch, and the clean copy of the last block. Batches are cut
from pools sorted by (blocks, first response block), so a batch drops between a sixth and a half of its rows (on
the synthetic suite a step takes about 0.7x the time of the full layout). The kept rows' logits equal those of the
full layout (a test checks it).

A run survives interruption: the wall-clock budget counts from step 0, the resumable state (weights, AdamW, the RNGs,
the data stream's position and the batches still pending in the current pool) is saved after the first step, every
``checkpoint_every`` steps, every ``checkpoint_minutes`` and when Ctrl-C or SIGTERM arrives (the step in flight
finishes first), and a resumed run cuts ``loss.jsonl`` back to its checkpoint's step, so the log holds every step
exactly once and the resumed steps are the uninterrupted run's (bit for bit in fp32 on one thread).
"""

from __future__ import annotations

import json
import math
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from specfold.model.families import config_from_dict
from specfold.model.random_checkpoint import save_checkpoint
from specfold.model.transformer import DLLM, rms_norm


@dataclass
class TrainConfig:
    out_dir: str
    tokenizer_dir: str
    steps: int = 3000
    max_minutes: float | None = None  # wall-clock budget: the LR schedule follows whichever runs out first
    batch_size: int = 32  # sequences per step (each with two complementary noisy copies)
    lr: float = 2e-3
    min_lr: float = 1e-4
    warmup: int = 100
    weight_decay: float = 0.01
    max_len: int = 96
    block_size: int = 32
    hidden_size: int = 256
    num_layers: int = 8
    num_heads: int = 8
    num_kv_heads: int = 2
    intermediate_size: int = 1024
    seed: int = 0
    checkpoint_every: int = 100  # save the resumable state every this many steps (and after the first)
    checkpoint_minutes: float = 5.0  # ... and whenever this much wall-clock time has passed since the last save
    bf16: bool = True  # autocast the GEMMs to bf16 on CPU (about 3x faster than fp32 there)
    init_from: str | None = None  # warm start: a checkpoint directory of the same shape (ignored on resume)
    mix: dict[str, int] | None = None  # train samples per task per round, e.g. {"synth-math": 3}; default 1 each
    causal_copy: bool = False  # add the causal copy (an autoregressive loss beside the masked-token loss)


@dataclass
class TrainResult:
    steps: int
    final_loss: float  # mean of the last 50 logged steps (across resumes; nan when no step was taken)
    seconds: float
    parameters: int
    export_dir: Path


def model_config_dict(cfg: TrainConfig, vocab_size: int) -> dict:
    """config.json of the trained model, in the Fast-dLLM-v2 checkpoint format."""
    return {
        "model_type": "Fast_dLLM_Qwen",
        "architectures": ["Fast_dLLM_QwenForCausalLM"],
        "vocab_size": vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "bd_size": cfg.block_size,
        "torch_dtype": "float32",
    }


def init_weights(net: DLLM, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    n_layers = len(net.layers)
    with torch.no_grad():
        for name, p in net.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            elif name.endswith("bqkv"):
                p.zero_()
            else:
                std = 0.02 / math.sqrt(2 * n_layers) if name.endswith(("wo", "w_down")) else 0.02
                p.copy_(torch.randn(p.shape, generator=gen) * std)


def training_mask(length: int, block: int, device: torch.device, causal: bool = False) -> torch.Tensor:
    """Bool ``[3L, 3L]`` (True = may attend) for the ``[noisy_a; noisy_b; clean]`` layout described above;
    ``[4L, 4L]`` with the causal copy appended (``[...; causal]``)."""
    blk = torch.arange(length, device=device) // block
    same = blk[:, None] == blk[None, :]
    before = blk[None, :] < blk[:, None]
    upto = blk[None, :] <= blk[:, None]
    left = same & (torch.arange(length, device=device)[None, :] <= torch.arange(length, device=device)[:, None])
    none = torch.zeros(length, length, dtype=torch.bool, device=device)
    tail = [none] if causal else []
    noisy_a = torch.cat([same, none, before, *tail], dim=1)  # own noisy block, earlier clean blocks
    noisy_b = torch.cat([none, same, before, *tail], dim=1)
    clean = torch.cat([none, none, upto, *tail], dim=1)  # clean blocks up to their own
    rows = [noisy_a, noisy_b, clean]
    if causal:  # earlier clean blocks, then its own block up to itself
        rows.append(torch.cat([none, none, before, left], dim=1))
    return torch.cat(rows, dim=0)


@dataclass(frozen=True)
class Layout:
    """Which rows of the full ``[noisy_a; noisy_b; clean]`` (``[...; causal]``) layout a batch computes: noisy
    (and causal) blocks ``first_noisy .. L/N-1`` and clean blocks ``0 .. clean_blocks-1``."""

    length: int  # L, a multiple of the block size
    block: int  # N
    first_noisy: int  # first block with a loss row in any sequence of the batch (0: all)
    clean_blocks: int  # L/N - 1 when slim (the last clean block feeds nothing), L/N for the full layout
    causal: bool = False  # a fourth copy: clean tokens, causal inside their block

    def rows(self) -> torch.Tensor:
        """Indices ``[R]`` into the full ``3L`` (``4L``) rows, in layout order."""
        lo, length = self.first_noisy * self.block, self.length
        noisy = torch.arange(lo, length)
        clean = torch.arange(2 * length, 2 * length + self.clean_blocks * self.block)
        causal = [3 * length + noisy] if self.causal else []
        return torch.cat([noisy, length + noisy, clean, *causal])

    def positions(self) -> torch.Tensor:
        """Absolute position ``[R]`` of each kept row."""
        return self.rows() % self.length

    def mask(self, device: torch.device) -> torch.Tensor:
        """Bool ``[R, R]``: :func:`training_mask` restricted to the kept rows."""
        keep = self.rows().to(device)
        return training_mask(self.length, self.block, device, self.causal)[keep][:, keep]


def training_logits(
    net: DLLM,
    tokens: torch.Tensor,  # [Bt, R] kept rows of [noisy_a; noisy_b; clean]
    positions: torch.Tensor,  # [R] absolute position of each row
    attn_mask: torch.Tensor,  # [R, R] bool, True = may attend
) -> torch.Tensor:
    """Returns ``[Bt, R, V]``."""
    bt, rows = tokens.shape
    cos, sin, _ = net.rope_tables(0, int(positions.max()) + 1)
    cos, sin = cos[positions].repeat(bt, 1), sin[positions].repeat(bt, 1)
    h = F.embedding(tokens, net.embed).reshape(bt * rows, -1)
    for layer in net.layers:
        q, k, v = layer.qkv(h, cos.to(h.dtype), sin.to(h.dtype), None)
        q = q.view(bt, rows, layer.hq, layer.d).transpose(1, 2)
        k = k.view(bt, rows, layer.hkv, layer.d).transpose(1, 2)
        v = v.view(bt, rows, layer.hkv, layer.d).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, enable_gqa=True)
        h = h + layer.attn_out(o.transpose(1, 2).reshape(bt * rows, layer.hq, layer.d))
        h = h + layer.ffn(h)
    h = rms_norm(h, net.final_norm, net.cfg.rms_norm_eps)
    return F.linear(h, net.head_weight()).view(bt, rows, -1)


@dataclass
class Batch:
    tokens: torch.Tensor  # [Bt, R] the layout's rows of noisy_a, noisy_b (complementary masks), clean
    targets: torch.Tensor  # [Bt, R] target token of the position each row predicts, -100 where no loss
    layout: Layout


def make_batch(
    seqs: list[tuple[list[int], int]],  # (token ids, response start)
    block: int,
    mask_id: int,
    pad_id: int,
    rng: random.Random,
    slim: bool = True,  # drop the rows no loss depends on (False: the full 3L layout, for tests)
    causal: bool = False,  # append the causal copy: each maskable position also predicted from its left context
) -> Batch:
    """Pad to whole blocks, draw complementary block-wise masks, and lay out ``[noisy; clean]`` with targets."""
    length = max(math.ceil(len(ids) / block) * block for ids, _ in seqs)
    rows_tok, rows_tgt = [], []
    for ids, resp_start in seqs:
        clean = torch.full((length,), pad_id, dtype=torch.long)
        clean[: len(ids)] = torch.tensor(ids)
        end = math.ceil(len(ids) / block) * block  # loss on whole blocks up to the one holding <|im_end|>
        pos = torch.arange(length)
        in_resp = (pos >= resp_start) & (pos < end)
        maskable = in_resp & (pos % block != 0)
        ratio = torch.tensor([rng.random() for _ in range(length // block)]).repeat_interleave(block)
        draw = torch.tensor([rng.random() for _ in range(length)]) < ratio
        tgt = torch.full(((4 if causal else 3) * length,), -100, dtype=torch.long)
        noisy = []
        for copy, m in enumerate((maskable & draw, maskable & ~draw)):  # the complementary pair
            noisy.append(torch.where(m, torch.full_like(clean, mask_id), clean))
            masked_pos = m.nonzero().flatten()
            tgt[copy * length + masked_pos - 1] = clean[masked_pos]  # row p-1 predicts position p (shifted)
        first_pos = (in_resp & (pos % block == 0) & (pos > 0)).nonzero().flatten()
        tgt[2 * length + first_pos - 1] = clean[first_pos]
        if causal:
            tgt[3 * length + maskable.nonzero().flatten() - 1] = clean[maskable]
        rows_tok.append(torch.cat([*noisy, clean, *([clean] if causal else [])]))
        rows_tgt.append(tgt)
    # A noisy row of block b predicts a position of block b (p % N != 0), so blocks before the earliest response
    # block carry no loss; no row attends to the clean last block, and its rows predict the next block (none).
    n_blocks = length // block
    if slim:
        layout = Layout(length, block, min(resp_start for _, resp_start in seqs) // block, n_blocks - 1, causal)
    else:
        layout = Layout(length, block, 0, n_blocks, causal)
    keep = layout.rows()
    return Batch(torch.stack(rows_tok)[:, keep], torch.stack(rows_tgt)[:, keep], layout)


def sequences(
    tokenizer, seed: int, max_len: int, mix: dict[str, int] | None = None
) -> Iterator[tuple[list[int], int]]:
    """Endless ``(ids, response_start)`` from the synthetic suite's train split (tasks interleaved by ``mix``);
    over-long ones are skipped."""
    from specfold.eval.tasks.synthetic import iter_train
    from specfold.train.tokenizer import render_training_text

    for sample in iter_train(seed=seed, weights=mix):
        prompt_text, response_text = render_training_text(sample)
        p = tokenizer.encode(prompt_text, add_special_tokens=False)
        r = tokenizer.encode(response_text, add_special_tokens=False)
        if len(p) + len(r) <= max_len:
            yield list(p) + list(r), len(p)


def lr_at(cfg: TrainConfig, step: int, seconds: float = 0.0) -> float:
    """Linear warm-up, then cosine decay over the run; the run's progress is the larger of its step fraction and,
    with ``max_minutes``, its time fraction."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = progress_fraction(cfg, step, seconds)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * min(1.0, frac)))


def progress_fraction(cfg: TrainConfig, step: int, seconds: float) -> float:
    frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    if cfg.max_minutes:
        frac = max(frac, seconds / (60 * cfg.max_minutes))
    return frac


BUCKET = 8  # steps whose sequences are drawn together and sorted, so a batch pads little and drops many rows


def bucket_key(seq: tuple[list[int], int], cfg: TrainConfig) -> tuple[int, int, int]:
    """Sort key of a ``(ids, response_start)`` pool: blocks, then first response block, then length."""
    ids, resp_start = seq
    return math.ceil(len(ids) / cfg.block_size), resp_start // cfg.block_size, len(ids)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def export_model(net: DLLM, cfg_dict: dict, tokenizer_dir: Path, export: Path) -> Path:
    """Write the model in the Fast-dLLM-v2 checkpoint format (bf16 weights: it trained under bf16 autocast, and
    the shipped file must stay under 30 MB), with its tokenizer files beside it."""
    import shutil

    save_checkpoint(net.eval(), export, cfg_dict, dtype=torch.bfloat16)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, export / name)
    return export


def export_state(run_dir: Path, export: Path | None = None) -> Path:
    """Export the latest ``state.pt`` of a (possibly running) training run."""
    cfg = TrainConfig(**json.loads((run_dir / "train_config.json").read_text()))
    state = torch.load(run_dir / "state.pt", weights_only=False)
    vocab = state["model"]["embed"].shape[0]
    cfg_dict = model_config_dict(cfg, vocab)
    net = DLLM(config_from_dict(cfg_dict))
    net.load_state_dict(state["model"])
    return export_model(net, cfg_dict, Path(cfg.tokenizer_dir), export or run_dir / "model")


def warm_start(net: DLLM, cfg_dict: dict, checkpoint: str | Path) -> None:
    """Copy the weights of a Fast-dLLM-v2-format checkpoint into ``net`` (continued training, e.g. of the
    shipped model); its config must match the run's shape exactly."""
    from specfold.model.loading import load_checkpoint

    _, ckpt_cfg, ckpt_net = load_checkpoint(checkpoint, dtype="fp32")
    want = config_from_dict(cfg_dict)
    fields = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
              "head_dim", "qkv_bias", "block_size")
    diff = [f"{f}: checkpoint {getattr(ckpt_cfg, f)} vs run {getattr(want, f)}"
            for f in fields if getattr(ckpt_cfg, f) != getattr(want, f)]
    if diff:
        raise ValueError(f"cannot warm-start from {checkpoint}: shapes differ ({'; '.join(diff)})")
    net.load_state_dict(ckpt_net.state_dict())


@dataclass
class DataPosition:
    """Where the deterministic data stream stands: samples drawn from it, and the batches of the current pool that
    no step has used yet (a resume at any step continues with exactly the batches the run would have seen)."""

    consumed: int
    pending: list[list[tuple[list[int], int]]]


def _save_state(path: Path, net: DLLM, opt: torch.optim.Optimizer, step: int, seconds: float, rng: random.Random,
                data: DataPosition):
    """Write the resumable state atomically (a run killed mid-write keeps the previous checkpoint)."""
    tmp = path.with_suffix(".tmp")
    torch.save(
        {"model": net.state_dict(), "optim": opt.state_dict(), "step": step, "seconds": seconds,
         "rng": rng.getstate(), "torch_rng": torch.get_rng_state(), "consumed": data.consumed,
         "pending": data.pending},
        tmp,
    )
    tmp.replace(path)


def _cut_log(path: Path, step: int) -> None:
    """Keep ``loss.jsonl``'s records of steps ``1..step`` (what the checkpoint holds), in order: a resumed run logs
    the steps after it again, and a fresh run (``step`` 0) starts an empty log. A line torn by a kill is dropped; a
    step logged twice (by a run before this cut existed) keeps its later record, the one the checkpoint continues."""
    by_step: dict[int, str] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                by_step[int(json.loads(line)["step"])] = line
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                continue
    missing = [s for s in range(1, step + 1) if s not in by_step]
    if missing:
        raise ValueError(f"{path} lacks {len(missing)} of the checkpoint's {step} steps (first: {missing[0]}): "
                         "restore the log, or delete state.pt to start the run over")
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(by_step[s] + "\n" for s in range(1, step + 1)))
    tmp.replace(path)


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped :func:`train` between two steps, after it saved the resumable state."""

    def __init__(self, step: int, steps: int, state_path: Path, reason: str):
        super().__init__(f"{reason} after step {step} of {steps}: state saved to {state_path}")
        self.step, self.steps, self.state_path, self.reason = step, steps, state_path, reason


@contextmanager
def _deferred_interrupts(requests: list[str]) -> Iterator[None]:
    """While training (main thread only), SIGINT and SIGTERM append their name to ``requests`` instead of stopping
    the process mid-step; a second one stops it at once (KeyboardInterrupt, nothing saved)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if requests:
            raise KeyboardInterrupt
        requests.append(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def train(cfg: TrainConfig, progress: Callable[[int, float], None] | None = None) -> TrainResult:
    """Train (resuming from ``out_dir/state.pt`` if present), log losses to ``out_dir/loss.jsonl``, and export
    the final model in the Fast-dLLM-v2 format with its tokenizer to ``out_dir/model``.

    Ctrl-C, SIGTERM, or a ``KeyboardInterrupt`` raised by ``progress`` end the run after the current step: the state
    is saved and :class:`TrainingInterrupted` is raised (run again with the same config to resume)."""
    from transformers import AutoTokenizer

    out = Path(cfg.out_dir)
    tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizer_dir, local_files_only=True)
    mask_id = tokenizer.convert_tokens_to_ids("|<MASK>|")
    pad_id = tokenizer.pad_token_id
    cfg_dict = model_config_dict(cfg, len(tokenizer))
    net = DLLM(config_from_dict(cfg_dict))
    init_weights(net, cfg.seed)
    net.train()
    decay = [p for n, p in net.named_parameters() if p.dim() == 2]
    no_decay = [p for n, p in net.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.95),
    )
    state_path = out / "state.pt"
    start_step, elapsed = 0, 0.0
    position = DataPosition(0, [])
    rng = random.Random(cfg.seed)
    torch.manual_seed(cfg.seed)
    if state_path.is_file():
        state = torch.load(state_path, weights_only=False)
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        start_step, elapsed = state["step"], state["seconds"]
        rng.setstate(state["rng"])
        torch.set_rng_state(state["torch_rng"])
        # states written before the pool was saved were taken only at pool ends
        position = DataPosition(state.get("consumed", start_step * cfg.batch_size), state.get("pending", []))
    elif cfg.init_from is not None:
        warm_start(net, cfg_dict, cfg.init_from)
    out.mkdir(parents=True, exist_ok=True)  # only now: a bad warm start leaves nothing behind
    (out / "train_config.json").write_text(json.dumps(asdict(cfg), indent=2))
    log_path = out / "loss.jsonl"
    _cut_log(log_path, start_step)
    # The data stream is deterministic: skip what earlier runs consumed so a resume sees fresh samples.
    data = sequences(tokenizer, cfg.seed, cfg.max_len, cfg.mix)
    for _ in range(position.consumed):
        next(data)
    attn_cache: dict[Layout, tuple[torch.Tensor, torch.Tensor]] = {}
    pending = position.pending
    t0 = time.perf_counter()
    step = saved = start_step
    seconds = saved_seconds = elapsed
    requests: list[str] = []  # Ctrl-C / SIGTERM received, honoured after the step in flight

    def save() -> None:
        nonlocal saved, saved_seconds
        saved, saved_seconds = step, seconds
        _save_state(state_path, net, opt, step, seconds, rng, position)

    with _deferred_interrupts(requests), open(log_path, "a") as log:
        while step < cfg.steps:
            seconds = elapsed + time.perf_counter() - t0
            if progress_fraction(cfg, step, seconds) >= 1.0:  # steps or time, counted from step 0
                break
            if not pending:
                pool = sorted((next(data) for _ in range(BUCKET * cfg.batch_size)), key=lambda s: bucket_key(s, cfg))
                position.consumed += len(pool)
                pending = position.pending = [pool[i : i + cfg.batch_size] for i in range(0, len(pool),
                                                                                         cfg.batch_size)]
                rng.shuffle(pending)
            batch = make_batch(pending.pop(), cfg.block_size, mask_id, pad_id, rng, causal=cfg.causal_copy)
            if batch.layout not in attn_cache:
                attn_cache[batch.layout] = (batch.layout.positions(), batch.layout.mask(batch.tokens.device))
            lr = lr_at(cfg, step, seconds)
            for group in opt.param_groups:
                group["lr"] = lr
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
                logits = training_logits(net, batch.tokens, *attn_cache[batch.layout])
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), batch.targets.view(-1), ignore_index=-100)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            opt.step()
            step += 1
            seconds = elapsed + time.perf_counter() - t0
            log.write(json.dumps({"step": step, "loss": loss.item(), "lr": lr, "seconds": round(seconds, 2)}) + "\n")
            log.flush()
            if progress is not None:
                try:
                    progress(step, loss.item())
                except KeyboardInterrupt:
                    requests.append("KeyboardInterrupt")
            if (step == start_step + 1 or step - saved >= cfg.checkpoint_every or step == cfg.steps or requests
                    or seconds - saved_seconds >= 60 * cfg.checkpoint_minutes):
                save()
            if requests:
                raise TrainingInterrupted(step, cfg.steps, state_path, requests[0])
    seconds = elapsed + time.perf_counter() - t0
    if (step, seconds) != (saved, saved_seconds):  # the final state carries the time spent, for a later budget
        save()
    export = export_model(net, cfg_dict, Path(cfg.tokenizer_dir), out / "model")
    tail = [json.loads(line)["loss"] for line in log_path.read_text().splitlines()[-50:]]
    return TrainResult(
        steps=step,
        final_loss=sum(tail) / len(tail) if tail else math.nan,
        seconds=seconds,
        parameters=sum(p.numel() for p in net.parameters()),
        export_dir=export,
    )
