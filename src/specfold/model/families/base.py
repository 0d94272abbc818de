"""What a model family is: one :class:`FamilySpec` per module in this package, registered by ``model_type``.

Dims: ``R`` requests, ``N`` block length, ``V`` vocabulary, ``T`` prompt length.

A family says everything that differs between DLLMs and nothing the decoding core decides:

* **config mapping** — :func:`model_config` reads the fields every HF transformer config carries; the family adds
  its defaults (q/k/v bias, block-size key, nesting) and whether its logits are shifted;
* **checkpoint keys** — the prefix of the backbone's tensors, the names of the LM head and the per-layer key templates
  (as in gpt-fast; :data:`QWEN_LAYER_KEYS` by default, LLaDA's OLMo-style names in its own module);
* **attention across the sequence** — :attr:`FamilySpec.attention`: ``block_causal`` (a block sees the cached context
  before it and itself: Fast-dLLM-v2, NLD, SDAR) or ``bidirectional`` (every row sees every row: LLaDA, Dream);
* **attention masks** — inside the prompt at prefill, inside a finished block when it enters the cache;
* **the unmasking rule** — :class:`UnmaskRule`: threshold or per-step quota (SDAR), the comparison with the
  threshold, the dtype confidence is computed in, and the per-block cap on rule applications (so that no decode can
  run forever);
* **the block protocol** — :meth:`FamilySpec.start` (prefill + the first block) and :func:`commit_blocks` (a
  finished block enters the cache; its last row seeds the next block), both driven by the family's masks;
* **stop ids** — the tokenizer's token names tried after the checkpoint's configured ``eos_token_id``, or every id of
  ``generation_config.json`` (``generation_config_stops``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from specfold.config import QUOTA_STRATEGIES, ConfigError, ModelConfig, RopeConfig
from specfold.model.cache import BatchCache, PrefixCache
from specfold.model.transformer import DLLM

RULE_KINDS = ("threshold", "quota_dynamic", "quota_static")
ATTENTION_KINDS = ("block_causal", "bidirectional")

# Our fused parameter -> the HF tensor names (under the family's prefix and ``layers.N.``) concatenated into it, in
# order: the Qwen2 / Llama / Ministral3 / Qwen3 names.
QWEN_LAYER_KEYS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("input_norm", ("input_layernorm.weight",)),
    ("wqkv", ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight")),
    ("bqkv", ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias")),
    ("wo", ("self_attn.o_proj.weight",)),
    ("q_norm", ("self_attn.q_norm.weight",)),  # qk-norm models only (Qwen3 / SDAR)
    ("k_norm", ("self_attn.k_norm.weight",)),
    ("post_norm", ("post_attention_layernorm.weight",)),
    ("w_gate_up", ("mlp.gate_proj.weight", "mlp.up_proj.weight")),
    ("w_down", ("mlp.down_proj.weight",)),
)


@dataclass(frozen=True)
class UnmaskRule:
    """How a family's reference decoder turns one pass's logits into the next state (SPEC §2).

    ``kind``: ``"threshold"`` (Fast-dLLM-v2, NLD): every eligible position above the threshold plus the single most
    confident one. ``"quota_dynamic"`` / ``"quota_static"`` (SDAR's ``low_confidence_dynamic`` / ``_static``): a
    block takes ``steps`` passes (default: the block size ``B``), pass ``s`` (from 0) has the quota
    ``B // steps + (s < B % steps)``; static unmasks the ``quota`` most confident masked positions, dynamic unmasks
    every masked position strictly above the threshold when there are at least ``quota`` of them, else the top
    ``quota``.
    ``inclusive``: keep a position whose confidence is ``>= threshold`` (Nemotron-Labs-Diffusion) rather than
    ``> threshold`` (Fast-dLLM-v2, SDAR).
    ``confidence_dtype``: ``"model"`` — the softmax runs in the logits' dtype, as the references do (in bf16 the
    threshold 0.9 itself compares as 0.8984375); ``"fp64"`` for references that upcast.
    The argmax may be the mask token itself (no reference excludes it): the position then stays masked. A block
    takes at most :meth:`max_steps` rule applications — ``steps_per_block_cap × N`` for a threshold rule (the NLD
    reference's ``block_length`` cap; the Fast-dLLM-v2 reference has no cap and never returns there), ``steps``
    for a quota rule (SDAR's reference raises past its schedule) — and a block still holding masks then ends as it is.
    """

    kind: str = "threshold"
    inclusive: bool = False
    confidence_dtype: str = "model"
    steps_per_block_cap: int = 1
    steps: int | None = None  # quota rules: passes per block (None: the block size)

    def __post_init__(self) -> None:
        if self.kind not in RULE_KINDS:
            raise ValueError(f"unknown rule kind {self.kind!r}; choose one of {', '.join(RULE_KINDS)}")
        if self.confidence_dtype not in ("model", "fp64"):
            raise ValueError(f"confidence_dtype must be 'model' or 'fp64', got {self.confidence_dtype!r}")
        if self.steps_per_block_cap < 1:
            raise ValueError(f"steps_per_block_cap must be positive, got {self.steps_per_block_cap}")
        if self.steps is not None and (self.kind == "threshold" or self.steps < 1):
            raise ValueError(f"steps {self.steps} needs a quota rule and a positive value (rule {self.kind!r})")

    @property
    def has_quota(self) -> bool:
        return self.kind != "threshold"

    def max_steps(self, block_size: int) -> int:
        if self.has_quota:
            return self.steps or block_size
        return self.steps_per_block_cap * block_size

    def quota(self, block_size: int, step: int) -> int:
        """Positions pass ``step`` (0-based, within the block) unmasks under a quota rule (SDAR's
        ``get_num_transfer_tokens``)."""
        steps = self.steps or block_size
        return block_size // steps + int(step < block_size % steps)

    def with_options(self, strategy: str | None, steps: int | None) -> UnmaskRule:
        """This rule with a decode's ``--strategy`` / ``--steps`` (:class:`~specfold.config.DecodeConfig`); refused
        for a rule without a quota."""
        if strategy is None and steps is None:
            return self
        if not self.has_quota:
            given = " and ".join(f for f, v in (("--strategy", strategy), ("--steps", steps)) if v is not None)
            raise ConfigError(f"{given} applies to quota rules (SDAR), not this family's threshold rule")
        kind = self.kind if strategy is None else QUOTA_STRATEGIES[strategy]
        return replace(self, kind=kind, steps=self.steps if steps is None else steps)


@dataclass(frozen=True)
class FamilySpec:
    """One DLLM family. ``start`` is its prefill + first block (see :data:`StartFn`)."""

    name: str
    model_types: tuple[str, ...]
    weight_prefix: str  # "model." / "encoder.": the backbone's tensors
    head_keys: tuple[str, ...]  # LM head tensor names, preferred first
    shifted_logits: bool
    qkv_bias: bool  # default when config.json has no attention_bias
    prefill_mask: str  # attention inside the prompt at prefill
    finish_mask: str  # attention inside a finished block when it is written to the cache
    default_small_block_size: int | None
    rule: UnmaskRule
    start: StartFn
    stop_token_names: tuple[str, ...] = ()
    config_nested: tuple[str, ...] = ()  # keys under which config.json may nest the backbone's fields
    block_size_keys: tuple[str, ...] = ("bd_size", "block_size")  # where config.json writes the block size
    example_config: Callable[[dict[str, Any]], dict[str, Any]] = field(default=dict, repr=False)
    qk_norm: bool = False  # per-head q/k RMSNorm before RoPE (Qwen3 layers)
    generation_config_stops: bool = False  # stop on every eos id of generation_config.json (SDAR's reference)
    seeded_blocks: bool = True  # a block after the first starts [seed, M, …] (the cache write's last row), else all M
    # "block_causal": a block attends to the cached context before it and to itself (the block-cache protocol of
    # decoding/core.py); "bidirectional": every row of the whole sequence sees every row, no mask at all (LLaDA,
    # Dream: decoded by full-sequence forwards, or Fast-dLLM v1's prefix / dual caches built from one).
    attention: str = "block_causal"
    # config.json -> the HF transformer fields model_config reads (hidden_size, num_hidden_layers, …): for
    # checkpoints with their own names (LLaDA's d_model, n_layers, …). None: config.json already uses them.
    standard_config: Callable[[dict[str, Any]], dict[str, Any]] | None = field(default=None, repr=False)
    embed_key: str = "embed_tokens.weight"  # under weight_prefix
    norm_key: str = "norm.weight"  # the final norm, under weight_prefix
    layer_prefix: str = "layers."  # layer i's tensors are under weight_prefix + layer_prefix + f"{i}."
    layer_keys: tuple[tuple[str, tuple[str, ...]], ...] = QWEN_LAYER_KEYS
    # tokenizer tokens that stop a decode beside the checkpoint's configured eos id (LLaDA's <|eot_id|>, Dream's
    # <|im_end|>): every one the tokenizer knows joins the stop ids (loading.special_ids).
    extra_stop_token_names: tuple[str, ...] = ()
    # a stock transformers tokenizer class for checkpoints whose own is remote code with no tokenizer.json (Dream)
    tokenizer_class: str | None = None

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(f"unknown attention {self.attention!r}; choose one of {', '.join(ATTENTION_KINDS)}")

    @property
    def bidirectional(self) -> bool:
        """Whether every row of the sequence attends to every row (no block-cache protocol of its own)."""
        return self.attention == "bidirectional"

    @property
    def boundary_drafts(self) -> bool:
        """Whether the cache-writing forward can also run the next block's first state (shifted logits and a
        bidirectional block commit: the finished block's rows are then unaffected by the rows after it)."""
        return self.shifted_logits and self.finish_mask == "bidirectional" and not self.bidirectional


# (net, prompt [T], cache view, block length, mask id, prefill chunk) -> (first block [N], gen_start, forwards)
StartFn = Callable[[DLLM, torch.Tensor, PrefixCache, int, int, int | None], tuple[torch.Tensor, int, int]]


def no_block_protocol(name: str) -> Callable[..., Any]:
    """``FamilySpec.start`` of a fully bidirectional family (LLaDA, Dream): there is no prefill + blocks protocol to
    start; decoding runs whole-sequence windows (:mod:`specfold.decoding.sequence`)."""

    def start(net, prompt, cache, n, mask_id, chunk=None):
        raise ConfigError(
            f"{name} attends bidirectionally over the whole sequence: it has no block-cache protocol (prefill + "
            "blocks); decode it with full-sequence forwards or Fast-dLLM v1's prefix / dual cache"
        )

    return start


def seed_block(seed: torch.Tensor, n: int, mask_id: int) -> torch.Tensor:
    """``[seed, M, …, M]`` ``[N]`` (``seed`` a ``[]`` long)."""
    block = torch.full((n,), mask_id, dtype=torch.long, device=seed.device)
    block[0] = seed
    return block


@dataclass
class Commit:
    """What writing finished blocks to the cache returned: each request's next seed ``[R]`` and, where a boundary
    draft's guessed seed was right, that request's next-block first-pass position logits (else None)."""

    seeds: torch.Tensor  # [R] long
    first_logits: list[torch.Tensor | None]  # [R] of [N, V] or None


def commit_blocks(
    net: DLLM,
    family: FamilySpec,
    cache: BatchCache,
    slots: torch.Tensor,  # [R] long (host)
    lengths: torch.Tensor,  # [R] long (host): cached lengths before the blocks
    blocks: torch.Tensor,  # [R, N] finished blocks
    mask_id: int,
    guesses: torch.Tensor | None = None,  # [R] long: guessed next seeds (boundary drafts), or None
) -> Commit:
    """Write every request's finished block to its cache slot in one forward (the family's ``finish_mask``) and
    advance the slot lengths; the block's last row seeds the next block.

    With ``guesses`` (families with :attr:`FamilySpec.boundary_drafts`) the forward also runs each next block's first
    state ``[ŝ, M, …]`` block-causally after the finished block (only the finished block's K/V kept): where the
    real seed equals ``ŝ``, those rows are exactly the next block's first denoising pass."""
    r, n = blocks.shape
    if guesses is None:
        last = net.forward_ragged(
            blocks, cache, slots, lengths, mask=family.finish_mask, write_cache=True, logit_rows=slice(-1, None)
        )  # [R, 1, V]
        seeds, first = last[:, -1].argmax(dim=-1), [None] * r
    else:
        nxt = torch.full((r, n), mask_id, dtype=torch.long, device=blocks.device)
        nxt[:, 0] = guesses
        both = torch.cat([blocks, nxt], dim=1)  # [R, 2N]
        raw = net.forward_ragged(
            both, cache, slots, lengths, mask="block_causal", write_cache=True, logit_rows=slice(n - 1, None)
        )  # [R, N+1, V]: row N-1 seeds the next block, rows N.. are its first pass (their K/V are not kept)
        seeds = raw[:, 0].argmax(dim=-1)
        hits = (seeds == guesses).tolist()
        first = [net.position_logits(raw[i : i + 1, 1:])[0] if hit else None for i, hit in enumerate(hits)]
    for s in slots.tolist():
        cache.slot(s).length += n
    return Commit(seeds, first)


def model_config(raw: dict[str, Any], family: FamilySpec) -> ModelConfig:
    """The transformer fields of an HF ``config.json`` (``raw``), with the family's defaults: its
    ``config_nested`` keys may hold the backbone's fields (merged over the top level), the block size is read
    from its ``block_size_keys`` (first present wins; 32 when none is). A family with ``standard_config`` first maps
    its own field names onto these."""
    original = raw
    if family.standard_config is not None:
        raw = family.standard_config(raw)
    body = dict(raw)
    for key in family.config_nested:
        if isinstance(raw.get(key), dict):
            body = {**raw[key], **{k: v for k, v in raw.items() if k not in raw[key]}}
            break

    def need(key: str) -> Any:
        if key not in body or body[key] is None:
            raise ConfigError(f"config.json lacks required field {key!r}")
        return body[key]

    hidden = int(need("hidden_size"))
    heads = int(need("num_attention_heads"))
    kv_heads = int(body.get("num_key_value_heads") or heads)
    head_dim = int(body.get("head_dim") or hidden // heads)
    if heads % kv_heads:
        raise ConfigError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    max_pos = int(body.get("max_position_embeddings") or 32768)
    eos = body.get("eos_token_id")
    eos_ids = tuple(int(e) for e in eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
    block = next((body[k] for k in family.block_size_keys if body.get(k)), None)
    return ModelConfig(
        family=family.name,
        model_type=str(raw.get("model_type")),
        vocab_size=int(need("vocab_size")),
        hidden_size=hidden,
        intermediate_size=int(need("intermediate_size")),
        num_layers=int(need("num_hidden_layers")),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=float(body.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=max_pos,
        qkv_bias=bool(body.get("attention_bias", family.qkv_bias)),
        qk_norm=family.qk_norm,
        tie_word_embeddings=bool(body.get("tie_word_embeddings", False)),
        rope=rope_config(body, max_pos),
        block_size=int(block or 32),
        mask_token_id=body.get("mask_token_id"),
        eos_token_id=eos_ids[0] if eos_ids else None,
        eos_token_ids=eos_ids,
        shifted_logits=family.shifted_logits,
        raw=dict(original),
    )


def rope_config(body: dict[str, Any], max_pos: int) -> RopeConfig:
    """RoPE from ``rope_parameters`` (transformers >= 5) or ``rope_theta`` + ``rope_scaling`` (older checkpoints)."""
    params = dict(body.get("rope_parameters") or {})
    scaling = body.get("rope_scaling") or {}
    params = {**scaling, **params}
    theta = float(params.get("rope_theta", body.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default")) or "default"
    if kind not in ("default", "yarn"):
        raise ConfigError(f"unsupported RoPE type {kind!r}; supported: default, yarn")
    orig = params.get("original_max_position_embeddings")
    factor = params.get("factor")
    if kind == "yarn" and factor is None:
        if orig is None:
            raise ConfigError("YaRN RoPE needs 'factor' or 'original_max_position_embeddings'")
        factor = max_pos / orig
    return RopeConfig(
        theta=theta,
        kind=kind,
        factor=float(factor or 1.0),
        original_max_position_embeddings=int(orig) if orig is not None else None,
        beta_fast=float(params.get("beta_fast") or 32.0),
        beta_slow=float(params.get("beta_slow") or 1.0),
        mscale=params.get("mscale"),
        mscale_all_dim=params.get("mscale_all_dim"),
        attention_factor=params.get("attention_factor"),
        truncate=bool(params.get("truncate", True)),
        llama4_beta=params.get("llama_4_scaling_beta"),
        llama4_max_position=int(orig) if (params.get("llama_4_scaling_beta") is not None and orig) else None,
    )
