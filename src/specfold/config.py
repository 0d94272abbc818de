"""Configuration dataclasses: the model (read from a checkpoint's ``config.json``) and decoding.

The model families themselves (how a ``config.json`` maps onto :class:`ModelConfig`, masks, the unmasking rule,
the block protocol) live in :mod:`specfold.model.families`, one module each.
"""

from __future__ import annotations

import enum
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from specfold.validation import ValidationError


class ConfigError(ValueError):
    """A checkpoint's config.json cannot be used (missing field, unsupported model_type, bad value)."""


class CheckpointError(ValueError):
    """A checkpoint cannot be found, downloaded or loaded."""


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    kind: str = "default"  # "default" | "yarn"
    factor: float = 1.0
    original_max_position_embeddings: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True
    # Llama-4 style query scaling: q *= 1 + beta * log(1 + floor(pos / llama4_max_position)).
    llama4_beta: float | None = None
    llama4_max_position: int | None = None


@dataclass(frozen=True)
class ModelConfig:
    """A transformer's shape and special ids, as a family module maps them from ``config.json``
    (:func:`specfold.model.families.config_from_dict`)."""

    family: str  # a name in specfold.model.families.FAMILIES
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    qkv_bias: bool
    tie_word_embeddings: bool
    rope: RopeConfig
    qk_norm: bool = False  # per-head RMSNorm on q and k before RoPE (Qwen3 / SDAR)
    block_size: int = 32  # bd_size
    mask_token_id: int | None = None
    eos_token_id: int | None = None  # the first of eos_token_ids
    eos_token_ids: tuple[int, ...] = ()  # config.json's eos_token_id (an int or a list)
    shifted_logits: bool = False  # position i is read from row i-1 (Fast-dLLM-v2)
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


# SDAR's remasking strategies (its generate.py names) and the UnmaskRule kind each one selects.
QUOTA_STRATEGIES: dict[str, str] = {
    "low_confidence_dynamic": "quota_dynamic",
    "low_confidence_static": "quota_static",
}


# Fast-dLLM v1's caches for the fully bidirectional families (DecodeConfig.cache).
CACHE_MODES = ("none", "prefix", "dual")


@dataclass(frozen=True)
class DecodeConfig:
    """Vanilla block decoding parameters (SPEC §2)."""

    max_new_tokens: int = 256
    threshold: float = 0.9
    block_size: int = 32
    small_block_size: int | None = 8  # None: every mask of the block is eligible (NLD)
    prefill_chunk: int | None = None  # prompt rows per prefill forward (None: the model's default)
    # Quota rules only (SDAR): denoising passes per block (None: the block size) and the strategy
    # ("low_confidence_dynamic" | "low_confidence_static"; None: the family's default). See UnmaskRule.
    steps: int | None = None
    strategy: str | None = None
    # Fully bidirectional families only (LLaDA, Dream): Fast-dLLM v1's cache — "none" (every pass a forward of the
    # whole sequence), "prefix" or "dual"; None: the family's default (see specfold.decoding.sequence). There
    # ``steps`` counts the passes of the whole generation, as their references do (``steps // (max_new_tokens //
    # block_size)`` per block).
    cache: str | None = None

    def validate(self) -> None:
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")
        if self.max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be positive, got {self.max_new_tokens}")
        if self.block_size <= 0:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        if self.prefill_chunk is not None and self.prefill_chunk <= 0:
            raise ValueError(f"prefill_chunk must be positive, got {self.prefill_chunk}")
        if self.steps is not None and self.steps <= 0:
            raise ValueError(f"steps must be positive, got {self.steps}")
        if self.cache is not None and self.cache not in CACHE_MODES:
            raise ValueError(f"unknown cache {self.cache!r}; choose one of {', '.join(CACHE_MODES)}")
        if self.strategy is not None and self.strategy not in QUOTA_STRATEGIES:
            raise ValueError(f"unknown strategy {self.strategy!r}; choose one of {', '.join(QUOTA_STRATEGIES)}")
        if self.small_block_size is not None:
            if self.small_block_size <= 0:
                raise ValueError(f"small_block_size must be positive, got {self.small_block_size}")
            if self.block_size % self.small_block_size:
                raise ValueError(
                    f"block_size {self.block_size} is not a multiple of small_block_size {self.small_block_size}"
                )


# ---------------------------------------------------------------------------------------------------------------
# Decoding methods: which one runs and with which options (the CLI flags, the API keywords, the eval records)
# ---------------------------------------------------------------------------------------------------------------


class MethodName(enum.StrEnum):
    VANILLA = "vanilla"  # the reference trajectory (SPEC §2)
    SPIFFY = "spiffy"  # drafts from a calibrated graph, dense verification (SPEC §3)
    SPECFOLD = "specfold"  # the same drafts, folded verification (SPEC §4)


class Backend(enum.StrEnum):
    TORCH = "torch"
    TRITON = "triton"  # specfold.engine.triton_backend, imported only when chosen


class FfnReuse(enum.StrEnum):
    RESIDUAL = "residual"  # the FFN gated on its own input: exact at δ = 0
    PAPER = "paper"  # reused on the layer's folded set, as the paper does (not exact at δ = 0)


class AttentionMode(enum.StrEnum):
    AUTO = "auto"  # per layer, the cheaper of the two by the engine's cost rule
    CORRECT = "correct"  # Eq. 8 from the source branch's softmax state
    DIRECT = "direct"  # every folded row over its branch's own K/V (same result)


DEFAULT_DELTA = 0.1

# Which methods each option applies to; an option given for a method it does not apply to is refused.
METHOD_OPTIONS: dict[str, tuple[MethodName, ...]] = {
    "graph": (MethodName.SPIFFY, MethodName.SPECFOLD),
    "budget": (MethodName.SPIFFY, MethodName.SPECFOLD),
    "depth": (MethodName.SPIFFY, MethodName.SPECFOLD),
    "lookahead": (MethodName.SPIFFY, MethodName.SPECFOLD),
    "delta": (MethodName.SPECFOLD,),
    "backend": (MethodName.SPECFOLD,),
    "ffn": (MethodName.SPECFOLD,),
    "attention": (MethodName.SPECFOLD,),
    "compile": (MethodName.VANILLA, MethodName.SPIFFY, MethodName.SPECFOLD),
}
# NOTE: off unless asked for: on this project's CPUs torch.compile of the embedded model's forwards costs tens of
# seconds per process (tracing; inductor's disk cache only saves the C++ builds), more than a demo's whole decode
# (docs/results.md, "Compiled forwards"). The long-running commands (eval, sweep, bench batch) turn it on when the
# run's planned token budget is large enough for the faster passes to repay the compile (:func:`compile_pays`).
DEFAULT_COMPILE = False
# Planned tokens (requests x max_new_tokens, every method and repeat) from which compiling pays. Measured on the
# AVX2 EPYC (fp32, one thread, embedded model, docs/results.md): vanilla / spiffy / specfold compiled 1.35 / 1.28 /
# 1.23x eager side by side; compiling their 4-5 graphs took 40 s (2 graphs, quiet machine) to 113-260 s (loaded):
# ~110 s against a ~22 % gain at ~60 tokens/s eager breaks even after ~500 s, ~30 000 generated tokens, and the
# synthetic tasks stop after about a third of a 64-token budget: 100 000 planned.
COMPILE_MIN_TOKENS = 100_000


def compile_pays(planned_tokens: int) -> bool:
    """Whether a run that plans ``planned_tokens`` (requests x ``max_new_tokens``, summed over its methods and
    repeats) is long enough for compiled forwards to repay their compile (:data:`COMPILE_MIN_TOKENS`).

    >>> compile_pays(48 * 64 * 3 * 13), compile_pays(6 * 64)
    (True, False)
    """
    return planned_tokens >= COMPILE_MIN_TOKENS


def check_delta(delta: Any, name: str = "delta") -> float:
    """δ as a float in [0, 1] (NaN, infinities and booleans refused).

    >>> check_delta(1.5)
    Traceback (most recent call last):
    specfold.validation.ValidationError: delta must be a finite number in [0, 1], got 1.5
    """
    try:
        value = float(delta)
        if isinstance(delta, bool):
            raise TypeError
    except (TypeError, ValueError):
        raise ValidationError(f"{name} must be a finite number in [0, 1], got {delta!r}") from None
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise ValidationError(f"{name} must be a finite number in [0, 1], got {value}")
    return value


def check_method_options(
    methods: str | Sequence[str],
    given: Mapping[str, Any],
    flags: Mapping[str, str] | None = None,
    selector: str = "",
) -> None:
    """Refuse an option that none of ``methods`` uses. ``given`` holds the options the caller set explicitly
    (None = not given, so defaults never trigger this); ``flags`` maps option names to the names the caller knows
    them by (``{"ffn": "--ffn-reuse"}``), ``selector`` prefixes the method list in the message."""
    names = [methods] if isinstance(methods, str) else list(methods)
    for option, value in given.items():
        if value is None:
            continue
        users = METHOD_OPTIONS[option]
        if not any(m in users for m in names):
            shown = (flags or {}).get(option, option)
            raise ValidationError(f"{shown} applies to {selector}{' or '.join(users)}, not {','.join(names)}")


def _choice(kind: type[enum.StrEnum], value: Any, name: str) -> Any:
    """``value`` as a member of ``kind`` (strings coerced); one line naming the choices otherwise."""
    try:
        return kind(value)
    except ValueError:
        raise ValidationError(f"unknown {name} {value!r}; choose one of {', '.join(kind)}") from None


@dataclass(frozen=True)
class FoldConfig:
    """Folded verification settings (SPEC §4) with every default filled in: δ of Eq. 5 (finite, in [0, 1]), the
    engine backend, the FFN reuse and the folded-row attention."""

    delta: float = DEFAULT_DELTA
    backend: Backend = Backend.TORCH
    ffn: FfnReuse = FfnReuse.RESIDUAL
    attention: AttentionMode = AttentionMode.AUTO

    def __post_init__(self) -> None:
        object.__setattr__(self, "delta", check_delta(self.delta))
        object.__setattr__(self, "backend", _choice(Backend, self.backend, "backend"))
        object.__setattr__(self, "ffn", _choice(FfnReuse, self.ffn, "ffn"))
        object.__setattr__(self, "attention", _choice(AttentionMode, self.attention, "attention"))


class GraphLike(Protocol):
    """What this module needs of a :class:`~specfold.decoding.draft_graph.DraftGraph` (config imports nothing
    above it)."""

    nodes: tuple
    budget: int | None

    def strings(self) -> list[str]: ...


# FoldConfig's fields in the order records list them, and the values a label leaves out.
_FOLD_DEFAULTS = {"backend": Backend.TORCH, "ffn": FfnReuse.RESIDUAL, "attention": AttentionMode.AUTO}


@dataclass(frozen=True)
class MethodConfig:
    """A decoding method and its options, named as the CLI flags and the API keywords.

    ``method``: vanilla, spiffy or specfold. Drafting methods (spiffy, specfold): ``graph`` (a graph file, or a
    :class:`~specfold.decoding.draft_graph.DraftGraph`; None: the one shipped beside the model), ``budget`` (B),
    ``depth`` (a depth cap), ``lookahead`` (boundary drafts: None = wherever the model allows them, True requires
    them, False turns them off). Specfold only: ``delta``, ``backend``, ``ffn``, ``attention`` (:class:`FoldConfig`,
    whose defaults :attr:`fold` fills in). Every method: ``compile`` (the dense forwards under ``torch.compile``,
    :mod:`specfold.engine.compiled`; None = :data:`DEFAULT_COMPILE`; not part of :attr:`params`: the tokens are the
    eager ones). None means "not given": an option given for a method it does not apply
    to is refused, as is any value outside what it may be (:class:`~specfold.validation.ValidationError`).

        >>> MethodConfig(method="specfold", delta=0.2).label
        'specfold[delta=0.2]'
    """

    method: MethodName = MethodName.VANILLA
    graph: str | GraphLike | None = None
    budget: int | None = None
    depth: int | None = None
    delta: float | None = None
    backend: Backend | None = None
    ffn: FfnReuse | None = None
    attention: AttentionMode | None = None
    lookahead: bool | None = None
    compile: bool | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "method", _choice(MethodName, self.method, "method"))
        check_method_options(self.method, self.given())
        if isinstance(self.graph, str | os.PathLike):
            object.__setattr__(self, "graph", os.fspath(self.graph))
        elif self.graph is not None and not all(hasattr(self.graph, a) for a in ("nodes", "budget", "strings")):
            raise ValidationError(f"graph must be a file path or a DraftGraph, got {type(self.graph).__name__}")
        for name, shown in (("budget", "budget"), ("depth", "depth cap")):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValidationError(f"{shown} must be positive, got {value!r}")
        for name in ("lookahead", "compile"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), bool):
                raise ValidationError(f"{name} must be True, False or None, got {getattr(self, name)!r}")
        if self.delta is not None:
            object.__setattr__(self, "delta", check_delta(self.delta))
        for name, kind in (("backend", Backend), ("ffn", FfnReuse), ("attention", AttentionMode)):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, _choice(kind, getattr(self, name), name))

    def given(self) -> dict[str, Any]:
        """The options other than ``method`` as given (None = not given), by name."""
        return {name: getattr(self, name) for name in METHOD_OPTIONS}

    @property
    def compiled(self) -> bool:
        """Whether the dense forwards run compiled (``compile``, default :data:`DEFAULT_COMPILE`)."""
        return DEFAULT_COMPILE if self.compile is None else self.compile

    @property
    def drafts(self) -> bool:
        """Whether the method drafts (spiffy, specfold)."""
        return self.method is not MethodName.VANILLA

    @property
    def fold(self) -> FoldConfig:
        """The folded verification settings, defaults filled in (specfold's; the defaults for other methods)."""
        given = {k: v for k, v in (("delta", self.delta), ("backend", self.backend), ("ffn", self.ffn),
                                   ("attention", self.attention)) if v is not None}
        return FoldConfig(**given)

    def for_method(self, method: MethodName | str) -> MethodConfig:
        """This config's options that apply to ``method``, as a config of that method (a server's options for a
        request asking for another method)."""
        name = _choice(MethodName, method, "method")
        return MethodConfig(name, **{k: v for k, v in self.given().items() if name in METHOD_OPTIONS[k]})

    @property
    def params(self) -> dict[str, Any]:
        """The method's parameters as eval records store them (part of a record's resume key): nothing for vanilla;
        budget, depth, graph (and lookahead when given) for the drafting methods; specfold adds the fold settings
        with their defaults filled in."""
        if self.method is MethodName.VANILLA:
            return {}
        out: dict[str, Any] = {"budget": self.budget, "depth": self.depth, "graph": self._graph_name()}
        if self.lookahead is not None:  # only when set: the default's records keep their keys
            out["lookahead"] = self.lookahead
        if self.method is MethodName.SPECFOLD:
            fold = self.fold
            out.update(delta=fold.delta, backend=fold.backend.value, ffn=fold.ffn.value,
                       attention=fold.attention.value)
        return out

    @property
    def label(self) -> str:
        """The method name plus the parameters that distinguish it, e.g. ``specfold[budget=3,delta=0.1]`` (graph,
        and fold settings at their defaults, left out)."""
        params = self.params
        shown = {k: v for k, v in params.items() if v is not None and k not in ("graph", *_FOLD_DEFAULTS)}
        shown.update({k: params[k] for k, default in _FOLD_DEFAULTS.items() if k in params and params[k] != default})
        return self.method.value + ("[" + ",".join(f"{k}={v}" for k, v in shown.items()) + "]" if shown else "")

    def _graph_name(self) -> str | None:
        if self.graph is None or isinstance(self.graph, str):
            return self.graph
        return "DraftGraph[" + ";".join(self.graph.strings()[1:]) + "]"  # a graph object: its nodes
