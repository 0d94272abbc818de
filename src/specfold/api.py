"""The public entry points: :func:`load_model`, :func:`generate`, and the pieces the CLI and evaluation share
(prompt encoding, decoding configs, method set-up, draft-graph resolution, calibration counting)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specfold.config import METHOD_OPTIONS, DecodeConfig, MethodConfig, MethodName
from specfold.decoding.acceptance import BlockTrace, CalibrationPaths
from specfold.decoding.calibration import count_formulas, counts_from_json, graph_from_counts, graph_from_paths
from specfold.decoding.core import Drafter, GenerationResult, lookahead_supported
from specfold.decoding.decoder import decode, decode_batch
from specfold.decoding.draft_graph import DraftGraph, Formula
from specfold.decoding.sequence import sequence_protocol
from specfold.decoding.speculative import GraphDrafter, TraceRecorder
from specfold.engine.base import Verifier
from specfold.engine.dense import DenseVerifier
from specfold.model.families import family_of
from specfold.model.loading import LoadedModel, load_model
from specfold.validation import CHAT_ROLES, ValidationError, check_messages, check_text, check_token_ids

__all__ = [
    "CHAT_ROLES",
    "METHODS",
    "GenerationResult",
    "Method",
    "decode_config_for",
    "encode_messages",
    "encode_prompt",
    "generate",
    "load_model",
    "prepare_method",
    "record_counts",
    "record_traces",
    "resolve_graph",
    "tokenize",
    "truncate_at_stop",
]

METHODS = tuple(m.value for m in MethodName)
DEFAULT_BUDGET = 7
GRAPH_FILE = "draft_graph.json"  # a calibrated graph shipped beside a checkpoint (B = 7)
COUNTS_FILE = "draft_graph.counts.json"  # its counts, as `specfold calibrate` writes them
PATHS_FILE = "draft_graph.paths.json"  # its calibration paths: any B / depth cap / objective is re-selected from them


def encode_prompt(model: LoadedModel, prompt: str, chat: bool = True) -> list[int]:
    """Token ids of a text prompt, through the model's chat template when it has one and ``chat`` is set. The
    text must be Unicode scalar values with more than whitespace (:func:`~specfold.validation.check_text`)."""
    check_text(prompt)
    tok = model.tokenizer
    if tok is None:
        raise ValueError(f"{model.path} has no tokenizer; pass token ids instead of text")
    if chat and getattr(tok, "chat_template", None):
        text = tok.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        return tokenize(tok, text)
    return tokenize(tok, prompt)


def tokenize(tok: Any, text: str) -> list[int]:
    """``text``'s token ids, no special tokens added. NOTE: ``verbose=False`` silences the tokenizer's "indexing
    errors" warning, which compares with its ``model_max_length``; the model's position limit is what counts, and
    :func:`~specfold.decoding.core.check_prompt` checks it."""
    return list(tok.encode(text, add_special_tokens=False, verbose=False))




def encode_messages(model: LoadedModel, messages: Sequence[Mapping[str, str]]) -> list[int]:
    """Token ids of a conversation (``[{"role": ..., "content": ...}, ...]``, roles system / user / assistant)
    through the model's chat template, ending with the prompt for the assistant's next turn."""
    check_messages(messages)
    tok = model.tokenizer
    if tok is None or not getattr(tok, "chat_template", None):
        raise ValueError(f"{model.path} has no chat template; a message list needs one")
    chat = [{"role": m["role"], "content": m["content"]} for m in messages]
    text = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    return tokenize(tok, text)


def truncate_at_stop(text: str, stop: Sequence[str]) -> tuple[str, str | None]:
    """``text`` cut just before the earliest occurrence of any stop string, and the stop string found there (the
    earlier-listed one on a tie; ``None`` and the whole text when none occurs)."""
    if any(not s for s in stop):
        raise ValueError("empty stop string")
    hits = [(text.find(s), i) for i, s in enumerate(stop) if s in text]
    if not hits:
        return text, None
    at, i = min(hits)
    return text[:at], stop[i]


def decode_config_for(
    model: LoadedModel,
    max_new_tokens: int = 256,
    threshold: float = 0.9,
    block_size: int | None = None,
    small_block_size: int | None | str = "auto",
    prefill_chunk: int | None = None,
    steps: int | None = None,
    strategy: str | None = None,
    cache: str | None = None,
) -> DecodeConfig:
    """Decoding parameters with the family's defaults (block = the checkpoint's ``bd_size``; small blocks of 8
    for Fast-dLLM-v2, none for Nemotron-Labs-Diffusion; prefill chunks of ``DEFAULT_PREFILL_CHUNK`` rows).
    ``steps`` / ``strategy``: a quota rule's passes per block and strategy (SDAR), refused for other families
    except the fully bidirectional ones (LLaDA, Dream), where ``steps`` counts the passes of the whole generation
    and ``cache`` picks Fast-dLLM v1's cache (:mod:`specfold.decoding.sequence`)."""
    family = family_of(model.config)
    sbs = family.default_small_block_size if small_block_size == "auto" else small_block_size
    if small_block_size == "auto" and sbs is not None and block_size is not None and sbs > block_size:
        sbs = block_size  # the family's default window, at most the (smaller) block asked for
    cfg = DecodeConfig(
        max_new_tokens=max_new_tokens,
        threshold=threshold,
        block_size=block_size or model.config.block_size,
        small_block_size=sbs,
        prefill_chunk=prefill_chunk,
        steps=steps,
        strategy=strategy,
        cache=cache,
    )
    if family.bidirectional:
        sequence_protocol(family, cfg)  # ValueError for what the references do not define
    elif cache is not None:
        raise ValidationError(f"--cache applies to the fully bidirectional families (LLaDA, Dream), not {family.name}")
    else:
        family.rule.with_options(strategy, steps)  # ConfigError (a ValueError) without a quota rule
    n, model_n = cfg.block_size, model.config.block_size
    if family.prefill_mask == "block_causal" and model_n % n:
        # the prompt was trained block-causally in blocks of model_n: a block must tile them
        raise ValidationError(f"block_size {n} does not divide the model's block size {model_n} (block-causal family)")
    if cfg.small_block_size is not None and cfg.small_block_size > n:
        raise ValidationError(
            f"small_block_size {cfg.small_block_size} is larger than block_size {n}; give a small block size that "
            f"divides it (or 'none')"
        )
    cfg.validate()
    return cfg


def resolve_graph(
    model: LoadedModel,
    graph: str | Path | DraftGraph | None = None,
    budget: int | None = None,
    depth: int | None = None,
) -> DraftGraph:
    """The draft graph to use: a given graph (file), else one selected from the calibration counts shipped beside
    the checkpoint (the shipped ``draft_graph.json`` when B = 7 and no depth cap)."""
    if budget is not None and budget < 1:
        raise ValueError(f"budget must be positive, got {budget}")
    if depth is not None and depth < 1:
        raise ValueError(f"depth cap must be positive, got {depth}")
    if isinstance(graph, DraftGraph):
        g = graph
        g.check_budget(budget)
    elif graph is not None:
        g = DraftGraph.load(graph)
        g.check_budget(budget)
    else:
        shipped, counts_path, paths_path = model.path / GRAPH_FILE, model.path / COUNTS_FILE, model.path / PATHS_FILE
        if shipped.is_file() and budget in (None, DEFAULT_BUDGET) and depth is None:
            return DraftGraph.load(shipped)
        b = budget or DEFAULT_BUDGET
        if paths_path.is_file():
            paths = CalibrationPaths.load(paths_path)
            # the shipped graph's draft cost, so that every B / depth cap gets a policy for the same machine
            cost = DraftGraph.load(shipped).provenance.get("draft_cost", 0.0) if shipped.is_file() else 0.0
            provenance = {"source": PATHS_FILE}
            return graph_from_paths(paths, b, depth, model=model.name, provenance=provenance, draft_cost=cost)
        if not counts_path.is_file():
            raise ValueError(f"no draft graph for {model.path}: pass --graph FILE (make one with `specfold calibrate`)")
        counts = counts_from_json(json.loads(counts_path.read_text()))
        return graph_from_counts(counts, b, depth, model=model.name, provenance={"source": COUNTS_FILE})
    return g.restricted(depth) if depth is not None else g


@dataclass
class Method:
    """A decoding method ready to run: how a pass is verified and how drafts are made (None: vanilla)."""

    name: str
    verifier: Verifier
    drafter: Drafter | None
    graph: DraftGraph | None = None


def prepare_method(model: LoadedModel, method: MethodConfig, decode_cfg: DecodeConfig | None = None) -> Method:
    """The verifier and drafter of ``method`` (its options validated by :class:`~specfold.config.MethodConfig`;
    those left None take their defaults: δ 0.1, backend ``torch``, FFN ``residual``, attention ``auto``, boundary
    drafts wherever the model and block size allow them). ``decode_cfg`` (default: the model's,
    :func:`decode_config_for`) is the run's: the graph is checked against its block size, the drafter works in its
    small blocks, and boundary drafts must be able to run at its block size when ``lookahead`` is True."""
    if not isinstance(method, MethodConfig):
        raise TypeError(f"prepare_method takes a MethodConfig, got {type(method).__name__}")
    cfg = decode_cfg if decode_cfg is not None else decode_config_for(model)
    if method.method is MethodName.VANILLA:
        return Method("vanilla", DenseVerifier(model.net, compile=method.compiled), None)
    g = resolve_graph(model, method.graph, method.budget, method.depth)
    g.check(cfg.block_size, model.config.vocab_size)
    why = lookahead_supported(model.net, model.config.family, cfg.block_size)
    if method.lookahead and why is not None:
        raise ValidationError(f"lookahead: {why}")
    on = why is None if method.lookahead is None else method.lookahead
    drafter = GraphDrafter(
        g, model.mask_id, cfg.small_block_size, model.stop_ids, device=model.net.device, lookahead=on
    )
    if method.method is MethodName.SPIFFY:
        return Method("spiffy", DenseVerifier(model.net, compile=method.compiled), drafter, g)
    from specfold.engine.folded import FoldedVerifier

    fold = method.fold
    verifier = FoldedVerifier(
        model.net, delta=fold.delta, backend=fold.backend.value, ffn=fold.ffn.value, attention=fold.attention.value,
        compile=method.compiled,
    )
    return Method("specfold", verifier, drafter, g)


def generate(
    model: LoadedModel,
    prompt_or_ids: str | list[int] | torch.Tensor | Sequence[str | list[int]],
    *,
    method: MethodConfig | str = "vanilla",
    max_new_tokens: int = 256,
    threshold: float = 0.9,
    block_size: int | None = None,
    small_block_size: int | None | str = "auto",
    chat: bool = True,
    prefill_chunk: int | None = None,
    batch_size: int = 8,
    steps: int | None = None,
    strategy: str | None = None,
    cache: str | None = None,
    **options: Any,
) -> GenerationResult | list[GenerationResult]:
    """Decode one prompt (text through the chat template, or token ids as given) and return a typed result; a
    list of prompts (texts or id lists) returns one result per prompt, in order, decoded through a continuous
    batch of at most ``batch_size`` requests (every method; each request's tokens are its batch-1 decode's, except
    that specfold at ``delta > 0`` under the cost rule picks a layer's dense fallback for the whole pass).

    ``method``: a :class:`~specfold.config.MethodConfig`, or a method name whose options come as keywords
    (``generate(model, prompt, method="specfold", delta=0.1)``: ``graph``, ``budget``, ``depth``, ``lookahead``,
    ``delta``, ``backend``, ``ffn``, ``attention``, as the MethodConfig fields). ``vanilla``; ``spiffy`` (drafts
    from a calibrated graph, dense verification); ``specfold`` (the same drafts, folded verification with threshold
    ``delta``, default 0.1). All three produce the vanilla tokens (specfold at ``delta = 0``, ``ffn="residual"``);
    ``delta > 0`` trades exactness for speed. Options that the method does not use (``delta`` with vanilla, ...)
    are refused, as are prompt ids outside the vocabulary (before anything is decoded). ``steps`` / ``strategy``:
    a quota rule's passes per block and strategy (SDAR; refused for other families); for LLaDA and Dream ``steps``
    counts the passes of the whole generation and ``cache`` picks Fast-dLLM v1's cache (none / prefix / dual).
    """
    options = {k: v for k, v in options.items() if v is not None}  # None = not given, as in MethodConfig
    unknown = [k for k in options if k not in METHOD_OPTIONS]
    if unknown:
        raise TypeError(f"generate() got an unexpected keyword argument {unknown[0]!r}")
    if isinstance(method, MethodConfig):
        if options:
            raise ValidationError(
                f"{', '.join(options)}: give the method's options in its MethodConfig, not also as keywords"
            )
        method_cfg = method
    else:
        method_cfg = MethodConfig(method, **options)
    cfg = decode_config_for(model, max_new_tokens, threshold, block_size, small_block_size, prefill_chunk, steps,
                            strategy, cache)
    m = prepare_method(model, method_cfg, cfg)
    several = isinstance(prompt_or_ids, list | tuple) and bool(prompt_or_ids) and not isinstance(prompt_or_ids[0], int)
    prompts = list(prompt_or_ids) if several else [prompt_or_ids]
    ids = [encode_prompt(model, p, chat) if isinstance(p, str) else p for p in prompts]
    for one in ids:
        check_token_ids(torch.as_tensor(one).flatten().tolist(), model.config.vocab_size)
    if several:
        results = decode_batch(model, ids, cfg, m, max_batch=batch_size)
    else:
        results = [decode(model, ids[0], cfg, verifier=m.verifier, drafter=m.drafter)]
    if model.tokenizer is not None:
        for result in results:
            result.text = model.tokenizer.decode(result.token_ids, skip_special_tokens=True)
    return results if several else results[0]


def record_traces(
    model: LoadedModel,
    prompts: Sequence[Sequence[int]],
    cfg: DecodeConfig,
    max_vocab_rank: int = 8,
    progress: Callable[[int], None] | None = None,
) -> list[list[BlockTrace]]:
    """Decode calibration prompts vanilla and keep every block's trajectory (one list of blocks per prompt)."""
    out: list[list[BlockTrace]] = []
    for i, ids in enumerate(prompts):
        recorder = TraceRecorder(model.mask_id, cfg.small_block_size, model.stop_ids, max_vocab_rank)
        decode(model, list(ids), cfg, observer=recorder)
        out.append(recorder.traces)
        if progress is not None:
            progress(i + 1)
    return out


def record_counts(
    model: LoadedModel,
    prompts: Sequence[Sequence[int]],
    cfg: DecodeConfig,
    max_depth: int = 8,
    max_vocab_rank: int = 8,
    progress: Callable[[int], None] | None = None,
) -> Counter[Formula]:
    """Decode calibration prompts vanilla and count every real transition as a draft formula (SPEC §3)."""
    traces = record_traces(model, prompts, cfg, max_vocab_rank, progress)
    return count_formulas([t for blocks in traces for t in blocks], max_depth, max_vocab_rank)
