"""Random-weight checkpoints in the real on-disk format of each family (config.json + model.safetensors, or sharded
safetensors with an index as the published 7B/8B checkpoints are stored).

Used by the tests (odd shapes exercise GQA, biases, YaRN) and by the demo before a trained model exists.
The weights are random: whatever such a model generates is noise, and the CLI says so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from specfold.config import ModelConfig
from specfold.model.families import config_from_dict, get_family
from specfold.model.loading import state_dict_to_hf
from specfold.model.transformer import DLLM


def random_config(
    family: str,
    vocab_size: int = 301,
    hidden_size: int = 96,
    num_heads: int = 6,
    num_kv_heads: int = 2,
    num_layers: int = 2,
    intermediate_size: int = 160,
    mask_token_id: int | None = None,
    eos_token_id: int | None = None,
    tie_word_embeddings: bool = False,
    max_position_embeddings: int = 4096,
    head_dim: int | None = None,
) -> dict[str, Any]:
    """A config.json dict as the family's real checkpoints write it (its module's ``example_config``); ``head_dim``
    overrides ``hidden_size // num_heads``."""
    common = {
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "max_position_embeddings": max_position_embeddings,
        "tie_word_embeddings": tie_word_embeddings,
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }
    cfg = get_family(str(family)).example_config(common)
    if mask_token_id is not None:
        cfg["mask_token_id"] = mask_token_id
    if eos_token_id is not None:
        cfg["eos_token_id"] = eos_token_id
    if head_dim is not None and ("head_dim" in cfg or head_dim != hidden_size // num_heads):
        cfg["head_dim"] = head_dim  # (LLaDA's config has no head_dim: its family refuses one it cannot write)
    return cfg


def random_model(cfg: ModelConfig, seed: int = 0, std: float = 0.05) -> DLLM:
    """A DLLM with random weights (fp32). Norm weights are perturbed around 1 so they are exercised too."""
    gen = torch.Generator().manual_seed(seed)
    model = DLLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bqkv"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif name in ("embed", "head"):
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                p.copy_(std * torch.randn(p.shape, generator=gen) * (p.shape[-1] / 96) ** -0.5 * 2)
    return model.eval()


def save_checkpoint(
    model: DLLM, out_dir: Path | str, config: dict[str, Any], dtype: torch.dtype = torch.float32, shards: int = 1
) -> Path:
    """Write ``config.json`` and the weights (in ``dtype``) under the family's HF names: ``model.safetensors``, or
    with ``shards > 1`` the published sharded layout (``model-0000i-of-0000n.safetensors`` and
    ``model.safetensors.index.json`` mapping every tensor to its shard)."""
    from safetensors.torch import save_file

    if shards < 1:
        raise ValueError(f"shards must be positive, got {shards}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = {**config, "torch_dtype": {torch.float32: "float32", torch.bfloat16: "bfloat16"}[dtype]}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors = {k: v.to(dtype).contiguous() for k, v in state_dict_to_hf(model).items()}
    if shards == 1:
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        return out
    names = sorted(tensors)
    weight_map = {}
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: tensors[k] for k in names[i::shards]}
        save_file(part, str(out / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return out


def write_random_checkpoint(
    out_dir: Path | str, family: str, seed: int = 0, generation_eos: list[int] | None = None, shards: int = 1,
    **shape: Any,
) -> Path:
    """A random checkpoint of ``family``; ``generation_eos`` also writes ``generation_config.json`` with those
    ``eos_token_id`` (the stop ids SDAR's reference uses); ``shards > 1`` writes sharded safetensors."""
    cfg_dict = random_config(family, **shape)
    model = random_model(config_from_dict(cfg_dict), seed=seed)
    out = save_checkpoint(model, out_dir, cfg_dict, shards=shards)
    if generation_eos is not None:
        (out / "generation_config.json").write_text(json.dumps({"eos_token_id": list(generation_eos)}, indent=2))
    return out
