"""A deterministic, scriptable engine for testing the serving layer. It does no OCR.

It behaves like a vision-language model: it follows every task and streams "tokens" (words) in
HunyuanOCR's output formats, so the post-processing and streaming paths run for real.

Script it per process with the model string (``--engine fake --model "latency=0.2,token_delay=0.01"``)
or per request with directives in the prompt text:

    [[fake:fail]]       raise an engine error before the first token
    [[fake:fail_mid]]   raise after the first token
    [[fake:hang]]       never answer (until cancelled)
    [[fake:hang_mid]]   go silent after the first token (until cancelled)
    [[fake:loop]]       produce a repeating tail (for the loop guard)
    [[fake:delay=0.5]]  wait this long before the first token
    [[fake:busy=5]]     work this long on a worker thread first, deaf to cancellation (a CPU engine's
                        inference in ONNX Runtime)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

from ..config import SettingsError
from ..errors import EngineError
from ..types import EngineChunk, EngineRequest, FinishReason, Task
from .base import Engine, EngineInfo
from .registry import ALL_TASKS

if TYPE_CHECKING:
    from ..config import Settings

_DIRECTIVE = re.compile(r"\[\[fake:(\w+)(?:=([\d.]+))?\]\]")


@dataclass(frozen=True, slots=True)
class FakeScript:
    latency: float = 0.0  # seconds before the first token
    start_delay: float = 0.0  # seconds start() takes (a model that loads or compiles)
    token_delay: float = 0.0  # seconds between tokens
    fail: bool = False
    fail_mid: bool = False
    hang: bool = False
    hang_mid: bool = False
    loop: bool = False
    busy: float = 0.0  # seconds of uninterruptible work on a worker thread before the first token
    image_tokens: int = 64  # prompt tokens charged per image

    @classmethod
    def parse(cls, spec: str | None) -> FakeScript:
        """``"latency=0.1,token_delay=0.01,fail"`` -> FakeScript."""
        script = cls()
        names = {f.name: f.type for f in fields(cls)}
        for item in filter(None, (s.strip() for s in (spec or "").split(","))):
            key, _, value = item.partition("=")
            if key not in names:
                raise SettingsError(f"fake engine: unknown option {key!r}; known: {', '.join(names)}")
            try:
                parsed: object = (
                    value.lower() in ("", "1", "true", "yes")
                    if names[key] == "bool"
                    else (int(value) if names[key] == "int" else float(value))
                )
            except ValueError:
                raise SettingsError(f"fake engine: bad value for {key}: {value!r}") from None
            script = replace(script, **{key: parsed})
        return script


class FakeEngine(Engine):
    def __init__(self, script: FakeScript | None = None, *, model: str = "fake-ocr", structured: bool = True) -> None:
        self.script = script or FakeScript()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        # ``structured``: it takes output constraints (and writes its usual text: a schema of string fields
        # happens to match its extraction output, any other shows how a mismatch is reported)
        self.info = EngineInfo(
            name="fake", model=model, tasks=ALL_TASKS, follows_prompts=True, max_images=8, structured=structured
        )
        self.started = False
        self.crashed = False  # kill(): readiness fails, as a dead engine process would
        self.starts = 0
        self._stopped: asyncio.Event | None = None
        # What happened, for assertions; bounded so a long benchmark run does not grow without limit.
        self.active: set[str] = set()  # request ids being generated now
        self.aborted: deque[str] = deque(maxlen=100_000)  # consumer went away mid-stream
        self.completed: deque[str] = deque(maxlen=100_000)
        self.requests: deque[EngineRequest] = deque(maxlen=64)  # the latest received (they hold images)

    @classmethod
    def from_settings(cls, settings: Settings) -> FakeEngine:
        return cls(FakeScript.parse(settings.model), model=settings.served_model_name or "fake-ocr")

    async def start(self) -> None:
        if self.script.start_delay:
            await asyncio.sleep(self.script.start_delay)
        self.started, self.crashed = True, False
        self.starts += 1
        self._stopped = asyncio.Event()

    def _workers(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="fake-engine")
        return self._pool

    async def stop(self) -> None:
        """In-flight requests fail at once, as they do when a real engine is shut down."""
        self.started = False
        if self._pool is not None:  # as rapidocr's: work under way goes on, unobserved
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        if self._stopped is not None:
            self._stopped.set()

    async def ready(self) -> bool:
        return self.started and not self.crashed

    def kill(self) -> None:
        """Simulate an engine process dying: readiness fails; requests hang until a restart."""
        self.crashed = True

    async def _wait_or_stopped(self, seconds: float | None) -> None:
        stopped = self._stopped or asyncio.Event()
        try:
            await asyncio.wait_for(stopped.wait(), seconds)
        except TimeoutError:
            return
        raise EngineError("the engine was stopped")

    def _script_for(self, prompt: str) -> FakeScript:
        script = self.script
        for name, value in _DIRECTIVE.findall(prompt):
            if name == "delay":
                script = replace(script, latency=float(value or 0))
            elif name == "busy":
                script = replace(script, busy=float(value or 0))
            elif name in ("fail", "fail_mid", "hang", "hang_mid", "loop"):
                script = replace(script, **{name: True})
        return script

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        self.requests.append(request)
        script = self._script_for(request.prompt)
        prompt_tokens = len(request.prompt.split()) + script.image_tokens * len(request.images)
        max_tokens = request.sampling.max_tokens or 4096
        self.active.add(request.request_id)
        done = False
        try:
            if script.latency:
                await self._wait_or_stopped(script.latency)
            if script.busy:  # a non-daemon thread of its own, as an executor's: the interpreter waits for it
                await asyncio.get_running_loop().run_in_executor(self._workers(), time.sleep, script.busy)
            if script.fail:
                raise EngineError("fake engine failure (scripted)")
            if script.hang or self.crashed:
                await self._wait_or_stopped(None)
            words = fake_output(request, loop=script.loop)
            if request.sampling.ignore_eos:  # as a model does: go on to max_tokens (benchmarks)
                words = [words[i % len(words)] for i in range(max_tokens)]
            count = 0
            for count, word in enumerate(words, start=1):
                if count > 1 and script.fail_mid:
                    raise EngineError("fake engine failure mid-stream (scripted)")
                if count > 1 and script.hang_mid:
                    await self._wait_or_stopped(None)
                if script.token_delay:
                    await self._wait_or_stopped(script.token_delay)
                if count > max_tokens:
                    done = True
                    yield EngineChunk(
                        finish_reason=FinishReason.LENGTH,
                        prompt_tokens=prompt_tokens,
                        completion_tokens=count - 1,
                    )
                    return
                yield EngineChunk(text=word, prompt_tokens=prompt_tokens, completion_tokens=count)
            done = True
            yield EngineChunk(
                finish_reason=FinishReason.STOP, prompt_tokens=prompt_tokens, completion_tokens=count
            )
        finally:
            self.active.discard(request.request_id)
            (self.completed if done else self.aborted).append(request.request_id)

    async def abort(self, request_id: str) -> None:
        self.active.discard(request_id)


def fake_output(request: EngineRequest, *, loop: bool = False) -> list[str]:
    """Deterministic output in HunyuanOCR's format for the task, split into word "tokens"."""
    image = request.images[0] if request.images else None
    size = f"{image.width}x{image.height}" if image else "no-image"
    task = request.task
    if loop:
        text = "Total due: 10.00 " + "repeat this " * 400
    elif task is Task.SPOTTING:
        text = "HYOCR FAKE(100,100),(500,200) page " + size + "(100,300),(900,400)"
    elif task is Task.DOCUMENT:
        text = (
            "# Fake document\n\nA paragraph about a " + size + " page.\n\n"
            "<table><tr><td>a</td><td>1</td></tr></table>\n\n$$E = mc^2$$"
        )
    elif task is Task.EXTRACT:
        keys = re.findall(r"'([^']+)'", request.prompt) or ["value"]
        text = "```json\n" + json.dumps({k: f"fake {k}" for k in keys}, ensure_ascii=False) + "\n```"
    else:
        text = f"fake {task.value} output for a {size} image"
    return re.findall(r"\S+\s*|\s+", text)
