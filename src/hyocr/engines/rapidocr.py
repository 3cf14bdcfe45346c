"""The embedded default engine: RapidOCR (PP-OCR detection + recognition on ONNX Runtime, CPU).

Its models ship inside the ``rapidocr`` wheel; hyocr passes their paths explicitly so RapidOCR never
takes its download path. It reads text, it does not follow prompts: it serves ``spotting`` and
``text`` only.

A ``RapidOCR`` object mutates its own parameters on every call, so it is not shared between
threads: the engine keeps a pool of instances, one per worker thread, and runs inference on its own
executor so the event loop never blocks and parallelism stays bounded.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PIL import Image

from ..config import SettingsError
from ..errors import EngineError, ServiceUnavailable, UnsupportedTask
from ..pipeline.postprocess import to_spotting_text
from ..types import EngineChunk, EngineRequest, FinishReason, Task, TextBlock
from .base import Engine, EngineInfo
from .registry import OCR_ONLY_TASKS

if TYPE_CHECKING:
    from ..config import Settings

log = logging.getLogger(__name__)
DEFAULT_MODEL = "PP-OCRv6"
# RapidOCR scales an image's short side up to 736 for its detector, with no bound on the long side: a 1x300
# strip (a 100-byte PNG) became a 736x220800 input, minutes of CPU, and a 1x100000 one failed in its resize.
# Narrower images are padded with white to these aspect ratios (after RapidOCR's own cap of the long side).
# Measured on 2 cores: a 1600x40 line of text reads as before in 1.5 s; a tall input costs ~6x more per
# pixel than a wide one (736x17000: 16 s tall, 2.4 s wide), so tall ones are bounded tighter (~4 s).
MAX_WIDE = 24  # width : height
MAX_TALL = 8  # height : width
MAX_SIDE = 2000  # RapidOCR's first resize (Global.max_side_len), done here first for padded images


def bundled_models() -> dict[str, Path]:
    """Paths of the det/cls/rec ONNX models inside the installed rapidocr wheel."""
    import rapidocr

    models_dir = Path(rapidocr.__file__).parent / "models"
    found: dict[str, Path] = {}
    for kind in ("det", "cls", "rec"):
        matches = sorted(models_dir.glob(f"*_{kind}_*.onnx"))
        if not matches:
            raise SettingsError(
                f"rapidocr's bundled {kind} model is missing from {models_dir}; "
                "reinstall hyocr (it pins a rapidocr release that ships its models)"
            )
        found[kind] = matches[-1]
    return found


class RapidOcrEngine(Engine):
    def __init__(self, *, workers: int = 1, model: str | None = None) -> None:
        if model not in (None, "", DEFAULT_MODEL):
            raise SettingsError(
                f"the rapidocr engine serves its bundled {DEFAULT_MODEL} models; got model={model!r}"
            )
        self.workers = workers
        self.models = bundled_models()
        self.info = EngineInfo(
            name="rapidocr",
            model=f"rapidocr-{DEFAULT_MODEL.lower()}",
            tasks=OCR_ONLY_TASKS,
            follows_prompts=False,
            max_images=1,
            details={"models": ", ".join(p.name for p in self.models.values())},
        )
        self._pool: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._executor: ThreadPoolExecutor | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> RapidOcrEngine:
        return cls(workers=settings.workers, model=settings.model)

    def _new_instance(self) -> Any:
        from rapidocr import RapidOCR

        threads = max(1, (os.cpu_count() or 1) // self.workers)
        return RapidOCR(
            params={
                "Global.log_level": "error",
                "Det.model_path": str(self.models["det"]),
                "Cls.model_path": str(self.models["cls"]),
                "Rec.model_path": str(self.models["rec"]),
                "EngineConfig.onnxruntime.intra_op_num_threads": threads,
                "EngineConfig.onnxruntime.inter_op_num_threads": 1,
            }
        )

    async def start(self) -> None:
        self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix="rapidocr")
        loop = asyncio.get_running_loop()
        probe = Image.new("RGB", (64, 32), "white")
        for _ in range(self.workers):
            instance = await loop.run_in_executor(self._executor, self._new_instance)
            # RapidOCR loads its sessions lazily: one call now keeps the first request fast.
            await loop.run_in_executor(self._executor, instance, probe)
            self._pool.put(instance)
        log.info("rapidocr engine ready: %d worker(s), models %s", self.workers, self.info.details)

    async def stop(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    async def ready(self) -> bool:
        return self._executor is not None

    def _recognise(self, image: Image.Image) -> list[TextBlock]:
        """Runs on a worker thread; the instance goes back to the pool even if the caller left."""
        view, scale = detector_view(image)
        instance = self._pool.get()
        try:
            out = instance(view)
        finally:
            self._pool.put(instance)
        if out.txts is None or out.boxes is None:
            return []
        return reading_order(
            [
                TextBlock(
                    text=str(text),
                    box=_bounds([(x / scale, y / scale) for x, y in quad], image.width, image.height),
                    score=round(float(score), 4),
                    polygon=tuple((round(float(x) / scale, 1), round(float(y) / scale, 1)) for x, y in quad),
                )
                for quad, text, score in zip(out.boxes, out.txts, out.scores, strict=True)
                if str(text).strip()
            ]
        )

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        if not self.supports(request.task):
            raise UnsupportedTask(f"the rapidocr engine cannot run task {request.task.value!r}")
        if len(request.images) != 1:
            raise EngineError(f"rapidocr takes one image per request, got {len(request.images)}")
        if self._executor is None:
            raise ServiceUnavailable("the rapidocr engine is not started")
        page = request.images[0]
        loop = asyncio.get_running_loop()
        blocks = await loop.run_in_executor(self._executor, self._recognise, page.image)
        for i, block in enumerate(blocks):
            if request.task is Task.SPOTTING:
                text = to_spotting_text([block], page.width, page.height)
            else:
                text = block.text
            sep = "" if i == 0 else ("\n" if _starts_line(blocks, i) else " ")
            yield EngineChunk(text=sep + text, blocks=(block,))
        yield EngineChunk(finish_reason=FinishReason.STOP)


def detector_view(image: Image.Image) -> tuple[Image.Image, float]:
    """What RapidOCR is given: the image itself, or for one wider than MAX_WIDE or taller than MAX_TALL, a
    copy with its long side capped at MAX_SIDE and white added below or right. Coordinates in it, divided
    by the returned scale, are the image's own."""
    width, height = image.size
    if width <= MAX_WIDE * height and height <= MAX_TALL * width:
        return image, 1.0
    scale = min(1.0, MAX_SIDE / max(width, height))
    if scale < 1.0:
        image = image.resize((max(1, round(width * scale)), max(1, round(height * scale))), Image.Resampling.BOX)
    width, height = image.size
    canvas = Image.new("RGB", (max(width, -(-height // MAX_TALL)), max(height, -(-width // MAX_WIDE))), "white")
    canvas.paste(image.convert("RGB"), (0, 0))
    return canvas, scale


def _bounds(quad: Any, width: int, height: int) -> tuple[float, float, float, float]:
    xs = [min(max(float(p[0]), 0.0), width) for p in quad]
    ys = [min(max(float(p[1]), 0.0), height) for p in quad]
    return (round(min(xs), 1), round(min(ys), 1), round(max(xs), 1), round(max(ys), 1))


def _same_line(a: TextBlock, b: TextBlock) -> bool:
    """Two boxes sit on one visual line when they overlap vertically by half the smaller height."""
    assert a.box and b.box
    overlap = min(a.box[3], b.box[3]) - max(a.box[1], b.box[1])
    return overlap >= 0.5 * min(a.box[3] - a.box[1], b.box[3] - b.box[1])


def reading_order(blocks: list[TextBlock]) -> list[TextBlock]:
    """Top-to-bottom lines, left-to-right within a line (PP-OCR's order can zig-zag on a row)."""
    rows: list[list[TextBlock]] = []
    for block in sorted(blocks, key=lambda b: (b.box[1] + b.box[3]) / 2 if b.box else 0.0):
        if rows and _same_line(rows[-1][0], block):
            rows[-1].append(block)
        else:
            rows.append([block])
    return [b for row in rows for b in sorted(row, key=lambda b: b.box[0] if b.box else 0.0)]


def _starts_line(blocks: list[TextBlock], i: int) -> bool:
    return not _same_line(blocks[i - 1], blocks[i])
