"""hyocr.pipeline.memory and the loader's early resizing: the decode budget, what an engine keeps of a page,
and boxes that stay in pixels of the uploaded image (issue 15, item 3).

Every image is drawn here with Pillow; the budget runs on the real event loop and real threads.
"""

from __future__ import annotations

import asyncio
import io
import random
import struct
import threading
import time
import zlib

import numpy as np
import pdfs
import pytest
from PIL import Image

from hyocr.errors import PayloadTooLarge, ServiceUnavailable
from hyocr.hunyuan.geometry import PixelBounds, fit_image, smart_resize
from hyocr.pipeline.fetch import FetchPolicy
from hyocr.pipeline.inputs import PageLoader, PageRequest
from hyocr.types import MediaInput
from hyocr.pipeline.media import (
    MediaLimits,
    decode_cost,
    decode_image,
    load_image,
    probe_image,
    reduction_for,
)
from hyocr.pipeline.memory import (
    DETECTOR_MAX_SIDE,
    DecodeBudget,
    KeepSize,
    MemoryPolicy,
    decoded_within,
)
from hyocr.pipeline.pages import build_page
from hyocr.pipeline.pdf import PdfRenderer, RenderPlan
from hyocr.types import FinishReason, Task, Usage

MODEL = KeepSize.for_engine(follows_prompts=True)  # HunyuanOCR's bounds: 512^2 .. 2048^2 pixels
DETECTOR = KeepSize.for_engine(follows_prompts=False)  # rapidocr: 2000 pixels on the long side
RED, WHITE = (255, 0, 0), (255, 255, 255)


def encode(image: Image.Image, fmt: str, **options) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **options)
    return buf.getvalue()


def marked(size: tuple[int, int], mode: str = "RGB") -> Image.Image:
    """White, with a red block over the left tenth of the image (to see where it ends up)."""
    image = Image.new(mode, size, WHITE if mode == "RGB" else (255, 255, 255, 255))
    image.paste(RED if mode == "RGB" else (255, 0, 0, 255), (0, 0, size[0] // 10, size[1]))
    return image


def png_declaring(width: int, height: int) -> bytes:
    """A valid 1x1 PNG whose IHDR claims width x height (decoding it would fail; probing it must not)."""
    data = bytearray(encode(Image.new("L", (1, 1)), "PNG"))
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


def loader(keep: KeepSize = MODEL, budget: DecodeBudget | None = None, **limits) -> PageLoader:
    return PageLoader(MediaLimits(**limits), FetchPolicy(()), PdfRenderer(workers=1), RenderPlan(), 64,
                      MemoryPolicy(keep, budget))


# --------------------------------------------------------------------------- the decode budget


async def test_budget_grants_within_capacity_and_queues_the_rest():
    budget = DecodeBudget(100, wait=5)
    assert await budget.acquire(60) == 60
    second = asyncio.ensure_future(budget.acquire(60))
    await asyncio.sleep(0.05)
    assert not second.done() and budget.waiting == 1 and budget.used == 60
    budget.release(60)
    assert await asyncio.wait_for(second, 1) == 60
    assert budget.used == 60 and budget.waiting == 0
    budget.release(60)
    assert budget.used == 0 and budget.peak == 60


async def test_budget_is_first_come_first_served_so_a_large_image_is_not_starved():
    budget = DecodeBudget(100, wait=5)
    await budget.acquire(50)
    large = asyncio.ensure_future(budget.acquire(100))
    await asyncio.sleep(0.01)
    small = asyncio.ensure_future(budget.acquire(10))  # would fit now, but waits behind the large one
    await asyncio.sleep(0.05)
    assert not large.done() and not small.done()
    budget.release(50)
    assert await asyncio.wait_for(large, 1) == 100
    await asyncio.sleep(0.01)
    assert not small.done()
    budget.release(100)
    assert await asyncio.wait_for(small, 1) == 10


async def test_an_image_larger_than_the_whole_budget_decodes_alone():
    budget = DecodeBudget(100, wait=5)
    await budget.acquire(1)
    huge = asyncio.ensure_future(budget.acquire(10**9))
    await asyncio.sleep(0.05)
    assert not huge.done()  # waits for everything to be free
    budget.release(1)
    assert await asyncio.wait_for(huge, 1) == 100  # clamped: it takes the whole budget
    assert budget.used == budget.capacity == budget.peak


async def test_waiting_past_the_bound_is_a_503_that_leaves_the_budget_consistent():
    budget = DecodeBudget(100, wait=0.1)
    await budget.acquire(80)
    started = time.monotonic()
    with pytest.raises(ServiceUnavailable) as exc:
        await budget.acquire(50)
    assert 0.08 < time.monotonic() - started < 2
    assert exc.value.status == 503 and exc.value.code == "decode_busy"
    assert exc.value.headers["Retry-After"] == "1"
    assert budget.waiting == 0 and budget.used == 80
    budget.release(80)
    assert budget.used == 0 and await budget.acquire(100) == 100


async def test_a_cancelled_waiter_leaves_the_queue_and_unblocks_those_behind_it():
    budget = DecodeBudget(100, wait=5)
    await budget.acquire(50)
    large = asyncio.ensure_future(budget.acquire(100))
    await asyncio.sleep(0.01)
    small = asyncio.ensure_future(budget.acquire(20))
    await asyncio.sleep(0.01)
    large.cancel()
    assert await asyncio.wait_for(small, 1) == 20  # the head left: the small one fits beside the 50
    assert budget.used == 70 and budget.waiting == 0


async def test_a_grant_that_arrives_as_the_waiter_is_cancelled_is_handed_on():
    budget = DecodeBudget(100, wait=5)
    await budget.acquire(100)
    first = asyncio.ensure_future(budget.acquire(100))
    await asyncio.sleep(0.01)
    second = asyncio.ensure_future(budget.acquire(100))
    await asyncio.sleep(0.01)
    budget.release(100)  # grants `first`...
    first.cancel()  # ...which is cancelled before it runs again
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await asyncio.wait_for(second, 1) == 100 and budget.used == 100


async def test_concurrent_holders_never_exceed_the_capacity():
    budget = DecodeBudget(1000, wait=10)
    rng = random.Random(7)
    inside = [0, 0]  # now, most

    async def one(cost: int) -> None:
        taken = await budget.acquire(cost)
        inside[0] += taken
        inside[1] = max(inside[1], inside[0])
        assert budget.used <= budget.capacity
        await asyncio.sleep(rng.random() / 100)
        inside[0] -= taken
        budget.release(taken)

    await asyncio.gather(*(one(rng.randint(1, 1500)) for _ in range(200)))
    assert budget.used == 0 and budget.waiting == 0 and inside[1] <= 1000 and budget.peak <= 1000


async def test_decoded_within_holds_the_budget_until_the_thread_is_done_even_if_cancelled():
    budget = DecodeBudget(100, wait=5)
    go, running = threading.Event(), threading.Event()

    def work() -> str:
        running.set()
        go.wait(5)
        return "done"

    task = asyncio.ensure_future(decoded_within(budget, 70, work))
    while not running.is_set():
        await asyncio.sleep(0.01)
    task.cancel()  # the client left: the thread still holds its pixels
    with pytest.raises(asyncio.CancelledError):
        await task
    assert budget.used == 70
    go.set()
    for _ in range(100):
        if budget.used == 0:
            break
        await asyncio.sleep(0.01)
    assert budget.used == 0


async def test_decoded_within_returns_the_budget_when_decoding_fails():
    budget = DecodeBudget(100, wait=5)

    def broken() -> None:
        raise ValueError("corrupt")

    with pytest.raises(ValueError):
        await decoded_within(budget, 60, broken)
    assert budget.used == 0


# --------------------------------------------------------------------------- what an engine keeps


def test_model_engines_keep_exactly_what_their_processor_resizes_to():
    bounds = PixelBounds()
    for width, height in [(6300, 6300), (6000, 3000), (2500, 1700), (4032, 3024), (30000, 200)]:
        h, w = smart_resize(height, width, bounds)
        assert MODEL.target(width, height) == (w, h)
        assert MODEL.target(height, width) == (h, w)  # both sides alike: stored size turned == turned size
    for width, height in [(1024, 640), (2048, 2048), (300, 200), (1720, 2433)]:
        assert MODEL.target(width, height) is None  # within max_pixels: as decoded (the engine may enlarge)


def test_an_aspect_ratio_the_model_refuses_is_still_kept_small():
    width, height = 60_000, 250  # 240:1, over the model's 200:1: the engine refuses it, not the loader
    w, h = MODEL.target(width, height)
    assert w * h <= PixelBounds().max_pixels and abs(w / h - 240) < 3


def test_detectors_keep_their_long_side():
    assert DETECTOR.target(6300, 6300) == (2000, 2000)
    assert DETECTOR.target(4000, 1000) == (2000, 500)
    assert DETECTOR.target(100_000, 1) == (2000, 1)
    assert DETECTOR.target(2000, 1999) is None and DETECTOR.target(640, 480) is None
    assert DETECTOR_MAX_SIDE == 2000
    assert KeepSize().target(100_000, 100_000) is None  # no policy: kept as decoded


def test_keep_size_follows_the_settings_pixel_bounds():
    from hyocr.config import Settings

    keep = KeepSize.for_engine(True, Settings(_env_file=None, min_pixels=65536, max_pixels=1024 * 1024))
    assert keep.target(2048, 2048) == (1024, 1024)


# --------------------------------------------------------------------------- early resizing


def test_a_large_png_is_reduced_to_exactly_what_the_engine_would_have_made_of_it():
    data = encode(marked((6000, 3000)), "PNG")
    probe = probe_image(data, MediaLimits())
    stored = reduction_for(probe, MODEL)
    page = decode_image(probe, stored)
    assert page.size == (6000, 3000)
    assert (page.width, page.height) == (6000, 3000)  # the uploaded image's size, for boxes and the response
    assert page.image.size == stored == (2880, 1440) and page.image.mode == "RGB"
    assert probe.image is None  # the full-size pixels are gone
    # The model engines' own resize is now a no-op, and what they see is bit-identical to before.
    assert fit_image(page) is page.image
    before = fit_image(load_image(data, MediaLimits()))
    assert np.array_equal(np.asarray(before), np.asarray(page.image))


def test_an_image_within_the_bound_is_decoded_as_before():
    data = encode(marked((1024, 640)), "PNG")
    probe = probe_image(data, MediaLimits())
    assert reduction_for(probe, MODEL) is None and reduction_for(probe, DETECTOR) is None
    page = decode_image(probe, None)
    assert type(page).__name__ == "PageImage" and page.image.size == (1024, 640) == (page.width, page.height)


def test_a_large_jpeg_is_decoded_small_by_its_dct_scaling():
    data = encode(marked((6400, 4800)), "JPEG", quality=90)
    full = probe_image(data, MediaLimits())
    full_cost = decode_cost(full, None)
    probe = probe_image(data, MediaLimits())
    stored = reduction_for(probe, DETECTOR)
    assert stored == (2000, 1500)
    assert probe.image.size == (3200, 2400)  # Pillow's draft: half size, still at least the target
    assert decode_cost(probe, stored) < full_cost / 2
    page = decode_image(probe, stored)
    assert (page.width, page.height, page.image.size) == (6400, 4800, (2000, 1500))
    r, g, b = page.image.getpixel((100, 750))
    assert r > 230 and g < 30 and b < 30  # the red left tenth stays the left tenth
    assert page.image.getpixel((400, 750)) == pytest.approx(WHITE, abs=8)


def test_exif_orientation_is_applied_after_reducing():
    exif = Image.Exif()
    exif[0x0112] = 6  # stored 4800x2400, displayed turned 90 degrees clockwise: 2400x4800
    data = encode(marked((4800, 2400)), "JPEG", exif=exif.tobytes(), quality=90)
    probe = probe_image(data, MediaLimits())
    page = decode_image(probe, reduction_for(probe, DETECTOR))
    assert (page.width, page.height) == (2400, 4800)
    assert page.image.size == (1000, 2000)
    assert page.image.getpixel((500, 60))[1] < 40  # the stored left edge is now the top
    assert page.image.getpixel((500, 1900)) == pytest.approx(WHITE, abs=8)
    full = load_image(data, MediaLimits())  # the unreduced path turns it the same way
    assert full.image.size == (2400, 4800) and full.image.getpixel((1200, 100))[1] < 40


@pytest.mark.parametrize("mode", ["RGBA", "P", "LA", "L", "1", "I;16", "CMYK"])
def test_every_mode_is_reduced_to_8bit_rgb_with_transparency_on_white(mode):
    size = (4200, 2100)
    if mode == "RGBA":
        source = Image.new("RGBA", size, (0, 0, 0, 0))
        source.paste((255, 0, 0, 255), (0, 0, 420, 2100))
        data = encode(source, "PNG")
    elif mode == "P":
        source = Image.new("P", size, 0)
        source.putpalette([0, 0, 0, 255, 0, 0])
        source.paste(1, (0, 0, 420, 2100))
        data = encode(source, "PNG", transparency=0)
    elif mode == "LA":
        data = encode(Image.new("LA", size, (0, 0)), "PNG")
    elif mode == "I;16":
        data = encode(Image.new("I;16", size, 65535), "PNG")
    elif mode == "CMYK":
        data = encode(Image.new("CMYK", size, (0, 0, 0, 0)), "JPEG")
    else:
        data = encode(Image.new(mode, size, 255 if mode == "L" else 1), "PNG")
    probe = probe_image(data, MediaLimits())
    assert probe.image.mode == mode
    page = decode_image(probe, reduction_for(probe, DETECTOR))
    assert page.image.mode == "RGB" and page.image.size == (2000, 1000) and (page.width, page.height) == size
    assert page.image.getpixel((1500, 500)) == pytest.approx(WHITE, abs=4)  # transparent or white: white
    if mode in ("RGBA", "P"):
        r, g, b = page.image.getpixel((100, 500))
        assert r > 240 and g < 15 and b < 15


def test_spotting_boxes_of_a_reduced_page_are_in_the_uploaded_pixels():
    probe = probe_image(encode(marked((6000, 3000)), "PNG"), MediaLimits())
    page = decode_image(probe, reduction_for(probe, MODEL))
    result = build_page(Task.SPOTTING, page, "TOTAL(100,100),(500,200)", (), FinishReason.STOP, Usage())
    assert (result.width, result.height) == (6000, 3000)
    assert result.blocks[0].box == (600.0, 300.0, 3000.0, 600.0)  # 0-1000 of the original, not of 2880x1440


# --------------------------------------------------------------------------- the loader


async def test_request_pixels_are_checked_from_the_headers_before_any_decoding():
    budget = DecodeBudget(64 * 1024 * 1024)
    pages = loader(budget=budget, max_request_pixels=100_000_000)
    claims = tuple(MediaInput(png_declaring(6300, 6300), param=f"images.{i}") for i in range(3))  # 119 M
    started = time.perf_counter()
    with pytest.raises(PayloadTooLarge) as exc:
        await pages.load(claims, PageRequest())
    assert time.perf_counter() - started < 1 and budget.peak == 0  # nothing was decoded
    assert exc.value.status == 413 and exc.value.code == "too_many_pixels" and exc.value.param == "images.2"
    assert "119070000 pixels" in exc.value.message and "100000000" in exc.value.message


async def test_the_loader_decodes_within_the_budget_and_keeps_reduced_pages():
    budget = DecodeBudget(300 * 1024 * 1024, wait=30)
    pages_loader = loader(budget=budget)
    data = encode(marked((6300, 6300)), "PNG")
    requests = [tuple(MediaInput(data) for _ in range(3)) for _ in range(3)]
    results = await asyncio.gather(*(pages_loader.load(r, PageRequest()) for r in requests))
    for pages in results:
        assert [(p.index, p.width, p.height, p.image.size) for p in pages] == [
            (i, 6300, 6300, (2048, 2048)) for i in range(3)]
    assert budget.used == 0 and 0 < budget.peak <= budget.capacity
    one = decode_cost(probe_image(data, MediaLimits()), (2048, 2048))
    assert budget.peak < 2 * one  # one 40 MP decode at a time in a 300 MiB budget


async def test_a_detectors_giant_pdf_page_is_reduced_on_arrival():
    document = pdfs.text_pdf([["A PAGE TWENTY INCHES WIDE"]], size=60, page_size=(1440, 1080))
    renderer = PdfRenderer(workers=1)
    try:
        pages_loader = PageLoader(MediaLimits(), FetchPolicy(()), renderer, RenderPlan.for_engine(False), 64,
                                  MemoryPolicy(DETECTOR, DecodeBudget(256 * 1024 * 1024)))
        (page,) = await pages_loader.load((MediaInput(document),), PageRequest(accept_pdf=True))
    finally:
        renderer.close()
    assert page.dpi == 150 and (page.width, page.height) == (3000, 2250)  # the rendered page's pixels
    assert page.size == (3000, 2250) and page.image.size == (2000, 1500)
