"""Engine name -> implementation, imported lazily so optional backends stay optional."""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..config import SettingsError
from ..types import Task

if TYPE_CHECKING:
    from ..config import Settings
    from .base import Engine

ALL_TASKS = frozenset(Task)
OCR_ONLY_TASKS = frozenset({Task.SPOTTING, Task.TEXT})


@dataclass(frozen=True, slots=True)
class EngineSpec:
    name: str
    target: str  # "module:factory": a function of Settings, or an Engine class (its from_settings)
    tasks: frozenset[Task]
    extra: str | None  # pip extra that installs its dependencies
    summary: str
    requires: tuple[str, ...] = ()  # modules imported lazily at start; checked up front


ENGINES: dict[str, EngineSpec] = {
    spec.name: spec
    for spec in (
        EngineSpec(
            "rapidocr",
            "hyocr.engines.rapidocr:RapidOcrEngine",
            OCR_ONLY_TASKS,
            None,
            "embedded CPU OCR (PP-OCR ONNX models shipped in the rapidocr wheel), offline",
        ),
        EngineSpec(
            "vllm",
            "hyocr.engines.vllm.cores:build",  # a VllmEngine, or a pool of engine cores (ENGINES_PER_GPU)
            ALL_TASKS,
            "vllm",
            "HunyuanOCR on vLLM's async engine in-process: paged KV cache, continuous batching",
            ("vllm",),
        ),
        EngineSpec(
            "transformers",
            "hyocr.engines.transformers:TransformersEngine",
            ALL_TASKS,
            "hf",
            "HunyuanOCR on plain transformers, continuously batched (no vLLM; debugging, the PyTorch baseline)",
            ("torch", "transformers"),
        ),
        EngineSpec(
            "openai",
            "hyocr.engines.openai_upstream:OpenAIUpstreamEngine",
            ALL_TASKS,
            None,
            "HunyuanOCR on a remote OpenAI-compatible server (e.g. vllm serve), with retries and a breaker",
        ),
        EngineSpec(
            "fake",
            "hyocr.engines.fake:FakeEngine",
            ALL_TASKS,
            None,
            "deterministic, scriptable engine for testing the serving layer (not OCR)",
        ),
    )
}


def engines_for(task: Task) -> list[str]:
    """Engines (other than the test fake) that can run ``task``, for error messages."""
    return [n for n, s in ENGINES.items() if task in s.tasks and n != "fake"]


def create_engine(settings: Settings) -> Engine:
    spec = ENGINES.get(settings.engine)
    if spec is None:
        raise SettingsError(f"unknown engine {settings.engine!r}; available: {', '.join(ENGINES)}")
    hint = f' Install it with: pip install "hyocr[{spec.extra}]"' if spec.extra else ""
    missing = [m for m in spec.requires if importlib.util.find_spec(m) is None]
    if missing:
        raise SettingsError(f"engine {spec.name!r} needs {' and '.join(missing)} (not installed).{hint}")
    module_name, _, attr = spec.target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SettingsError(f"engine {spec.name!r} needs a missing package ({exc.name}).{hint}") from exc
    factory = getattr(module, attr)
    return factory.from_settings(settings) if isinstance(factory, type) else factory(settings)
