"""The engine as the service drives it: engine requests built from a prepared call, and each one's
stream watched by the progress board (the stall watchdog) and the loop guard.

Closing a stream from here (client gone, deadline, error) closes the engine's stream and aborts the
engine's work for that request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace

from ..engines.base import Engine
from ..errors import InvalidRequest
from ..hunyuan import versions
from ..observability.logs import record_first
from ..types import EngineChunk, EngineRequest, FinishReason, PageImage, Prepared, SamplingParams
from . import postprocess
from .progress import ProgressBoard


class EngineRun:
    def __init__(self, engine: Engine, progress: ProgressBoard, *, loop_guard: bool, default_max_tokens: int) -> None:
        self.engine = engine
        self.progress = progress
        self.loop_guard = loop_guard
        self.default_max_tokens = default_max_tokens

    def sampling(self, sampling: SamplingParams) -> SamplingParams:
        """The request's sampling with what it leaves open filled in: hyocr's max_tokens, then the
        checkpoint's decoding defaults (generation_config.json), as vLLM's own server applies them."""
        filled = {key: value for key, value in self.engine.info.defaults.items() if getattr(sampling, key) is None}
        if sampling.max_tokens is None:
            filled["max_tokens"] = self.default_max_tokens
        if sampling.min_tokens and sampling.min_tokens > filled.get("max_tokens", sampling.max_tokens):
            raise InvalidRequest("min_tokens must not exceed max_tokens", param="min_tokens")
        return replace(sampling, **filled) if filled else sampling

    def request(self, prep: Prepared, images: tuple[PageImage, ...], suffix: str = "") -> EngineRequest:
        call = prep.call
        return EngineRequest(
            request_id=prep.request_id + suffix,
            task=prep.task,
            prompt=prep.prompt,
            images=images,
            system=call.system,
            sampling=self.sampling(call.sampling),
            adapter=call.model if call.model in self.engine.info.adapters else None,
            priority=call.priority,
        )

    async def stream(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        """The engine's stream for ``request`` under the loop guard (a repeating tail ends it with
        ``repetition``) and the progress board (a stall fails it with a retryable 503)."""
        wanted = self.loop_guard if request.sampling.loop_guard is None else request.sampling.loop_guard
        rules = versions.of(self.engine.info.version)
        guard = (postprocess.LoopGuard(min_repeats=rules.guard_min_repeats, max_unit=rules.guard_max_unit)
                 if wanted and self.engine.info.follows_prompts else None)
        started = time.perf_counter()
        watch = self.progress.enter(request.request_id, self.engine.expected_seconds(request), request.priority)
        stream = self.engine.generate(request)
        try:
            while True:
                self.progress.wait(watch)
                try:
                    chunk = await anext(stream)
                except StopAsyncIteration:
                    break
                except asyncio.CancelledError:
                    if (failure := self.progress.failure_for(watch)) is None:
                        raise
                    raise failure from None
                self.progress.got(watch)
                if chunk.text or chunk.blocks:
                    record_first(ttft_s=time.perf_counter() - started)
                if guard is not None and chunk.text and guard.feed(chunk.text):
                    yield replace(chunk, finish_reason=None)
                    yield EngineChunk(
                        finish_reason=FinishReason.REPETITION,
                        prompt_tokens=chunk.prompt_tokens,
                        completion_tokens=chunk.completion_tokens,
                    )
                    return
                yield chunk
        finally:
            self.progress.leave(watch)
            await stream.aclose()
            await self.engine.abort(request.request_id)
