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
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PIL import Image

from ..config import SettingsError
from ..errors import EngineError, ServiceUnavailable, UnsupportedTask
from ..hunyuan.spotting import to_spotting_text
from ..types import EngineChunk, EngineRequest, FinishReason, Task, TextBlock
from .base import Engine, EngineInfo
from .registry import OCR_ONLY_TASKS
from .slots import PrioritySlots

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
        self._pace = Pace()
        self._slots = PrioritySlots(workers)

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
        if self._pace.calibrated is None:  # once per process: the machine does not change on a restart
            seconds = await loop.run_in_executor(self._executor, self._time_one, calibration_card())
            self._pace.calibrate(seconds, CALIBRATION_SIZE[0] * CALIBRATION_SIZE[1])
        log.info("rapidocr engine ready: %d worker(s), models %s, %.2f s per megapixel", self.workers,
                 self.info.details, self._pace.seconds_per_megapixel)

    def _time_one(self, image: Image.Image) -> float:
        started = time.perf_counter()
        self._recognise(image)
        return time.perf_counter() - started

    def expected_seconds(self, request: EngineRequest) -> float | None:
        """RapidOCR answers in one piece: its duration, estimated from the pixels and the pace measured at
        start and on every request since (the stall watchdog allows a multiple of it)."""
        return self._pace.expected(sum(p.image.width * p.image.height for p in request.images if p.image))

    async def stop(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    async def ready(self) -> bool:
        return self._executor is not None

    def _recognise(self, image: Image.Image, size: tuple[int, int] | None = None) -> list[TextBlock]:
        """Runs on a worker thread; the instance goes back to the pool even if the caller left. Boxes are in
        pixels of a ``size`` image (the page's: its pixels may have been reduced to ``image``)."""
        view, scale = detector_view(image)
        width, height = size or image.size
        sx, sy = scale * image.width / width, scale * image.height / height  # view pixels per page pixel
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
                    box=_bounds([(x / sx, y / sy) for x, y in quad], width, height),
                    score=round(float(score), 4),
                    polygon=tuple((round(float(x) / sx, 1), round(float(y) / sy, 1)) for x, y in quad),
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
        began = loop.create_future()

        def recognise() -> tuple[list[TextBlock], float]:
            loop.call_soon_threadsafe(_resolve, began)  # a worker took it: the engine has started
            started = time.perf_counter()
            return self._recognise(page.image, (page.width, page.height)), time.perf_counter() - started

        async with self._slots.slot(request.priority):  # online requests first; the pool never queues
            work = loop.run_in_executor(self._executor, recognise)
            try:
                await asyncio.wait((began, work), return_when=asyncio.FIRST_COMPLETED)
            except BaseException:
                work.cancel()  # still queued: it never runs; already running: it finishes unobserved
                raise
            yield EngineChunk()  # the start signal (no text): from now on the estimate applies, not the queue
            blocks, seconds = await work
        self._pace.observe(seconds, page.image.width * page.image.height)  # the pixels it read
        stops = [s for s in request.sampling.stop if s]
        said = ""
        for i, block in enumerate(blocks):
            if request.task is Task.SPOTTING:
                text = to_spotting_text([block], page.width, page.height)
            else:
                text = block.text
            sep = "" if i == 0 else ("\n" if _starts_line(blocks, i) else " ")
            # OpenAI's stop: the text ends before the first stop string (a model engine's decoder does it)
            whole = said + sep + text
            cut = min((at for at in (whole.find(s, max(0, len(said) - len(s) + 1)) for s in stops) if at >= 0),
                      default=-1)
            if cut >= 0:
                if cut > len(said):
                    yield EngineChunk(text=whole[len(said):cut])
                break
            said = whole
            yield EngineChunk(text=sep + text, blocks=(block,))
        yield EngineChunk(finish_reason=FinishReason.STOP)


CALIBRATION_SIZE = (1024, 640)


def calibration_card() -> Image.Image:
    """A card-sized image with lines of text, for the pace measured at start."""
    from PIL import ImageDraw

    image = Image.new("RGB", CALIBRATION_SIZE, "white")
    draw = ImageDraw.Draw(image)
    for row in range(8):
        draw.text((48, 40 + 72 * row), f"LINE {row + 1}: NAME JOHN SMITH 1990-01-0{row + 1} NO. 12345678",
                  fill="black", font_size=28)
    return image


class Pace:
    """Seconds per megapixel of this machine's RapidOCR: measured at start, then a moving average over the
    requests served (load and content move it). Small images cost a fixed minimum, so pixels count from
    a quarter of a megapixel."""

    FLOOR = 250_000

    def __init__(self) -> None:
        self.calibrated: float | None = None
        self.seconds_per_megapixel = 1.0

    def calibrate(self, seconds: float, pixels: int) -> None:
        self.calibrated = self.seconds_per_megapixel = seconds / (max(pixels, self.FLOOR) / 1e6)

    def observe(self, seconds: float, pixels: int) -> None:
        rate = seconds / (max(pixels, self.FLOOR) / 1e6)
        self.seconds_per_megapixel = 0.8 * self.seconds_per_megapixel + 0.2 * rate

    def expected(self, pixels: int) -> float:
        return self.seconds_per_megapixel * max(pixels, self.FLOOR) / 1e6


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


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
