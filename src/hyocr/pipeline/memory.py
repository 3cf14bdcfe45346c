"""Image memory: what the engine keeps of a page, and a budget for decoding full-size images.

A 50 kB PNG can declare 40 million white pixels: 160 MB once Pillow has decoded it (RGB is 4 bytes a pixel
in memory). The pixel caps bound one image and one request; this module bounds the server:

- ``KeepSize``: the most of an image the engine will ever use (HunyuanOCR: the size its processor resizes
  to, within MAX_PIXELS; rapidocr: RapidOCR's own 2000-pixel long side). A larger image is reduced to it as
  soon as it is decoded (a JPEG is even decoded smaller, by its DCT scaling), and the full-size buffer is
  dropped. The page keeps its original width and height (``PageImage.size``): boxes are in pixels of the
  uploaded image whatever the engine saw.
- ``DecodeBudget``: the bytes that full-size decoding may take at once, shared by every request of the
  process. An image waits (first come, first served, at most ``wait`` seconds, then 503) for its estimated
  cost before it is decoded, and gives it back once it has been reduced. An image that costs more than the
  whole budget (within MAX_IMAGE_PIXELS) waits until nothing else is decoding and then runs alone.

What the engine keeps is not budgeted here: it is bounded by the engine's size, MAX_IMAGES_PER_REQUEST and
MAX_CONCURRENCY (docs/decisions.md, "Image memory").
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import math
import os
from collections import deque
from dataclasses import dataclass

from ..errors import InvalidRequest, ServiceUnavailable
from ..observability.logs import record

log = logging.getLogger("hyocr.memory")

DETECTOR_MAX_SIDE = 2000  # RapidOCR's Global.max_side_len: it reads every image at most this large


@dataclass(frozen=True, slots=True)
class KeepSize:
    """The largest image an engine uses, as a function of the image's size.

    ``bounds`` (HunyuanOCR engines): (min_pixels, max_pixels) of the processor's smart resize; an image
    over max_pixels is reduced to exactly the size the engine would resize it to (so the engine's own
    resize is then a no-op and its result unchanged). ``max_side`` (detectors): the long side.
    Neither: images are kept as decoded.
    """

    bounds: tuple[int, int] | None = None
    max_side: int | None = None

    @classmethod
    def for_engine(cls, follows_prompts: bool, settings=None) -> KeepSize:
        if not follows_prompts:
            return cls(max_side=DETECTOR_MAX_SIDE)
        from ..hunyuan.geometry import MAX_PIXELS, MIN_PIXELS

        if settings is None:
            return cls(bounds=(MIN_PIXELS, MAX_PIXELS))
        return cls(bounds=(settings.min_pixels, settings.max_pixels))

    def target(self, width: int, height: int) -> tuple[int, int] | None:
        """(width, height) to reduce a ``width`` x ``height`` image to, or None to keep it as it is."""
        if self.bounds is not None:
            min_pixels, max_pixels = self.bounds
            if width * height <= max_pixels:
                return None
            from ..hunyuan.geometry import PixelBounds, smart_resize

            try:
                h, w = smart_resize(height, width, PixelBounds(min_pixels, max_pixels))
            except InvalidRequest:  # an aspect ratio the model refuses: the engine says so; keep it small
                scale = math.sqrt(max_pixels / (width * height))
                return _scaled(width, height, scale)
            return (w, h) if w <= width and h <= height and w * h < width * height else None
        if self.max_side is not None and max(width, height) > self.max_side:
            return _scaled(width, height, self.max_side / max(width, height))
        return None


def _scaled(width: int, height: int, scale: float) -> tuple[int, int]:
    return max(1, min(width, round(width * scale))), max(1, min(height, round(height * scale)))


class DecodeBudget:
    """Bytes of full-size decoding in flight, shared by the process's requests; FIFO, never over capacity
    (one holder that costs more than everything takes it all, alone).

    Used from one event loop: ``acquire`` and ``release`` run on it (the decoding itself on a thread).
    """

    def __init__(self, capacity: int, *, wait: float | None = 30.0) -> None:
        if capacity < 1:
            raise ValueError("a decode budget needs capacity >= 1 byte")
        self.capacity = capacity
        self.wait = wait
        self.used = 0
        self.peak = 0  # the most held at once (for tests and logs)
        self._waiters: deque[tuple[asyncio.Future, int]] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def _grant(self, cost: int) -> None:
        self.used += cost
        self.peak = max(self.peak, self.used)

    async def acquire(self, cost: int) -> int:
        """Wait for ``cost`` bytes (clamped to the capacity); returns what was taken, for ``release``.
        503 ``decode_busy`` after ``wait`` seconds."""
        cost = max(0, min(int(cost), self.capacity))
        if not self._waiters and self.used + cost <= self.capacity:
            self._grant(cost)
            return cost
        waiter = asyncio.get_running_loop().create_future()
        entry = (waiter, cost)
        self._waiters.append(entry)
        try:
            async with asyncio.timeout(self.wait):
                await waiter  # resolved by _wake, which has already counted the cost as used
        except TimeoutError:
            self._give_up(entry)
            record(rejected="decode_busy")
            raise ServiceUnavailable(
                f"the server is decoding other large images and none of its image memory came free within "
                f"{self.wait:g} s; retry shortly", code="decode_busy", headers={"Retry-After": "1"},
            ) from None
        except BaseException:
            self._give_up(entry)
            raise
        return cost

    def release(self, cost: int) -> None:
        self.used -= cost
        if self.used < 0:  # never: a release without its acquire
            log.error("decode budget released more than it held")
            self.used = 0
        self._wake()

    def _give_up(self, entry: tuple[asyncio.Future, int]) -> None:
        waiter, cost = entry
        if entry in self._waiters:
            self._waiters.remove(entry)
            self._wake()  # a large waiter at the head that leaves may unblock smaller ones behind it
        elif waiter.done() and not waiter.cancelled():
            self.release(cost)  # granted just as we gave up: hand it on

    def _wake(self) -> None:
        while self._waiters:
            waiter, cost = self._waiters[0]
            if waiter.done():  # cancelled, being removed by its owner
                self._waiters.popleft()
                continue
            if self.used + cost > self.capacity:
                return  # first come, first served: the head waits for room, the rest behind it
            self._waiters.popleft()
            self._grant(cost)
            waiter.set_result(None)


async def decoded_within(budget: DecodeBudget | None, cost: int, work, *args):
    """``work(*args)`` on a thread while ``cost`` bytes of ``budget`` are held. If the caller is cancelled
    while the thread runs, the budget is returned when the thread has finished, not before (its memory is
    in use until then)."""
    loop = asyncio.get_running_loop()
    if budget is None:
        return await loop.run_in_executor(None, work, *args)
    if budget.waiting or budget.used + min(cost, budget.capacity) > budget.capacity:
        started = loop.time()
        taken = await budget.acquire(cost)
        record(decode_wait_ms=round((loop.time() - started) * 1000, 2))  # adds up over a request's images
    else:
        taken = await budget.acquire(cost)
    job = loop.run_in_executor(None, work, *args)
    try:
        return await asyncio.shield(job)
    except asyncio.CancelledError:
        job.add_done_callback(lambda _, held=taken: budget.release(held))
        taken = 0
        raise
    finally:
        if taken:
            budget.release(taken)
            trim_heap(taken)


@dataclass(frozen=True, slots=True)
class MemoryPolicy:
    """How a PageLoader spends image memory: what the engine keeps, and the decode budget."""

    keep: KeepSize = KeepSize()
    budget: DecodeBudget | None = None

    @classmethod
    def for_engine(cls, follows_prompts: bool, settings=None) -> MemoryPolicy:
        if settings is None:
            from ..config import Settings

            settings = Settings.model_construct()  # the defaults, without reading the environment
        megabytes = settings.decode_budget_mb or default_budget_mb()
        budget = DecodeBudget(megabytes * 1024 * 1024, wait=settings.queue_timeout)
        return cls(KeepSize.for_engine(follows_prompts, settings), budget)


def default_budget_mb() -> int:
    """128 MiB per core this process may run on, at least 256: decoding is CPU-bound, so more decodes at once
    than cores only hold more memory. 256 MiB decodes one 40 MP RGB image (~250 MB at its peak) at a time."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(256, 128 * cores)


# ------------------------------------------------------------------ the C heap

_libc = None
_TRIM_AFTER = 64 * 1024 * 1024  # bytes of large decodes between two malloc_trim calls
_decoded_since_trim = 0


def _glibc():
    global _libc
    if _libc is None:
        try:
            name = ctypes.util.find_library("c")
            lib = ctypes.CDLL(name) if name else None
            usable = lib is not None and hasattr(lib, "malloc_trim") and hasattr(lib, "mallopt")
            _libc = lib if usable else False
        except OSError:
            _libc = False
    return _libc or None


def tune_allocator() -> None:
    """Large blocks (image buffers) from mmap, so freeing one gives its memory back to the system.

    glibc raises its mmap threshold to the size of each large block freed (up to 32 MB), after which image
    buffers come from the heap and freed ones stay in the process: a burst of large images left ~1 GB held.
    Setting the threshold fixes it (and stops the raising). No-op off glibc."""
    lib = _glibc()
    if lib is None:
        return
    m_mmap_threshold = -3
    lib.mallopt(m_mmap_threshold, 1024 * 1024)


def trim_heap(decoded: int = _TRIM_AFTER) -> None:
    """After large decodes, give the heap's free pages back (the small buffers a decoder leaves)."""
    global _decoded_since_trim
    _decoded_since_trim += decoded
    if _decoded_since_trim < _TRIM_AFTER:
        return
    _decoded_since_trim = 0
    lib = _glibc()
    if lib is not None:
        lib.malloc_trim(0)
