"""Torch's CPU threads in the engine process: one while serving on a GPU.

With one GPU per core (tensor parallel 1), vLLM runs the model inside the engine core's own process
(UniProcExecutor), and vLLM 0.26 leaves torch's intra-op pool there at its default: a thread per physical
core. Each multi-threaded CPU op on the core's hot loop (batching a pass's pixels into pinned memory, the
model runner's input arrays) wakes that pool, whose OpenMP threads then spin-wait, taking CPU from the
step's serial code and from every other engine core and API process on the host: the cores' threads are
the bound with three cores on one GPU (benchmarks/NOTES.md 33). vLLM later set one thread for serving
(``set_torch_threads_for_runtime``, after loading the weights: "no steady-state CPU op benefits from
intra-op parallelism"); this does the same for the versions without it.

Applied on import of hyocr's worker extension (vision.py), before the model is loaded and compiled:
Dynamo's global-state guard includes the thread count, so a change after compilation would fail the
compiled graphs' guards on the first request. Left alone on vLLM's CPU platform (its kernels run on these
threads), where the installed vLLM does it itself, and where the user set ``OMP_NUM_THREADS``.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)
SERVING_THREADS = 1


def vllm_on_gpu() -> bool:
    """vLLM is installed and runs on a CUDA or ROCm GPU here (False on its CPU platform, or without vLLM)."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return False
    return bool(current_platform.is_cuda_alike())


def vllm_sets_threads() -> bool:
    """The installed vLLM sets serving's thread count itself (``set_torch_threads_for_runtime``, after 0.26)."""
    try:
        from vllm.utils import torch_utils
    except ImportError:
        return False
    return hasattr(torch_utils, "set_torch_threads_for_runtime")


def apply(*, on_gpu: bool, vllm_does_it: bool, environ: dict | os._Environ = os.environ) -> str:
    """Set torch's intra-op threads for serving in this (the engine) process; returns what was done."""
    if not on_gpu:
        return "not a GPU platform: torch threads left as they are (vLLM's CPU kernels use them)"
    if vllm_does_it:
        return "the installed vLLM sets serving's torch threads itself"
    if environ.get("OMP_NUM_THREADS"):
        return f"OMP_NUM_THREADS={environ['OMP_NUM_THREADS']} set: torch threads left as they are"
    import torch

    before = torch.get_num_threads()
    if before != SERVING_THREADS:
        torch.set_num_threads(SERVING_THREADS)
        log.info("engine process: torch CPU threads %d -> %d for serving (OMP_NUM_THREADS overrides)",
                 before, SERVING_THREADS)
    return f"torch CPU threads {before} -> {SERVING_THREADS}"
