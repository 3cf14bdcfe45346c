"""hyocr's vLLM defaults for HunyuanOCR, and the arithmetic behind them.

HunyuanOCR is a 1B model whose requests are short and image-heavy (a card: ~690 prompt tokens, of
which 662 are visual, and ~150 output tokens). vLLM's generic defaults are tuned for the opposite:
they give the KV cache 92% of the GPU (125 GiB on an H200 for a 2 GB model) and schedule 2048 tokens a
step when built through ``AsyncLLM`` (three cards' prefill). The numbers and measurements behind each
default are in docs/benchmarks.md and benchmarks/NOTES.md.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# A step of 8192 tokens prefills ~11 cards (or 4 pages) while the running sequences decode, and
# lets the vision encoder take as many images; larger steps stretch the decode stalls of running
# requests without raising throughput at this model size.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
# The vision encoder hyocr installs in vLLM's engine process (vision.py), read there.
VISION_ENCODER_ENV = "HYOCR_VISION_ENCODER"
# The checkpoint's preprocessor_config.json, where patches travel as bytes (vision.py normalises them).
# Here, not in vision.py: the API process must not import vision.py, whose import installs the encoder for
# the process it runs in; a forked engine core would inherit that installation (made before this process
# set the environment) instead of making its own.
PIXEL_CONFIG_ENV = "HYOCR_PIXEL_CONFIG"
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "auto": 2}  # and any fp8* KV type: 1


def kv_dtype(args: dict[str, Any]) -> str:
    """The KV cache's element type: KV_CACHE_DTYPE (or VLLM_ARGS' kv_cache_dtype) when set, else the model's."""
    chosen = args.get("kv_cache_dtype") or "auto"
    return chosen if chosen != "auto" else args.get("dtype", "auto")


def kv_bytes_per_token(config: dict, dtype: str = "auto") -> int:
    """Bytes of KV cache one token occupies: K and V for every layer and KV head."""
    text = config.get("text_config") or config  # nested (transformers 5) or the hub's flat layout
    layers = int(text["num_hidden_layers"])
    heads = int(text.get("num_key_value_heads") or text["num_attention_heads"])
    head_dim = int(text.get("head_dim") or text.get("attention_head_dim")
                   or text["hidden_size"] // text["num_attention_heads"])
    return 2 * layers * heads * head_dim * _DTYPE_BYTES.get(dtype, 1 if dtype.startswith("fp8") else 2)


# What a document page writes (markdown of an A4 page: ~1000 tokens, issue 18's measured workload).
PAGE_OUTPUT_TOKENS = 1024
PROMPT_TEXT_TOKENS = 32  # the chat template and the task prompt around the image


def page_expected_tokens(min_pixels: int, max_pixels: int) -> int:
    """EXPECTED_TOKENS by default: a document page at the pixel bound (the visual tokens of a max_pixels
    square page, HunyuanOCR's own ceiling: 4162 at 2048x2048) with its prompt and a page's output (~5200).
    Cards need a sixth of that; sized for pages, neither workload is preempted at MAX_NUM_SEQS."""
    from ...hunyuan.geometry import PixelBounds, visual_tokens

    side = math.isqrt(max_pixels)
    return visual_tokens(side, side, PixelBounds(min_pixels, max_pixels)) + PROMPT_TEXT_TOKENS + PAGE_OUTPUT_TOKENS


def expected_tokens_of(settings) -> int:
    """EXPECTED_TOKENS as set, or a page's (the default)."""
    if settings.expected_tokens is not None:
        return settings.expected_tokens
    return page_expected_tokens(settings.min_pixels, settings.max_pixels)


def kv_cache_bytes(config: dict, *, max_num_seqs: int, expected_tokens: int, max_model_len: int | None,
                   dtype: str = "auto") -> int:
    """The KV cache the workload needs: every sequence the engine runs at once holding a typical
    request's tokens, and never less than one sequence of the full context (vLLM refuses to start
    otherwise). 5% on top covers block rounding (16-token blocks)."""
    context = max_model_len or int((config.get("text_config") or config).get("max_position_embeddings", 32768))
    tokens = max(max_num_seqs * expected_tokens, context)
    return int(tokens * kv_bytes_per_token(config, dtype) * 1.05)


def load_config(model: str, revision: str | None = None) -> dict | None:
    """config.json of a local checkpoint, or of a hub repo (from the Hugging Face cache, downloading the one
    file if needed: vLLM fetches it next anyway); None when neither can be read."""
    path = Path(model) / "config.json"
    if not Path(model).is_dir():
        try:
            from huggingface_hub import hf_hub_download

            path = Path(hf_hub_download(model, "config.json", revision=revision))
        except Exception as exc:  # no such repo, offline without a cache, no huggingface_hub: vLLM's sizing
            log.debug("config.json of %s not available: %s", model, exc)
            return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def preprocess_workers(requested: int) -> int:
    """Threads vLLM's renderer uses to turn images into model inputs (0 = automatic: half the cores,
    at most 8; the work is numpy/PIL, which releases the GIL)."""
    if requested:
        return requested
    return max(1, min(8, (os.cpu_count() or 2) // 2))


# What the engine needs on the GPU besides the KV cache: HunyuanOCR's 1B weights (~2 GB), activations of
# an 8192-token step with its images, CUDA graphs, the vision encoder's workspace.
NON_KV_RESERVE_BYTES = 8 * 2**30
DEVICE_FRACTION = 0.9  # of the GPU's memory, as vLLM's own default fraction leaves headroom


def device_memory_bytes(gpu: str | None = None) -> int | None:
    """A GPU's memory (``gpu``: a CUDA_VISIBLE_DEVICES entry, default the first visible one) from NVML (extra
    gpu), which does not initialise CUDA in this process (vLLM forks its engine core only while CUDA is
    uninitialised); None without NVML or a GPU."""
    first = (gpu or os.environ.get("CUDA_VISIBLE_DEVICES", "0") or "0").split(",")[0].strip()
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = (pynvml.nvmlDeviceGetHandleByIndex(int(first)) if first.isdigit()
                      else pynvml.nvmlDeviceGetHandleByUUID(first))
            return int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no library, no driver, no GPU: size as asked
        return None


def visible_gpus() -> list[str] | None:
    """This process's GPUs as CUDA_VISIBLE_DEVICES entries (the variable's own, else NVML's count), without
    initialising CUDA; None on a machine without GPUs (or NVML)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [g.strip() for g in listed.split(",") if g.strip()] or None
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return [str(i) for i in range(pynvml.nvmlDeviceGetCount())] or None
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None


def size_engine(args: dict[str, Any], *, expected_tokens: int, device_bytes: int | None = None,
                cores: int = 1) -> dict[str, Any]:
    """Fill in the KV cache size from the workload when the user chose neither a fraction nor a size, for
    one of ``cores`` engine cores sharing the GPU (ENGINES_PER_GPU), each holding the weights, activations
    (NON_KV_RESERVE_BYTES) and its own cache. vLLM checks at start that the GPU has
    ``gpu_memory_utilization`` of its memory free, even when the cache size is given: the fraction is set
    to this core's own footprint, so that a core starting beside others (or beside another server) passes.

    On a GPU too small for the sized caches: one core gets vLLM's fraction (the most the card holds, with a
    warning that fewer pages run at once); several get an equal share each, down to one full-context
    sequence's cache, below which they cannot share this GPU (SettingsError)."""
    if "gpu_memory_utilization" in args or "kv_cache_memory_bytes" in args or not expected_tokens:
        return _fraction_for_given_size(args, device_bytes)
    config = load_config(args["model"], args.get("revision"))
    if config is None:
        log.warning("no config.json for %s: vLLM sizes its KV cache by the default fraction", args["model"])
        return args
    seqs, dtype = args.get("max_num_seqs", 64), kv_dtype(args)
    size = kv_cache_bytes(config, max_num_seqs=seqs, expected_tokens=expected_tokens,
                          max_model_len=args.get("max_model_len"), dtype=dtype)
    room = (device_bytes * DEVICE_FRACTION / cores - NON_KV_RESERVE_BYTES) if device_bytes else None
    if room is not None and size > room:
        if cores == 1:
            log.warning("KV cache for %d sequences x %d tokens (%.1f GiB) does not fit this GPU (%.0f GiB): "
                        "using %.0f%% of it instead; fewer pages run at once (lower MAX_NUM_SEQS or "
                        "EXPECTED_TOKENS to choose)", seqs, expected_tokens, size / 2**30, device_bytes / 2**30,
                        DEVICE_FRACTION * 100)
            return {**args, "gpu_memory_utilization": DEVICE_FRACTION}
        least = kv_cache_bytes(config, max_num_seqs=1, expected_tokens=1, max_model_len=args.get("max_model_len"),
                               dtype=dtype)
        if room < least:
            from ...config import SettingsError

            raise SettingsError(f"{cores} engine cores do not fit this GPU ({device_bytes / 2**30:.0f} GiB): each "
                                f"needs {(least + NON_KV_RESERVE_BYTES) / 2**30:.1f} GiB at least; lower "
                                "ENGINES_PER_GPU (or MAX_MODEL_LEN)")
        log.warning("KV cache for %d sequences x %d tokens (%.1f GiB) per core does not fit %d cores on this GPU "
                    "(%.0f GiB): %.1f GiB each; fewer pages run at once on each", seqs, expected_tokens,
                    size / 2**30, cores, device_bytes / 2**30, room / 2**30)
        size = int(room)
    log.info("KV cache sized from the workload: %d sequences x %d tokens (%s) -> %.2f GiB%s", seqs, expected_tokens,
             dtype, size / 2**30, f" for each of {cores} engine cores" if cores > 1 else "")
    return _fraction_for_given_size({**args, "kv_cache_memory_bytes": size}, device_bytes)


def _fraction_for_given_size(args: dict[str, Any], device_bytes: int | None) -> dict[str, Any]:
    """With a KV cache size and no fraction: the fraction vLLM's start check asks to be free, from this
    core's footprint (cache + NON_KV_RESERVE_BYTES), instead of vLLM's default 0.9, which a second engine on
    the GPU can never have free."""
    if "gpu_memory_utilization" in args or "kv_cache_memory_bytes" not in args or not device_bytes:
        return args
    footprint = args["kv_cache_memory_bytes"] + NON_KV_RESERVE_BYTES
    return {**args, "gpu_memory_utilization": min(DEVICE_FRACTION, math.ceil(100 * footprint / device_bytes) / 100)}
