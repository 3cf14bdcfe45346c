"""HunyuanOCR's image processor for the vLLM engine in worker processes (``PREPROCESS=processes``).

Each worker builds vLLM's own renderer from the engine's config (same tokenizer, processor and limits)
and turns a prompt with its image into an ``EngineInput`` (token ids, pixel tensors, placeholders),
which comes back pickled and goes to ``AsyncLLM.generate`` as it is. The work then holds no GIL of the
API process: measured on the H200 machine's CPU, 8 processes turn 193 cards/s into model inputs where 8
threads manage 114 (benchmarks/NOTES.md). The price: a process per worker (the model's tokenizer and
processor in each, ~0.5 GB) and the pixel tensors crossing a pipe (7.5 MB a card).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import secrets
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from ...errors import ServiceUnavailable
from . import compat

log = logging.getLogger(__name__)
_renderer: Any = None  # in a worker: vLLM's renderer for the engine's config


def _start_worker(vllm_config: Any, fast_pixels: bool = False, uint8: bool = False) -> None:
    global _renderer
    if fast_pixels:  # the image processor's fast path, as in the API process (pixels.py)
        from . import pixels

        pixels.install(uint8=uint8)

    _renderer = compat.make_renderer(vllm_config)
    # With the processor cache and prefix caching off (hyocr's defaults), vLLM names each image
    # "renderer<rank>-mm-<counter>-image-<i>" and the engine's encoder cache goes by that name: every
    # worker counting from 1 under rank 0 would hand the engine two different images with one name (seen:
    # a card given a warm-up image's embeddings). A name of its own per worker keeps them apart.
    compat.set_renderer_rank(_renderer, f"{os.getpid()}-{secrets.token_hex(4)}")


def _render(prompt: dict[str, Any]) -> Any:
    return compat.render(_renderer, prompt)


def _ready() -> bool:
    return _renderer is not None


class ProcessRenderer:
    def __init__(self, vllm_config: Any, workers: int, fast_pixels: bool = False, *, uint8: bool = False) -> None:
        self.vllm_config = vllm_config
        self.workers = workers
        self.fast_pixels = fast_pixels
        self.uint8 = uint8  # patches as bytes (the engine process normalises them: vision.py)
        self.pool = self._pool()

    def _pool(self) -> ProcessPoolExecutor:
        # spawn: a fork of a process holding CUDA, threads and an event loop is not safe.
        return ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_start_worker,
                                   initargs=(self.vllm_config, self.fast_pixels, self.uint8))

    def start(self) -> None:
        """Start every worker now (each imports vLLM and loads the tokenizer: seconds), not on the first
        requests."""
        for started in [self.pool.submit(_ready) for _ in range(self.workers)]:
            started.result()

    async def render(self, prompt: dict[str, Any]) -> Any:
        """The prompt's EngineInput. A worker that died (killed, out of memory) breaks the whole pool: it
        is replaced and the request tried once more on the new one before the client gets a 503."""
        loop = asyncio.get_running_loop()
        for attempt in (1, 2):
            pool = self.pool
            try:
                return await loop.run_in_executor(pool, _render, prompt)
            except BrokenProcessPool as exc:
                if pool is self.pool:  # the first request to notice replaces it
                    log.error("a preprocessing worker died; starting new workers")
                    self.pool = self._pool()
                    pool.shutdown(wait=False, cancel_futures=True)
                if attempt == 2:
                    raise ServiceUnavailable("image preprocessing failed; retry", code="preprocess_failed") from exc
        raise AssertionError("unreachable")

    def pids(self) -> list[int]:
        return list(self.pool._processes or {})

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
