"""``--engine transformers``: HunyuanOCR on plain PyTorch/transformers (extra ``hf``), continuously batched.

The engine for machines without vLLM (ROCm, Apple, older CUDA), the debugging path, and the PyTorch
baseline. Prompts are encoded (template, image processor, rotary positions) on an encoder thread as
requests arrive; one model thread owns the model and the running batch (batch.py). Between two decode
steps it admits what is waiting (online requests before background ones, up to ``max_batch_size`` rows and
``max_prefill_tokens`` prompt tokens a join), decodes one token for every row, streams text, and drops rows
that finished (end of sequence, a stop string, their own max_tokens, the context), whose own sampling failed
(rows.choose_tokens: that request alone gets the error) or whose caller went away.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from ...config import SettingsError
from ...errors import InvalidRequest, ServiceUnavailable, engine_failure
from ...hunyuan import versions
from ...hunyuan.geometry import PixelBounds
from ...types import EngineChunk, EngineRequest
from .. import grammar
from ..base import Engine, EngineInfo
from ..capabilities import check_structured
from ..registry import ALL_TASKS
from .batch import RunningBatch
from .prompts import encode, load_processor
from .rows import Job, Row, choose_tokens

if TYPE_CHECKING:
    from ...config import Settings

log = logging.getLogger(__name__)
_STOP = object()


@dataclass
class StepTimes:
    """Where the model thread's time goes (seconds include the GPU: choosing tokens waits for it)."""

    prefills: int = 0
    prefill_s: float = 0.0
    steps: int = 0
    step_s: float = 0.0
    rows_stepped: int = 0  # sum over steps of the rows decoded: / steps = the mean batch

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "mean_rows": round(self.rows_stepped / self.steps, 2) if self.steps else 0.0}


JOIN_STEPS = 8  # decode steps a newcomer may wait for others to join with (one prefill for the group)


class TransformersEngine(Engine):
    def __init__(
        self,
        model: str,
        *,
        revision: str | None = None,
        subfolder: str | None = None,
        dtype: str = "auto",
        device: str = "auto",
        trust_remote_code: bool = False,
        max_batch_size: int = 32,
        max_model_len: int | None = None,
        batch_wait_ms: float = 10.0,
        max_prefill_tokens: int = 16384,
        fast_pixels: bool = True,
        served_model_name: str | None = None,
        max_images: int = 8,
        bounds: PixelBounds = PixelBounds(),
        model_version: str = "auto",
    ) -> None:
        self.model_id = model
        self.model_version = model_version
        self.revision = revision
        self.subfolder = subfolder
        self.dtype_name = dtype
        self.device_name = device
        self.trust_remote_code = trust_remote_code
        self.max_batch_size = max_batch_size
        self.max_model_len = max_model_len
        self.batch_wait = batch_wait_ms / 1000
        self.max_prefill_tokens = max_prefill_tokens
        self.fast_pixels = fast_pixels
        self.bounds = bounds
        self.info = EngineInfo(
            name="transformers",
            model=served_model_name or model,
            tasks=ALL_TASKS,
            follows_prompts=True,
            max_images=max_images,
            structured=grammar.available(),
            details={"path": model, "revision": revision or "main", "subfolder": subfolder or "",
                     "batching": f"continuous, up to {max_batch_size} rows"},
        )
        self._jobs: queue.Queue = queue.Queue()
        self._waiting: list[Job] = []  # taken from the queue, not yet admitted (model thread only)
        self._thread: threading.Thread | None = None
        self._encoder: ThreadPoolExecutor | None = None
        self._loaded = False
        self.cancelled_rows = 0  # rows dropped mid-generation because their client went away
        self.joined_running = 0  # requests admitted while other rows were mid-generation
        self.times = StepTimes()
        self.model: Any = None
        self.processor: Any = None
        self.grammars: grammar.Grammars | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> TransformersEngine:
        if not settings.model:
            raise SettingsError("--engine transformers needs --model (a hub id such as tencent/HunyuanOCR, or a path)")
        return cls(
            settings.model,
            revision=settings.revision,
            subfolder=settings.subfolder,
            dtype=settings.dtype,
            device=settings.device,
            trust_remote_code=settings.trust_remote_code,
            max_batch_size=settings.max_num_seqs,
            max_model_len=settings.max_model_len,
            batch_wait_ms=settings.batch_wait_ms,
            max_prefill_tokens=settings.max_num_batched_tokens or 16384,
            fast_pixels=settings.fast_pixels,
            served_model_name=settings.served_model_name,
            max_images=settings.max_images_per_request,
            bounds=PixelBounds(settings.min_pixels, settings.max_pixels),
            model_version=settings.model_version,
        )

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        started = time.perf_counter()
        await asyncio.to_thread(self._load)
        # One encoder thread: the processor's tokenizer is not safe to share between threads.
        self._encoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="transformers-encode")
        self._thread = threading.Thread(target=self._worker, name="transformers-engine", daemon=True)
        self._thread.start()
        log.info(
            "transformers engine loaded %s (revision %s, subfolder %s) on %s/%s in %.1fs",
            self.model_id, self.revision or "main", self.subfolder or "-", self.device, self.dtype,
            time.perf_counter() - started,
        )
        if self.grammars is not None:  # a failure turns structured outputs off (/v1/models says why), no more
            await check_structured(self)

    def _load(self) -> None:
        import torch
        from transformers import AutoModelForImageTextToText

        self.device = self.device_name if self.device_name != "auto" else (
            "cuda" if torch.cuda.is_available() else "cpu"
        )
        if self.dtype_name == "auto":
            self.dtype = torch.bfloat16 if self.device.startswith("cuda") else torch.float32
        else:
            self.dtype = getattr(torch, self.dtype_name)
        kwargs = {"revision": self.revision, "trust_remote_code": self.trust_remote_code}
        if self.subfolder:
            kwargs["subfolder"] = self.subfolder
        if self.fast_pixels:  # HunyuanOCR's image processor, bit-identical, for a fraction of the CPU
            from ..vllm import pixels

            pixels.install()
        # The PIL image processor (what vLLM runs for HunyuanOCR, and what the fast path replaces)
        self.processor = load_processor(self.model_id, **kwargs, **({"backend": "pil"} if self.fast_pixels else {}))
        self.model = AutoModelForImageTextToText.from_pretrained(self.model_id, dtype=self.dtype, **kwargs)
        self.model.to(self.device).eval()
        config = self.model.generation_config
        eos = config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        text_config = getattr(self.model.config, "text_config", self.model.config)
        self.max_model_len = self.max_model_len or getattr(text_config, "max_position_embeddings", None)
        self._apply_checkpoint()
        if grammar.available():  # not info.structured: a failed check turned that off, and a restart checks again
            self.grammars = grammar.Grammars(self.processor.tokenizer, text_config.vocab_size,
                                             stop_token_ids=self.eos_ids)
        self._loaded = True

    def _apply_checkpoint(self) -> None:
        """The loaded checkpoint's version, decoding defaults and image bounds (hunyuan/versions.py)."""
        image = getattr(self.processor, "image_processor", None)
        size = getattr(image, "size", None) or {}  # transformers 5 keeps the bounds as size's edges
        size = size if isinstance(size, dict) else {}
        processor = {"min_pixels": getattr(image, "min_pixels", None) or size.get("shortest_edge"),
                     "max_pixels": getattr(image, "max_pixels", None) or size.get("longest_edge")}
        facts = versions.CheckpointFacts(
            version=versions.detect(self.model.config.to_dict(), processor, self.model_version),
            context=self.max_model_len,
            min_pixels=processor["min_pixels"], max_pixels=processor["max_pixels"],
            defaults=versions.generation_defaults(self.model.generation_config.to_diff_dict()),
        )
        low, high = versions.checkpoint_bounds(facts, self.bounds.min_pixels, self.bounds.max_pixels)
        self.bounds = PixelBounds(low, high)
        self.info = replace(self.info, version=facts.version.name, defaults=facts.defaults,
                            tasks=versions.tasks(facts.version, ALL_TASKS),
                            details={**self.info.details, "model_version": facts.version.name})

    async def stop(self) -> None:
        if self._thread is not None:
            self._jobs.put(_STOP)
            await asyncio.to_thread(self._thread.join, 30)
            self._thread = None
        if self._encoder is not None:
            self._encoder.shutdown(wait=False, cancel_futures=True)
            self._encoder = None
        self._loaded = False

    async def ready(self) -> bool:
        return self._loaded and self._thread is not None and self._thread.is_alive()

    # ------------------------------------------------------------------ requests

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        if not await self.ready() or self._encoder is None:
            raise ServiceUnavailable("the transformers engine is not running", code="engine_dead")
        loop = asyncio.get_running_loop()
        try:
            prompt = await loop.run_in_executor(self._encoder, encode, request, self.processor, self.model, self.bounds)
        except Exception as exc:  # a JSON error, never a stack trace
            if self._encoder is None:  # stop() shut the encoder down under this request
                raise ServiceUnavailable("the transformers engine is stopping", code="engine_dead") from exc
            raise engine_failure(exc, "could not prepare the prompt") from exc
        if self.max_model_len and prompt.length >= self.max_model_len:
            raise InvalidRequest(
                f"the prompt is {prompt.length} tokens; this model's context is {self.max_model_len}", param="messages"
            )
        job = Job(request, prompt, loop, asyncio.Queue())
        if request.sampling.structured is not None and self.grammars is not None:
            job.matcher = await self.grammars.amatcher(request.sampling.structured)
        self._jobs.put(job)
        finished = False
        try:
            while True:
                item = await job.out.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finish_reason is not None:
                    finished = True
                    return
        finally:
            if not finished:
                job.cancelled.set()  # the model thread drops the row at its next step

    async def abort(self, request_id: str) -> None:
        """Cancellation happens when the request's stream is closed (see ``generate``)."""

    # ------------------------------------------------------------------ model thread

    def _worker(self) -> None:
        import torch

        # Thread-local, so here and not around start(): without it every step's activations stay alive
        # through the cache (autograd), and memory and step time grow with every token.
        with torch.inference_mode():
            self._serve()

    def _serve(self) -> None:
        batch = RunningBatch(self.model, self.device)
        batch.set_eos(self.eos_ids)
        stopping = False
        while True:
            stopping = self._collect(block=not batch.rows and not stopping) or stopping
            if stopping and self._waiting:
                for job in self._waiting:
                    job.emit(ServiceUnavailable("the engine is stopping", code="engine_dead"))
                self._waiting.clear()
            if stopping and not batch.rows:
                return
            try:
                self._admit(batch)
                if batch.rows:
                    self._step(batch)
            except Exception as exc:  # one failed step fails its rows, never the thread
                log.exception("transformers step over %d rows failed", len(batch))
                error = engine_failure(exc, "generation failed")
                for row in batch.rows:
                    row.job.emit(error)
                batch.clear()

    def _collect(self, block: bool) -> bool:
        """Move queued jobs to ``_waiting``; True once stop was asked. When idle, wait for a first job and
        then ``batch_wait`` for the ones arriving with it, so that a burst is prefilled together."""
        deadline = None
        while True:
            try:
                if block and not self._waiting:
                    item = self._jobs.get()
                elif block and deadline is None:
                    deadline = time.monotonic() + self.batch_wait
                    continue
                elif block:
                    item = self._jobs.get(timeout=max(0.0, deadline - time.monotonic()))
                else:
                    item = self._jobs.get_nowait()
            except queue.Empty:
                return False
            if item is _STOP:
                return True
            self._waiting.append(item)

    def _admit(self, batch: RunningBatch) -> None:
        waiting = [j for j in self._waiting if not j.cancelled.is_set()]
        waiting.sort(key=lambda j: j.request.priority)  # stable: online first, each class in arrival order
        room, budget, group = self.max_batch_size - len(batch), self.max_prefill_tokens, []
        # A join is one more forward pass that every running row waits for: while rows decode, let
        # newcomers gather into a group of a quarter of the batch, unless one has waited JOIN_STEPS steps.
        for job in waiting:
            job.waited_steps += 1
        if batch.rows and waiting and len(waiting) < min(room, len(batch) // 4) and (
            max(j.waited_steps for j in waiting) < JOIN_STEPS
        ):
            self._waiting = waiting
            return
        while waiting and len(group) < room and (not group or waiting[0].prompt.length <= budget):
            budget -= waiting[0].prompt.length
            group.append(waiting.pop(0))
        self._waiting = waiting
        if not group:
            return
        rows = [Row(j, self.processor.tokenizer, self.eos_ids, self.max_model_len, self.device) for j in group]
        if batch.rows:
            self.joined_running += len(rows)
        start, began = len(batch), time.perf_counter()
        try:
            logits = batch.prefill(rows, [j.prompt for j in group])
        except Exception as exc:  # the running rows are untouched: fail only the newcomers
            log.exception("transformers prefill of %d requests failed", len(group))
            error = engine_failure(exc, "generation failed")
            for job in group:
                job.emit(error)
            return
        tokens = choose_tokens(logits, rows, **batch.choice_inputs(start))
        self.times.prefills += 1
        self.times.prefill_s += time.perf_counter() - began
        batch.set_last(tokens, start)
        for row, token in zip(rows, tokens, strict=True):
            row.accept(token, stream=len(batch) <= 2)
        self._drop_finished(batch)

    def _step(self, batch: RunningBatch) -> None:
        began = time.perf_counter()
        logits = batch.step()
        tokens = choose_tokens(logits, batch.rows, **batch.choice_inputs())
        self.times.steps += 1
        self.times.step_s += time.perf_counter() - began
        self.times.rows_stepped += len(batch)
        batch.set_last(tokens)
        # Decoding text is the per-step Python cost that grows with the batch: a lone request streams every
        # token, a batch every few steps (as fast, in slightly bigger pieces).
        stream = len(batch) <= 2 or self.times.steps % 4 == 0
        for row, token in zip(batch.rows, tokens, strict=True):  # finished rows left at the last step
            row.accept(token, stream)
        self._drop_finished(batch)

    def _drop_finished(self, batch: RunningBatch) -> None:
        keep = []
        for i, row in enumerate(batch.rows):
            if row.cancelled and not row.done:
                row.done = True
                self.cancelled_rows += 1
            if not row.done:
                keep.append(i)
        batch.keep(keep)

