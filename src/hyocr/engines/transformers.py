"""``--engine transformers``: HunyuanOCR with plain PyTorch ``generate()`` (extra ``hf``).

The debugging path and the baseline the vLLM engine is measured against. One worker thread owns the
model; requests that arrive together (up to ``max_batch_size`` within ``batch_wait_ms``, with the same
sampling settings) are generated together in one static batch, left-padded. Tokens are streamed and
rows stopped (end of sequence, their own max_tokens, or cancellation) from a stopping criterion that
runs after every step, so the event loop never blocks and an abandoned request stops consuming the
batch at the next token.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..config import SettingsError
from ..errors import InvalidRequest, ServiceUnavailable, engine_failure
from ..hunyuan.chat import sampling_defaults
from ..hunyuan.geometry import PixelBounds, fit_image
from ..types import EngineChunk, EngineRequest, FinishReason, SamplingParams
from .base import Engine, EngineInfo
from .registry import ALL_TASKS

if TYPE_CHECKING:
    from ..config import Settings

log = logging.getLogger(__name__)
_STOP = object()


@dataclass(eq=False)
class _Job:
    request: EngineRequest
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue
    cancelled: threading.Event = field(default_factory=threading.Event)
    sampling: SamplingParams = field(init=False)

    def __post_init__(self) -> None:
        self.sampling = sampling_defaults(self.request.sampling)

    def batch_key(self) -> tuple:
        """Requests share a batch only when one GenerationConfig serves them all."""
        s = self.sampling
        return (s.temperature or 0.0, s.top_p, s.top_k, s.repetition_penalty, s.seed, s.ignore_eos, s.min_tokens)

    def emit(self, item: object) -> None:
        self.loop.call_soon_threadsafe(self.out.put_nowait, item)


class IncrementalDecoder:
    """Token ids -> text deltas without re-decoding the whole output each step, and without
    emitting half a multi-byte character (the vLLM detokenizer's prefix/read offsets)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix = 0
        self.read = 0

    def add(self, token: int) -> None:
        self.ids.append(token)

    def flush(self) -> str:
        """Text of the tokens added since the last flush that can be shown now."""
        if self.read == len(self.ids):
            return ""
        decode = self.tokenizer.decode
        prefix_text = decode(self.ids[self.prefix : self.read], skip_special_tokens=True)
        new_text = decode(self.ids[self.prefix :], skip_special_tokens=True)
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return new_text[len(prefix_text) :]
        return ""


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
        served_model_name: str | None = None,
        max_images: int = 8,
        bounds: PixelBounds = PixelBounds(),
    ) -> None:
        self.model_id = model
        self.revision = revision
        self.subfolder = subfolder
        self.dtype_name = dtype
        self.device_name = device
        self.trust_remote_code = trust_remote_code
        self.max_batch_size = max_batch_size
        self.max_model_len = max_model_len
        self.batch_wait = batch_wait_ms / 1000
        self.bounds = bounds
        self.info = EngineInfo(
            name="transformers",
            model=served_model_name or model,
            tasks=ALL_TASKS,
            follows_prompts=True,
            max_images=max_images,
            details={"path": model, "revision": revision or "main", "subfolder": subfolder or ""},
        )
        self._jobs: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._loaded = False
        self.cancelled_rows = 0  # rows dropped mid-generation because their client went away
        self.model: Any = None
        self.processor: Any = None

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
            served_model_name=settings.served_model_name,
            max_images=settings.max_images_per_request,
            bounds=PixelBounds(settings.min_pixels, settings.max_pixels),
        )

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        started = time.perf_counter()
        await asyncio.to_thread(self._load)
        self._thread = threading.Thread(target=self._worker, name="transformers-engine", daemon=True)
        self._thread.start()
        log.info(
            "transformers engine loaded %s (revision %s, subfolder %s) on %s/%s in %.1fs",
            self.model_id, self.revision or "main", self.subfolder or "-", self.device, self.dtype,
            time.perf_counter() - started,
        )

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
        self.processor = load_processor(self.model_id, **kwargs)
        self.processor.tokenizer.padding_side = "left"
        self.model = AutoModelForImageTextToText.from_pretrained(self.model_id, dtype=self.dtype, **kwargs)
        self.model.to(self.device).eval()
        config = self.model.generation_config
        eos = config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self.pad_id = self.processor.tokenizer.pad_token_id
        text_config = getattr(self.model.config, "text_config", self.model.config)
        self.max_model_len = self.max_model_len or getattr(text_config, "max_position_embeddings", None)
        self._loaded = True

    async def stop(self) -> None:
        if self._thread is not None:
            self._jobs.put(_STOP)
            await asyncio.to_thread(self._thread.join, 30)
            self._thread = None
        self._loaded = False

    async def ready(self) -> bool:
        return self._loaded and self._thread is not None and self._thread.is_alive()

    # ------------------------------------------------------------------ requests

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        if not await self.ready():
            raise ServiceUnavailable("the transformers engine is not running", code="engine_dead")
        job = _Job(request, asyncio.get_running_loop(), asyncio.Queue())
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
                job.cancelled.set()  # the worker drops the row at its next step

    async def abort(self, request_id: str) -> None:
        """Cancellation happens when the request's stream is closed (see ``generate``)."""

    # ------------------------------------------------------------------ worker thread

    def _worker(self) -> None:
        pending: list[_Job] = []
        while True:
            job = pending.pop(0) if pending else self._jobs.get()
            if job is _STOP:
                return
            batch, deadline = [job], time.monotonic() + self.batch_wait
            while len(batch) < self.max_batch_size:
                try:
                    nxt = self._jobs.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if nxt is _STOP:
                    self._jobs.put(_STOP)
                    break
                (batch if nxt.batch_key() == job.batch_key() else pending).append(nxt)
            batch = [j for j in batch if not j.cancelled.is_set()]
            if not batch:
                continue
            try:
                self._run_batch(batch)
            except Exception as exc:  # one bad batch must not kill the worker
                log.exception("transformers batch of %d failed", len(batch))
                error = engine_failure(exc, "generation failed")
                for j in batch:
                    j.emit(error)

    def _encode(self, batch: list[_Job]) -> Any:
        texts, images = [], []
        for job in batch:
            req = job.request
            content: list[dict] = [{"type": "image"} for _ in req.images]
            content.append({"type": "text", "text": req.prompt})
            messages = [{"role": "system", "content": req.system}, {"role": "user", "content": content}]
            texts.append(self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
            images += [fit_image(p, self.bounds) for p in req.images]
        return self.processor(text=texts, images=images or None, padding=True, return_tensors="pt")

    def _run_batch(self, batch: list[_Job]) -> None:
        import torch
        from transformers import StoppingCriteriaList

        inputs = self._encode(batch)
        prompt_tokens = inputs["attention_mask"].sum(dim=1).tolist()
        if self.max_model_len and max(prompt_tokens) > self.max_model_len:
            fits = [j for j, n in zip(batch, prompt_tokens, strict=True) if n <= self.max_model_len]
            for job, n in zip(batch, prompt_tokens, strict=True):
                if n > self.max_model_len:
                    job.emit(InvalidRequest(
                        f"the prompt is {n} tokens; this model's context is {self.max_model_len}", param="messages"
                    ))
            if not fits:
                return
            batch = fits
            inputs = self._encode(batch)
            prompt_tokens = inputs["attention_mask"].sum(dim=1).tolist()
        inputs = inputs.to(self.device)
        s = batch[0].sampling
        rows = _Rows(batch, self.processor.tokenizer, self.eos_ids, [int(n) for n in prompt_tokens])
        gen: dict[str, Any] = {
            "max_new_tokens": max(j.sampling.max_tokens or 4096 for j in batch),
            "do_sample": bool(s.temperature),
            "stopping_criteria": StoppingCriteriaList([rows]),
            "pad_token_id": self.pad_id,
        }
        if s.temperature:
            gen.update(temperature=s.temperature, top_p=s.top_p or 1.0, top_k=s.top_k if s.top_k and s.top_k > 0 else 0)
            if s.seed is not None:
                torch.manual_seed(s.seed)
        else:
            gen.update(temperature=None, top_p=None, top_k=None)
        if s.repetition_penalty:
            gen["repetition_penalty"] = s.repetition_penalty
        if s.ignore_eos or s.min_tokens:
            # EOS is suppressed until min_new_tokens; each row still stops at its own max_tokens.
            gen["min_new_tokens"] = gen["max_new_tokens"] if s.ignore_eos else s.min_tokens
        with torch.inference_mode():
            self.model.generate(**inputs, **gen)
        rows.finish_all()
        self.cancelled_rows += rows.cancelled


class _Rows:
    """Stopping criterion that also streams: after each step it reads every row's new token,
    sends the text delta to that row's request, and marks rows done (EOS, own max_tokens, cancelled)."""

    def __init__(self, jobs: list[_Job], tokenizer: Any, eos_ids: set[int], prompt_tokens: list[int]) -> None:
        import torch

        self.jobs = jobs
        self.decoders = [IncrementalDecoder(tokenizer) for _ in jobs]
        self.eos_ids = eos_ids
        self.prompt_tokens = prompt_tokens
        self.counts = [0] * len(jobs)
        self.cancelled = 0
        self.done = [False] * len(jobs)
        self._done_tensor = None  # rebuilt only when a row finishes (saves a host-to-device copy a step)
        # Decoding is the per-step Python cost that grows with the batch: a lone request streams every
        # token, a batch decodes every few steps (the stream is as fast, in slightly bigger pieces).
        self.stream_every = 1 if len(jobs) <= 2 else 4
        self.steps = 0
        self._torch = torch

    def __call__(self, input_ids, scores, **kwargs):
        last = input_ids[:, -1].tolist()
        self.steps += 1
        flush = self.steps % self.stream_every == 0
        changed = self._done_tensor is None
        for i, job in enumerate(self.jobs):
            if self.done[i]:
                continue
            if job.cancelled.is_set():
                self.done[i] = changed = True
                self.cancelled += 1
                continue
            token = last[i]
            if token in self.eos_ids:
                self._finish(i, FinishReason.STOP)
                changed = True
                continue
            self.counts[i] += 1
            self.decoders[i].add(token)
            if self.counts[i] >= (job.sampling.max_tokens or 4096):
                self._finish(i, FinishReason.LENGTH)
                changed = True
            elif flush:
                self._emit_text(i)
        if changed:
            self._done_tensor = self._torch.tensor(self.done, device=input_ids.device)
        return self._done_tensor

    def _emit_text(self, i: int) -> None:
        text = self.decoders[i].flush()
        if text:
            self.jobs[i].emit(
                EngineChunk(text=text, prompt_tokens=self.prompt_tokens[i], completion_tokens=self.counts[i])
            )

    def _finish(self, i: int, reason: FinishReason) -> None:
        self._emit_text(i)
        self.done[i] = True
        self.jobs[i].emit(
            EngineChunk(finish_reason=reason, prompt_tokens=self.prompt_tokens[i], completion_tokens=self.counts[i])
        )

    def finish_all(self) -> None:
        """Rows still open when generate() returned ran into the batch's token cap."""
        for i in range(len(self.jobs)):
            if not self.done[i]:
                self._finish(i, FinishReason.LENGTH)


def load_processor(model: str, **kwargs: Any) -> Any:
    """HunyuanOCR's processor. transformers declares both image processors as needing torchvision,
    although the PIL one does not use it; without torchvision (CPU machines), build the processor
    from the PIL image processor and the tokenizer directly."""
    from transformers import AutoProcessor

    try:
        return AutoProcessor.from_pretrained(model, **kwargs)
    except (ImportError, ValueError) as exc:
        # Also when the checkpoint ships custom image-processor code and remote code is not
        # trusted: the official classes below execute nothing from the checkpoint.
        if "torchvision" not in str(exc).lower() and "trust_remote_code" not in str(exc):
            raise
        from transformers import AutoTokenizer
        from transformers.models.hunyuan_vl.image_processing_pil_hunyuan_vl import HunYuanVLImageProcessorPil
        from transformers.models.hunyuan_vl.processing_hunyuan_vl import HunYuanVLProcessor

        log.info("using HunyuanOCR's PIL image processor (%s)", type(exc).__name__)
        kwargs.pop("trust_remote_code", None)
        image_processor = HunYuanVLImageProcessorPil.from_pretrained(model, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(model, **kwargs)
        return HunYuanVLProcessor(image_processor=image_processor, tokenizer=tokenizer)
