"""What the vLLM engine is started and asked with: HunyuanOCR's AsyncEngineArgs from the settings (the authors'
serving defaults, hyocr's sizing knobs, speculative decoding), the checkpoint folder vLLM is handed, LoRA
adapters, and a request's output constraint in vLLM's terms."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...config import SettingsError
from ...types import StructuredOutput
from .tuning import DEFAULT_MAX_NUM_BATCHED_TOKENS, preprocess_workers

if TYPE_CHECKING:
    from ...config import Settings

log = logging.getLogger(__name__)


def parse_lora_modules(spec: str | None) -> dict[str, str]:
    """``"invoices=/adapters/inv,receipts=/adapters/rec"`` -> {name: path}."""
    modules: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in (spec or "").split(","))):
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise SettingsError(f"lora_modules: expected name=path, got {item!r}")
        modules[name.strip()] = path.strip()
    return modules


def resolve_checkpoint(model: str, revision: str | None, subfolder: str | None) -> str:
    """vLLM has no ``subfolder`` argument, and HunyuanOCR 1.0 lives in ``v1.0/`` of the hub repo
    (1.5 at its root): resolve the folder to a local path (downloading just that folder from the hub
    when ``model`` is a hub id) and give vLLM the path."""
    if not subfolder:
        return model
    local = Path(model) / subfolder
    if Path(model).is_dir():
        if not (local / "config.json").exists():
            raise SettingsError(f"no checkpoint (config.json) in {local}")
        return str(local)
    from huggingface_hub import snapshot_download

    root = snapshot_download(model, revision=revision, allow_patterns=[f"{subfolder}/*"])
    return str(Path(root) / subfolder)


def speculative_details(config: dict | None) -> dict[str, str]:
    """What /v1/models says of speculative decoding: the method, its draft and how many tokens it proposes."""
    if not config:
        return {}
    parts = [str(config.get("method") or "auto"), f"{config.get('num_speculative_tokens', '?')} tokens"]
    if config.get("model"):
        parts.append(f"draft {config['model']}")
    return {"speculative_decoding": ", ".join(parts)}


def check_kv_cache_dtype(args: dict[str, Any]) -> None:
    """An FP8 KV cache on vLLM's CPU backend needs AVX-512 or AMX: vLLM refuses it elsewhere only once its
    engine process builds the attention (a worker traceback a minute into the start). Refused here, before
    anything starts, with the reason; GPUs are left to vLLM (its backend picks what it supports)."""
    dtype = str(args.get("kv_cache_dtype") or "auto")
    if not dtype.startswith("fp8"):
        return
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    import torch

    if not (torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported()):
        raise SettingsError(f"KV cache dtype {dtype}: vLLM's CPU backend stores an FP8 KV cache only on x86 "
                            "CPUs with AVX-512 or AMX, and this CPU has neither; use KV_CACHE_DTYPE=auto "
                            "(and no kv_cache_dtype in VLLM_ARGS) here")


def structured_outputs_params(constraint: StructuredOutput) -> Any:
    """vLLM's StructuredOutputsParams for hyocr's constraint (whitespace and backend are the engine's)."""
    from vllm.sampling_params import StructuredOutputsParams

    if constraint.json_schema is not None:
        return StructuredOutputsParams(json=constraint.json_schema)
    if constraint.json_object:
        return StructuredOutputsParams(json_object=True)
    return StructuredOutputsParams(choice=list(constraint.choice))


def vllm_engine_args(settings: Settings) -> dict[str, Any]:
    """AsyncEngineArgs for HunyuanOCR: the authors' serving defaults plus the user's knobs."""
    args: dict[str, Any] = {
        "model": settings.model,
        "revision": settings.revision,
        "trust_remote_code": settings.trust_remote_code,
        "dtype": settings.dtype,
        "max_num_seqs": settings.max_num_seqs,
        "enable_prefix_caching": False,  # OCR prompts rarely share prefixes
        "mm_processor_cache_gb": 0,  # nor images
        "limit_mm_per_prompt": {"image": settings.max_images_per_request},
        "gpu_memory_utilization": settings.gpu_memory_utilization,
        "enforce_eager": settings.enforce_eager,
        "tensor_parallel_size": settings.tensor_parallel_size,
        # vLLM's own data parallelism: a core per copy, its coordinator balancing requests by queue length
        "data_parallel_size": settings.data_parallel_size if settings.data_parallel_size > 1 else None,
        "disable_log_stats": False,
        "max_lora_rank": settings.max_lora_rank if settings.lora_modules else None,
        "max_num_batched_tokens": settings.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS,
        "renderer_num_workers": preprocess_workers(settings.preprocess_workers),
        "stream_interval": settings.stream_interval,
        # Constrained JSON without free whitespace: with it a model can loop in newlines until max_tokens
        # (the tiny random checkpoint wrote '{"name"' and 120 newlines); xgrammar is the backend measured.
        "structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": True},
    }
    if settings.max_model_len:
        args["max_model_len"] = settings.max_model_len
    if settings.quantization:
        args["quantization"] = settings.quantization
    if settings.kv_cache_dtype != "auto":
        args["kv_cache_dtype"] = settings.kv_cache_dtype
    if settings.swap_space is not None:
        args["swap_space"] = settings.swap_space
    if settings.kv_cache_memory_bytes:
        args["kv_cache_memory_bytes"] = settings.kv_cache_memory_bytes
    if settings.speculative_config:  # e.g. 1.5's DFlash draft (the authors: 15 tokens); validated by Settings
        args["speculative_config"] = json.loads(settings.speculative_config)
    if settings.vllm_args:
        args.update(json.loads(settings.vllm_args))  # validated as a JSON object by Settings
    return {k: v for k, v in args.items() if v is not None}


def supported_args(args: dict[str, Any]) -> dict[str, Any]:
    """Drop (with a warning) knobs the installed vLLM no longer has, e.g. swap_space after 0.2x."""
    import dataclasses

    from vllm import AsyncEngineArgs

    known = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    for name in sorted(set(args) - known):
        log.warning("vLLM setting %s=%r is not supported by the installed vLLM; ignored", name, args[name])
    return {k: v for k, v in args.items() if k in known}
