"""Where a record comes from, and the check that a resumed run only reuses records made exactly like its own.

Every record of ``specfold eval`` / ``specfold sweep`` carries a ``provenance`` object:

* run fields, the same for every record of one output file: specfold version, the model (its path and
  ``model_hash`` over config.json, the tokenizer files and the weights' metadata: tensor names, shapes and dtypes
  from the safetensors headers plus a few sampled kilobytes of data; never the gigabytes of weights), the special
  ids, dtype, device, decoding parameters (max new tokens, threshold, block and small-block size, a quota rule's
  steps and strategy), chat template on/off, split, batch size and, for a sweep, its kind and fixed B or δ;
* item fields, checked for records that a rerun would reuse: ``graph_hash`` (the draft graph's nodes, so a
  recalibrated graph under the same file name is noticed) and ``task_data`` (a hash of the sample's prompt, scorer
  data and reference).

Method parameters (δ, B, depth, backend, FFN and attention modes, graph path) are part of the record key, so
other methods may be added to a file later (a sweep's grid grows); everything else that differs is refused with
:class:`ProvenanceMismatch` naming the field.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

from specfold.validation import ValidationError

# The run fields, in the order a mismatch is reported.
RUN_FIELDS: tuple[str, ...] = (
    "specfold",
    "model",
    "model_hash",
    "mask_id",
    "stop_id",
    "dtype",
    "device",
    "max_new_tokens",
    "threshold",
    "block_size",
    "small_block_size",
    "steps",
    "strategy",
    "cache",
    "chat",
    "split",
    "batch_size",
    "sweep",
    "sweep_budget",
    "sweep_delta",
)
ITEM_FIELDS: tuple[str, ...] = ("graph_hash", "task_data")
HASH_CHARS = 16
SAMPLE_BYTES = 1 << 16  # bytes of tensor data hashed at the start, middle and end of each weight file
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


class ProvenanceMismatch(ValidationError):
    """An output file holds records made with other settings."""


def _digest(h: hashlib._Hash) -> str:
    return h.hexdigest()[:HASH_CHARS]


def _weight_files(ckpt: Path) -> list[Path]:
    single = ckpt / "model.safetensors"
    if single.is_file():
        return [single]
    index = ckpt / "model.safetensors.index.json"
    if index.is_file():
        return sorted({ckpt / n for n in json.loads(index.read_text()).get("weight_map", {}).values()})
    return sorted(ckpt.glob("*.safetensors"))


def _hash_safetensors(h: hashlib._Hash, path: Path) -> None:
    """The header (tensor names, dtypes, shapes, offsets) and three samples of the data."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        (n,) = struct.unpack("<Q", raw) if len(raw) == 8 else (0,)
        h.update(f.read(min(n, size)))
        for at in (8 + n, (8 + n + size) // 2, max(8 + n, size - SAMPLE_BYTES)):
            f.seek(at)
            h.update(f.read(SAMPLE_BYTES))
    h.update(str(size).encode())


def model_hash(ckpt: Path) -> str:
    """A short hash that changes when the checkpoint's config, tokenizer or weights change, computed from a few
    hundred kilobytes whatever the checkpoint's size."""
    h = hashlib.sha256()
    for name in ("config.json", *TOKENIZER_FILES):
        f = ckpt / name
        if f.is_file():
            h.update(name.encode() + b"\0" + f.read_bytes() + b"\0")
    for f in _weight_files(ckpt):
        h.update(f.name.encode() + b"\0")
        _hash_safetensors(h, f)
    return _digest(h)


def graph_hash(graph) -> str | None:
    """Hash of a draft graph's structure (nodes, parents, depth cap, drafting policy); None for no graph
    (vanilla)."""
    if graph is None:
        return None
    body = {"nodes": graph.strings(), "parents": list(graph.parents), "depth_cap": graph.depth_cap}
    if graph.policy:  # graphs without a policy keep their hash
        body["policy"] = [[c, list(idx)] for c, idx in graph.policy]
    return _digest(hashlib.sha256(json.dumps(body, sort_keys=True).encode()))


def sample_hash(sample: Any) -> str:
    """Hash of what a sample asks and how it is scored (prompt, scorer metadata, reference)."""
    body = {
        "prompt": sample.prompt,
        "meta": getattr(sample, "meta", None),
        "reference": getattr(sample, "reference", None),
    }
    return _digest(hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()))


def run_provenance(model, cfg, plan) -> dict[str, Any]:
    """The run fields of every record of ``plan`` decoded with ``model`` under ``cfg``."""
    from specfold import __version__

    return {
        "specfold": __version__,
        "model": str(model.path),
        "model_hash": model_hash(Path(model.path)),
        "mask_id": model.mask_id,
        "stop_id": model.stop_id,
        "dtype": str(model.net.dtype).removeprefix("torch."),
        "device": str(model.net.device),
        "max_new_tokens": cfg.max_new_tokens,
        "threshold": cfg.threshold,
        "block_size": cfg.block_size,
        "small_block_size": cfg.small_block_size,
        "steps": cfg.steps,  # None (absent in older files: read as None) unless a quota rule's steps were given
        "strategy": cfg.strategy,
        "cache": cfg.cache,  # None (absent in older files) unless LLaDA / Dream's --cache was given
        "chat": plan.chat,
        "split": plan.split,
        "batch_size": plan.batch_size,
        "sweep": (plan.sweep or {}).get("kind"),
        "sweep_budget": (plan.sweep or {}).get("budget"),
        "sweep_delta": (plan.sweep or {}).get("delta"),
    }


def _shown(field: str, value: Any) -> str:
    return "none" if value is None else repr(value)


def check_resume(
    out: Path, existing: list[dict[str, Any]], run: dict[str, Any], items: dict[str, dict[str, Any]], record_key
) -> None:
    """Refuse to resume ``out`` unless every record in it was made with the run fields ``run`` and every record
    this run would reuse (its key in ``items``) has the item fields there. One line names the first field that
    differs, with the value in the file and the value now."""
    hint = "pass --overwrite to start a new file, or another --out"
    for rec in existing:
        prov = rec.get("provenance")
        if not isinstance(prov, dict):
            raise ProvenanceMismatch(f"{out} holds records without provenance (an older specfold wrote them); {hint}")
        for field in RUN_FIELDS:
            if prov.get(field) != run[field]:
                raise ProvenanceMismatch(
                    f"{out} was written with another {field} ({_shown(field, prov.get(field))} there, "
                    f"{_shown(field, run[field])} now); {hint}"
                )
        want = items.get(record_key(rec))
        if want is None:
            continue
        for field in ITEM_FIELDS:
            if prov.get(field) != want[field]:
                what = "draft graph" if field == "graph_hash" else "task data"
                raise ProvenanceMismatch(
                    f"{out} was written with another {field} ({what} of {rec.get('label', rec['method'])} on "
                    f"{rec['sample_id']}: {_shown(field, prov.get(field))} there, {_shown(field, want[field])} "
                    f"now); {hint}"
                )
