"""The chat-completions flow: a prepared call's text, as the OpenAI routes answer it.

A model engine sees all images in one prompt (it may compare them); an engine that takes one image at
a time reads them in order, separated by a blank line. Streamed, the text goes out as the engine writes
it; whole, the answer's looping tail is cut before it is returned.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import replace

from ..hunyuan import versions
from ..observability.logs import record
from ..types import ChatDone, ChatText, EngineChunk, FinishReason, Prepared, Usage
from .engine_run import EngineRun
from .pages import cut_loops


async def chat_text(run: EngineRun, prep: Prepared, *, whole: bool) -> AsyncIterator[ChatText | ChatDone]:
    """``ChatText`` deltas (streamed) or nothing (``whole``), then ``ChatDone``."""
    parts: list[str] = []
    final = EngineChunk(finish_reason=FinishReason.STOP)
    async with contextlib.aclosing(_engine_text(run, prep)) as chunks:
        async for chunk in chunks:
            if chunk.finish_reason is not None:
                final = chunk
            elif whole:
                parts.append(chunk.text)
            else:
                yield ChatText(chunk.text)
    finish = final.finish_reason or FinishReason.STOP
    text = ""
    if whole:
        text, finish = cut_loops("".join(parts), finish, run.engine.info.follows_prompts,
                                 versions.of(run.engine.info.version))
    record(prompt_tokens=final.prompt_tokens, output_tokens=final.completion_tokens, finish_reason=finish.value,
           repetition_stops=int(finish is FinishReason.REPETITION))
    yield ChatDone(finish, final.prompt_tokens, final.completion_tokens, text)


async def _engine_text(run: EngineRun, prep: Prepared) -> AsyncIterator[EngineChunk]:
    """Text deltas for all pages, then one final chunk with the finish reason and the usage summed."""
    if len(prep.pages) <= run.engine.info.max_images:
        groups = [prep.pages]
    else:
        groups = [(p,) for p in prep.pages]
    usage = Usage()
    finish = FinishReason.STOP
    started = time.perf_counter()
    for n, group in enumerate(groups):
        last: EngineChunk | None = None
        first = True
        async with contextlib.aclosing(run.stream(run.request(prep, group, f"-{n}" if n else ""))) as chunks:
            async for chunk in chunks:
                if chunk.text or chunk.blocks:
                    text = chunk.text
                    if first and n:
                        text = "\n\n" + text
                    first = False
                    yield replace(chunk, text=text, finish_reason=None,
                                  prompt_tokens=usage.prompt_tokens + chunk.prompt_tokens,
                                  completion_tokens=usage.completion_tokens + chunk.completion_tokens)
                last = chunk
        if last is not None:
            usage = usage + Usage(last.prompt_tokens, last.completion_tokens)
            finish = last.finish_reason or FinishReason.STOP
        if finish is not FinishReason.STOP:
            break
    record(engine_ms=round((time.perf_counter() - started) * 1000, 2))
    yield EngineChunk(finish_reason=finish, prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens)
