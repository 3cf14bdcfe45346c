"""HunyuanOCR 1.0 and 1.5: which one a checkpoint is, and what differs between them for serving.

Both are ``HunYuanVLForConditionalGeneration``; the hub's root holds 1.5 since 2026-07 and 1.0 moved to
``v1.0/``. What the service changes by version (docs/HUNYUANOCR.md, the authors' 1.5 client):
- the repetition rules: the authors' clean-up trims a tail repeated >= 10 times on outputs of >= 8000
  characters (1.0) or >= 2000 (1.5); 1.5's client also stops streaming when a unit of <= 256 characters
  repeats 8 times. hyocr's streaming guard checks earlier and more often than either (pipeline/postprocess.py)
  and takes the version's unit and repeat count, so every loop the authors' client stops, it stops too;
- the decoding defaults, which come from the checkpoint's ``generation_config.json`` (1.5: greedy with
  repetition_penalty 1.08) on every engine, not from constants;
- the image bounds, from the checkpoint's processor config (1.0: 512^2..2048^2 pixels; 1.5: up to 4096^2).
A checkpoint is 1.5 when its context is longer than 1.0's 32768 tokens or its processor reads more than
1.0's 2048^2 pixels; ``MODEL_VERSION`` overrides the guess.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["V1_0", "V1_5", "ModelVersion", "checkpoint_bounds", "detect", "generation_defaults", "of",
           "read_checkpoint"]

V1_0_CONTEXT = 32768
V1_0_MAX_PIXELS = 2048 * 2048


@dataclass(frozen=True, slots=True)
class ModelVersion:
    name: str
    trim_min_chars: int  # the authors' clean-up checks outputs this long
    trim_min_repeats: int
    guard_min_repeats: int  # the streaming guard: a unit repeated this often ...
    guard_max_unit: int  # ... of at most this many characters


V1_0 = ModelVersion("1.0", trim_min_chars=8000, trim_min_repeats=10, guard_min_repeats=10, guard_max_unit=200)
V1_5 = ModelVersion("1.5", trim_min_chars=2000, trim_min_repeats=10, guard_min_repeats=8, guard_max_unit=256)
VERSIONS = {v.name: v for v in (V1_0, V1_5)}


def tasks(version: ModelVersion, all_tasks: frozenset) -> frozenset:
    """The tasks a checkpoint of ``version`` was trained for: 1.0 lacks 1.5's task-locked ones."""
    from .prompts import V15_TASKS

    return all_tasks if version is V1_5 else all_tasks - V15_TASKS


def of(name: str) -> ModelVersion:
    """The rules of a version by name; an engine that names none (rapidocr, an upstream) gets 1.5's, the
    stricter clean-up."""
    return VERSIONS.get(name, V1_5)


@dataclass(frozen=True, slots=True)
class CheckpointFacts:
    """What a checkpoint folder says about serving it (None where it says nothing)."""

    version: ModelVersion
    context: int | None
    min_pixels: int | None
    max_pixels: int | None
    defaults: dict[str, float]  # generation_config.json's decoding defaults, in SamplingParams' names


def checkpoint_bounds(facts: CheckpointFacts, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """hyocr's page bounds within the checkpoint's processor's: what the engine sends is what the model reads
    (a larger page would be shrunk by the processor anyway, and the KV cache sized for pixels never read)."""
    low = max(min_pixels, facts.min_pixels or 0)
    high = min(max_pixels, facts.max_pixels or max_pixels)
    return (low, high) if low <= high else (high, high)


def detect(config: dict, processor: dict | None = None, override: str = "auto") -> ModelVersion:
    if override in VERSIONS:
        return VERSIONS[override]
    text = config.get("text_config") or config
    context = int(text.get("max_position_embeddings") or config.get("max_position_embeddings") or 0)
    max_pixels = int((processor or {}).get("max_pixels") or 0)
    return V1_5 if context > V1_0_CONTEXT or max_pixels > V1_0_MAX_PIXELS else V1_0


def generation_defaults(generation: dict[str, Any]) -> dict[str, float]:
    """The decoding defaults a ``generation_config.json`` sets (as vLLM's server applies them): greedy when
    it does not sample, its temperature otherwise, and the top_p / top_k / repetition_penalty it names.
    max_new_tokens is left to hyocr's DEFAULT_MAX_TOKENS (a page's budget, not the context)."""
    out: dict[str, float] = {}
    if generation.get("do_sample") is False or ("do_sample" not in generation and "temperature" not in generation):
        out["temperature"] = 0.0
    elif generation.get("temperature") is not None:
        out["temperature"] = float(generation["temperature"])
    if generation.get("top_p") is not None and float(generation["top_p"]) < 1.0:
        out["top_p"] = float(generation["top_p"])
    if generation.get("top_k") is not None and int(generation["top_k"]) > 0:
        out["top_k"] = int(generation["top_k"])
    if generation.get("repetition_penalty") is not None and float(generation["repetition_penalty"]) != 1.0:
        out["repetition_penalty"] = float(generation["repetition_penalty"])
    return out


def _json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def processor_settings(folder: Path) -> dict:
    """The image processor's settings: preprocessor_config.json (the hub's layout), or the image_processor
    section of processor_config.json (newer transformers)."""
    pre = _json(folder / "preprocessor_config.json") or (_json(folder / "processor_config.json").get("image_processor")
                                                          or {})
    size = pre.get("size") if isinstance(pre.get("size"), dict) else {}
    return {**pre, "min_pixels": pre.get("min_pixels") or size.get("shortest_edge"),
            "max_pixels": pre.get("max_pixels") or size.get("longest_edge")}


def read_checkpoint(folder: str | Path, override: str = "auto") -> CheckpointFacts:
    """The facts of a local checkpoint folder (a missing file says nothing; 1.0 is the fallback)."""
    folder = Path(folder)
    config = _json(folder / "config.json")
    processor = processor_settings(folder)
    text = config.get("text_config") or config
    context = text.get("max_position_embeddings") or config.get("max_position_embeddings")
    return CheckpointFacts(
        version=detect(config, processor, override),
        context=int(context) if context else None,
        min_pixels=int(processor["min_pixels"]) if processor.get("min_pixels") else None,
        max_pixels=int(processor["max_pixels"]) if processor.get("max_pixels") else None,
        defaults=generation_defaults(_json(folder / "generation_config.json")),
    )
