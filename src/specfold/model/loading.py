"""Hugging Face checkpoint loading: a local directory or a hub id, single-file or sharded safetensors.

Weight names follow the real checkpoints (key templates, as in gpt-fast): the family's per-layer names
(``FamilySpec.layer_keys``: the Qwen2 / Llama names, or LLaDA's ``blocks.N.{attn_norm, q_proj, …, ff_out}``) under
its prefix (``model.`` for Fast-dLLM-v2 / qwen2 / SDAR / Dream, ``encoder.`` for Nemotron-Labs-Diffusion,
``model.transformer.`` for LLaDA) and the family's LM head (``lm_head.weight``; NLD's ``diffusion_head.weight``;
LLaDA's ``model.transformer.ff_out.weight``), absent when tied (:class:`~specfold.model.families.base.FamilySpec`).

Every problem is a :class:`CheckpointError` with a one-line message naming the file or tensor.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specfold.config import CheckpointError, ConfigError, ModelConfig
from specfold.model.embedded import embedded_model_dir
from specfold.model.families import config_from_dict, family_of
from specfold.model.transformer import DLLM

DTYPES: dict[str, torch.dtype] = {"fp64": torch.float64, "fp32": torch.float32, "bf16": torch.bfloat16}
MASK_TOKEN = "|<MASK>|"



AUTO_DTYPE = "auto"
# CPU flags (/proc/cpuinfo) of native bf16 matrix units: AMX tiles, or AVX-512 BF16 dot products. Without them a
# bf16 GEMM is emulated (about 8 GFLOP/s on an AVX2 EPYC against ~47 in fp32), and every bf16 figure measures that.
BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")


def cpu_flags(path: str | Path = "/proc/cpuinfo") -> frozenset[str]:
    """The first CPU's feature flags (empty where the file is missing or unreadable, e.g. off Linux)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def auto_dtype(device: torch.device | str = "cpu", flags: frozenset[str] | None = None) -> tuple[str, str]:
    """``--dtype auto``: the dtype name for ``device`` and why. A CUDA device: bf16; a CPU: bf16 where it has native
    bf16 matrix units (:data:`BF16_CPU_FLAGS`, read from ``flags`` or /proc/cpuinfo), fp32 elsewhere.

        >>> auto_dtype("cpu", frozenset({"avx2"}))
        ('fp32', 'the CPU has no native bf16 matrix units (no amx_bf16 / avx512_bf16 flag): bf16 would be emulated')
    """
    dev = torch.device(device)
    if dev.type == "cuda":
        return "bf16", "a CUDA device runs bf16 on its tensor cores"
    if dev.type != "cpu":
        return "fp32", f"no bf16 rule for a {dev.type} device"
    have = [f for f in BF16_CPU_FLAGS if f in (cpu_flags() if flags is None else flags)]
    if have:
        return "bf16", f"the CPU has native bf16 matrix units ({', '.join(have)})"
    return "fp32", "the CPU has no native bf16 matrix units (no amx_bf16 / avx512_bf16 flag): bf16 would be emulated"


def parse_dtype(name: str | torch.dtype, device: torch.device | str = "cpu") -> torch.dtype:
    """A dtype name (``fp64``, ``fp32``, ``bf16``, or ``auto``: :func:`auto_dtype` for ``device``) as a torch dtype."""
    if isinstance(name, torch.dtype):
        return name
    if name == AUTO_DTYPE:
        name = auto_dtype(device)[0]
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}, auto")
    return DTYPES[name]


def resolve_checkpoint(path_or_id: str | Path) -> Path:
    """A local directory as is; otherwise a hub id downloaded with ``huggingface_hub`` (config, weights, tokenizer)."""
    path = Path(path_or_id).expanduser()
    if path.is_dir():
        return path
    text = str(path_or_id)
    if path.exists() or text.startswith((".", "/", "~")) or text.count("/") != 1:
        raise CheckpointError(f"no checkpoint directory at '{text}'")
    try:
        from huggingface_hub import snapshot_download

        local = snapshot_download(
            text,
            allow_patterns=["*.json", "*.safetensors", "tokenizer*", "*.txt", "*.jinja", "*.model"],
        )
    except Exception as exc:  # noqa: BLE001 - any hub/network failure becomes one clear line
        raise CheckpointError(
            f"could not download '{text}' from the Hugging Face Hub ({type(exc).__name__}); "
            "offline? pass a local checkpoint directory instead"
        ) from None
    return Path(local)


def read_config(ckpt: Path) -> ModelConfig:
    cfg_path = ckpt / "config.json"
    if not cfg_path.is_file():
        raise CheckpointError(f"incomplete checkpoint: {cfg_path} is missing")
    try:
        raw = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{cfg_path} is not valid JSON: {exc}") from None
    try:
        return config_from_dict(raw)
    except ConfigError as exc:
        raise CheckpointError(f"{cfg_path}: {exc}") from None


def _weight_files(ckpt: Path) -> list[Path]:
    single = ckpt / "model.safetensors"
    index = ckpt / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = sorted({ckpt / name for name in weight_map.values()})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"incomplete checkpoint: shard {missing[0]} listed in {index.name} is missing")
        return files
    raise CheckpointError(f"incomplete checkpoint: no model.safetensors or model.safetensors.index.json in {ckpt}")


def _read_tensors(files: list[Path]) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as handle:
                for key in handle.keys():
                    tensors[key] = handle.get_tensor(key)
        except Exception as exc:  # noqa: BLE001
            raise CheckpointError(f"cannot read weights from {f.name}: {exc}") from None
    return tensors


def _head_keys(cfg: ModelConfig) -> list[str]:
    return list(family_of(cfg).head_keys)


def state_dict_from_hf(cfg: ModelConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Map HF tensor names onto our fused parameters. Every tensor must be used: a missing one, or one that
    config.json does not account for (more layers than ``num_hidden_layers``, a stray module), is refused naming
    the first; shapes are checked by :func:`build_model`."""
    used: set[str] = set()

    def take(name: str) -> torch.Tensor:
        if name not in tensors:
            raise CheckpointError(f"checkpoint lacks tensor '{name}'")
        used.add(name)
        return tensors[name]

    family = family_of(cfg)
    pre = family.weight_prefix
    out = {"embed": take(pre + family.embed_key), "final_norm": take(pre + family.norm_key)}
    heads = [k for k in _head_keys(cfg) if k in tensors]
    used.update(heads)  # a tied checkpoint may still carry a copy of the head
    if not cfg.tie_word_embeddings:
        if not heads:
            raise CheckpointError(f"checkpoint lacks tensor '{_head_keys(cfg)[0]}' (tie_word_embeddings is false)")
        out["head"] = tensors[heads[0]]
    for i in range(cfg.num_layers):
        lp = f"{pre}{family.layer_prefix}{i}."
        for ours, theirs in family.layer_keys:
            if not _has_param(cfg, ours):
                continue
            parts = [take(lp + name) for name in theirs]
            out[f"layers.{i}.{ours}"] = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
    extra = sorted(k for k in tensors if k not in used and not k.endswith("rotary_emb.inv_freq"))
    if extra:
        raise CheckpointError(
            f"checkpoint tensor '{extra[0]}' is not used by its config.json ({len(extra)} such tensors; "
            f"num_hidden_layers {cfg.num_layers}, attention_bias {cfg.qkv_bias}): config and weights disagree"
        )
    return out


def _has_param(cfg: ModelConfig, ours: str) -> bool:
    return not ((ours == "bqkv" and not cfg.qkv_bias) or (ours in ("q_norm", "k_norm") and not cfg.qk_norm))


def state_dict_to_hf(model: DLLM) -> dict[str, torch.Tensor]:
    """Inverse of :func:`state_dict_from_hf`: our parameters under the family's HF names (fused parameters split
    back into the tensors they were concatenated from)."""
    cfg = model.cfg
    family = family_of(cfg)
    pre = family.weight_prefix
    hq, hkv, d, f = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size
    sizes = {"wqkv": [hq * d, hkv * d, hkv * d], "bqkv": [hq * d, hkv * d, hkv * d], "w_gate_up": [f, f]}
    out = {pre + family.embed_key: model.embed, pre + family.norm_key: model.final_norm}
    if model.head is not None:
        out[_head_keys(cfg)[0]] = model.head
    for i, layer in enumerate(model.layers):
        lp = f"{pre}{family.layer_prefix}{i}."
        for ours, theirs in family.layer_keys:
            if not _has_param(cfg, ours):
                continue
            param = getattr(layer, ours)
            parts = param.split(sizes[ours]) if len(theirs) > 1 else (param,)
            out.update({lp + name: part for name, part in zip(theirs, parts, strict=True)})
    return {k: v.detach().contiguous() for k, v in out.items()}


def build_model(cfg: ModelConfig, weights: dict[str, torch.Tensor], dtype: torch.dtype, device: str) -> DLLM:
    with torch.device("meta"):
        model = DLLM(cfg)
    expected = dict(model.named_parameters())
    for name, param in expected.items():
        if name not in weights:
            raise CheckpointError(f"checkpoint lacks the weights for '{name}'")
        if tuple(weights[name].shape) != tuple(param.shape):
            raise CheckpointError(
                f"shape mismatch for '{name}': checkpoint has {tuple(weights[name].shape)}, "
                f"config.json implies {tuple(param.shape)}"
            )
    model.load_state_dict({k: v.to(dtype) for k, v in weights.items()}, assign=True)
    return model.to(device=device, dtype=dtype).eval().requires_grad_(False)


@dataclass
class SpecialIds:
    mask: int
    stop: int | None
    stop_source: str  # where the stop id came from: "--eos-id", "config.json eos_token_id", "tokenizer '<name>'", …
    stops: tuple[int, ...] = ()  # every stop id (``stop`` first); empty when ``stop`` is None


def generation_config_stops(ckpt: Path | None) -> tuple[int, ...]:
    """``eos_token_id`` of the checkpoint's ``generation_config.json`` (an int or a list), or ``()``."""
    path = None if ckpt is None else ckpt / "generation_config.json"
    if path is None or not path.is_file():
        return ()
    try:
        eos = json.loads(path.read_text()).get("eos_token_id")
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from None
    ids = eos if isinstance(eos, list) else ([] if eos is None else [eos])
    return tuple(dict.fromkeys(int(e) for e in ids))


def load_tokenizer(ckpt: Path, stock_class: str | None = None) -> Any | None:
    """The checkpoint's tokenizer via ``transformers.AutoTokenizer`` (local files only), or None if absent.

    ``stock_class`` (a family's ``tokenizer_class``): the transformers class that reads the files of a checkpoint
    whose own tokenizer class is remote code and which ships no ``tokenizer.json`` (Dream: ``DreamTokenizer``, Qwen2's
    byte-level BPE over ``vocab.json`` + ``merges.txt``; its added tokens come from ``tokenizer_config.json``)."""
    if not any((ckpt / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
        return None
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    # AutoTokenizer warns about model_types it does not know (Fast_dLLM_Qwen, nemotron_labs_diffusion); the
    # tokenizer itself is fine, so keep that warning out of our output.
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        # NOTE: trust_remote_code=False, never None: published DLLM configs carry `auto_map`, and None makes
        # transformers ask on stdin (a hang under a server or CI). Their tokenizers are stock classes anyway.
        return AutoTokenizer.from_pretrained(str(ckpt), local_files_only=True, trust_remote_code=False)
    except Exception:  # noqa: BLE001 - custom model_types confuse AutoTokenizer; fall back to the fast file
        tok_file = ckpt / "tokenizer.json"
        if not tok_file.is_file() and stock_class is not None:
            import transformers

            try:
                return getattr(transformers, stock_class).from_pretrained(str(ckpt), local_files_only=True)
            except Exception:  # noqa: BLE001 - reported as one line below
                raise CheckpointError(f"cannot load the tokenizer in {ckpt} (as {stock_class})") from None
        if not tok_file.is_file():
            raise CheckpointError(f"cannot load the tokenizer in {ckpt}") from None
        from transformers import PreTrainedTokenizerFast

        cfg_path = ckpt / "tokenizer_config.json"
        extra = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        kwargs = {k: extra[k] for k in ("eos_token", "pad_token", "chat_template") if isinstance(extra.get(k), str)}
        return PreTrainedTokenizerFast(tokenizer_file=str(tok_file), **kwargs)
    finally:
        hf_logging.set_verbosity(verbosity)


def special_ids(
    cfg: ModelConfig, tokenizer: Any | None, mask_id: int | None = None, eos_id: int | None = None,
    generation_stops: tuple[int, ...] = (),
) -> SpecialIds:
    """mask = override, else config ``mask_token_id``, else the tokenizer's ``|<MASK>|``; stop = override, else the
    checkpoint's configured ``eos_token_id`` (the first of a list), else — only as a fallback — the first of the
    family's stop token names the tokenizer knows, else the tokenizer's EOS. ``stop_source`` says which was used.
    Unless the stop id is given, every ``extra_stop_token_names`` token of the family the tokenizer knows joins
    ``stops`` after it (LLaDA: EOS then ``<|eot_id|>``; Dream: ``<|endoftext|>`` then ``<|im_end|>``).

    A family whose reference stops on every id of ``generation_config.json`` (SDAR: ``[151645, 151643]``) takes
    ``generation_stops`` (that file's ids) when no override is given: ``stops`` is then that list, its first id
    ``stop``."""
    if eos_id is None and generation_stops and family_of(cfg).generation_config_stops:
        found = special_ids(cfg, tokenizer, mask_id, generation_stops[0])
        for value in generation_stops:
            if not 0 <= value < cfg.vocab_size:
                raise CheckpointError(f"stop token id {value} is outside the vocabulary (size {cfg.vocab_size})")
        return SpecialIds(found.mask, generation_stops[0], "generation_config.json eos_token_id", generation_stops)
    if mask_id is None:
        mask_id = cfg.mask_token_id
    if mask_id is None and tokenizer is not None:
        found = tokenizer.convert_tokens_to_ids(MASK_TOKEN)
        if isinstance(found, int) and found != tokenizer.unk_token_id:
            mask_id = found
    if mask_id is None:
        raise CheckpointError(
            f"cannot find the mask token: config.json has no mask_token_id and the tokenizer has no {MASK_TOKEN}; "
            "pass --mask-id"
        )
    source = "--eos-id"
    if eos_id is None and cfg.eos_token_id is not None:
        eos_id, source = cfg.eos_token_id, "config.json eos_token_id"
    if eos_id is None and tokenizer is not None:
        for tok in family_of(cfg).stop_token_names:
            found = tokenizer.convert_tokens_to_ids(tok)
            if isinstance(found, int) and found != tokenizer.unk_token_id:
                eos_id, source = found, f"tokenizer {tok!r}"
                break
        if eos_id is None and tokenizer.eos_token_id is not None:
            eos_id, source = tokenizer.eos_token_id, "tokenizer eos_token"
    if eos_id is None:
        source = "none (decodes run to max_new_tokens)"
    for name, value in (("mask", mask_id), ("stop", eos_id)):
        if value is not None and not 0 <= value < cfg.vocab_size:
            raise CheckpointError(f"{name} token id {value} is outside the vocabulary (size {cfg.vocab_size})")
    stop = None if eos_id is None else int(eos_id)
    stops = () if stop is None else (stop,)
    if stop is not None and source != "--eos-id" and tokenizer is not None:
        for tok in family_of(cfg).extra_stop_token_names:
            found = tokenizer.convert_tokens_to_ids(tok)
            if isinstance(found, int) and found != tokenizer.unk_token_id and 0 <= found < cfg.vocab_size:
                stops = tuple(dict.fromkeys((*stops, found)))
        if len(stops) > 1:
            source += " + tokenizer " + ", ".join(repr(t) for t in family_of(cfg).extra_stop_token_names)
    return SpecialIds(mask=int(mask_id), stop=stop, stop_source=source, stops=stops)


def load_checkpoint(
    path_or_id: str | Path, dtype: str | torch.dtype = "fp32", device: str = "cpu"
) -> tuple[Path, ModelConfig, DLLM]:
    ckpt = resolve_checkpoint(path_or_id)
    cfg = read_config(ckpt)
    weights = state_dict_from_hf(cfg, _read_tensors(_weight_files(ckpt)))
    return ckpt, cfg, build_model(cfg, weights, parse_dtype(dtype, device), device)


@dataclass
class LoadedModel:
    """A ready model: our network, its config, tokenizer (may be None) and resolved special ids."""

    net: DLLM
    config: ModelConfig
    tokenizer: Any | None
    mask_id: int
    stop_id: int | None
    path: Path
    stop_source: str = "given"  # where stop_id came from (see special_ids)
    stop_ids: tuple[int, ...] = ()  # every stop id, ``stop_id`` first (default: just ``stop_id``)

    def __post_init__(self) -> None:
        # stop_ids not starting with stop_id (none given, or ``dataclasses.replace(model, stop_id=…)``): the one id
        if (self.stop_ids[:1] or (None,))[0] != self.stop_id:
            self.stop_ids = () if self.stop_id is None else (self.stop_id,)

    @property
    def name(self) -> str:
        return self.path.name


def load_model(
    path_or_id: str | Path | None = None,
    dtype: str | torch.dtype = "fp32",
    device: str = "cpu",
    mask_id: int | None = None,
    eos_id: int | None = None,
) -> LoadedModel:
    """Load a checkpoint directory or hub id; with no argument, the embedded model shipped with specfold."""
    from specfold.validation import check_device

    check_device(device)
    if path_or_id is None:
        path_or_id = embedded_model_dir()
    ckpt, cfg, net = load_checkpoint(path_or_id, dtype=dtype, device=device)
    tokenizer = load_tokenizer(ckpt, family_of(cfg).tokenizer_class)
    ids = special_ids(cfg, tokenizer, mask_id=mask_id, eos_id=eos_id, generation_stops=generation_config_stops(ckpt))
    return LoadedModel(net=net, config=cfg, tokenizer=tokenizer, mask_id=ids.mask, stop_id=ids.stop, path=ckpt,
                       stop_source=ids.stop_source, stop_ids=ids.stops)
