"""The model families: one module each, registered here by name and by every ``model_type`` it loads.

Adding a family is one module defining a :class:`~specfold.model.families.base.FamilySpec` and one line in
:data:`FAMILIES`; the decoding core reads everything family-specific from the spec.
"""

from __future__ import annotations

from typing import Any

from specfold.config import ConfigError, ModelConfig
from specfold.model.families import dream, fast_dllm_v2, llada, nld, sdar
from specfold.model.families.base import FamilySpec, model_config

FAMILIES: dict[str, FamilySpec] = {
    f.name: f for f in (fast_dllm_v2.FAMILY, nld.FAMILY, sdar.FAMILY, llada.FAMILY, dream.FAMILY)
}
MODEL_TYPES: dict[str, FamilySpec] = {t: f for f in FAMILIES.values() for t in f.model_types}


def get_family(name: str) -> FamilySpec:
    if name not in FAMILIES:
        raise ValueError(f"unknown family {name!r}; known: {', '.join(FAMILIES)}")
    return FAMILIES[name]


def family_of(cfg: ModelConfig) -> FamilySpec:
    return get_family(cfg.family)


def config_from_dict(raw: dict[str, Any]) -> ModelConfig:
    """A checkpoint's ``config.json`` as a :class:`ModelConfig`, mapped by the family its ``model_type`` names."""
    model_type = raw.get("model_type")
    if model_type not in MODEL_TYPES:
        raise ConfigError(f"unsupported model_type {model_type!r}; supported: {', '.join(sorted(MODEL_TYPES))}")
    return model_config(raw, MODEL_TYPES[model_type])
