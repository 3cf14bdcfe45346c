"""HunyuanOCR's image geometry: pixel bounds, the processor's smart resize, visual-token cost.

One place for the sizes the model's image processor picks, so every engine (vLLM, transformers, remote
upstream) sends the model the same pixels and the pipeline (PDF DPI, memory budget) plans with them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from PIL import Image

from ..errors import InvalidRequest
from ..types import PageImage

PATCH = 16
MERGE = 2
FACTOR = PATCH * MERGE  # image sides are rounded to multiples of 32
MIN_PIXELS = 512 * 512  # preprocessor_config.json of HunyuanOCR 1.0
MAX_PIXELS = 2048 * 2048
MAX_ASPECT = 200


@dataclass(frozen=True, slots=True)
class PixelBounds:
    min_pixels: int = MIN_PIXELS
    max_pixels: int = MAX_PIXELS

    def __post_init__(self) -> None:
        if not FACTOR * FACTOR <= self.min_pixels <= self.max_pixels:
            raise ValueError(f"need {FACTOR * FACTOR} <= min_pixels <= max_pixels")


def smart_resize(height: int, width: int, bounds: PixelBounds = PixelBounds()) -> tuple[int, int]:
    """The size HunyuanOCR's image processor resizes to (transformers ``hunyuan_vl`` smart_resize):
    sides divisible by 32, pixel count within bounds, aspect ratio kept."""
    if max(height, width) / min(height, width) > MAX_ASPECT:
        raise InvalidRequest(
            f"image aspect ratio {max(height, width) / min(height, width):.0f}:1 is over the model's "
            f"limit of {MAX_ASPECT}:1",
            param="image",
        )
    h_bar = round(height / FACTOR) * FACTOR
    w_bar = round(width / FACTOR) * FACTOR
    if h_bar * w_bar > bounds.max_pixels:
        beta = math.sqrt((height * width) / bounds.max_pixels)
        h_bar = max(FACTOR, math.floor(height / beta / FACTOR) * FACTOR)
        w_bar = max(FACTOR, math.floor(width / beta / FACTOR) * FACTOR)
    elif h_bar * w_bar < bounds.min_pixels:
        beta = math.sqrt(bounds.min_pixels / (height * width))
        h_bar = math.ceil(height * beta / FACTOR) * FACTOR
        w_bar = math.ceil(width * beta / FACTOR) * FACTOR
    return h_bar, w_bar


def visual_tokens(height: int, width: int, bounds: PixelBounds = PixelBounds()) -> int:
    """Prompt tokens one image costs: a row of merged patches plus a newline token per row, plus
    begin/end (HUNYUANOCR.md): ``(grid_h // 2) * (grid_w // 2 + 1) + 2``."""
    h, w = smart_resize(height, width, bounds)
    grid_h, grid_w = h // PATCH, w // PATCH
    return (grid_h // MERGE) * (grid_w // MERGE + 1) + 2


def fit_image(page: PageImage, bounds: PixelBounds = PixelBounds()) -> Image.Image:
    """The page resized to exactly the size the model's processor would pick, so the processor does
    no second resampling (and a remote upstream receives no more pixels than it will use).
    Boxes stay right: the model's coordinates are relative (0-1000) to the image it saw."""
    h, w = smart_resize(page.height, page.width, bounds)
    if (w, h) == page.image.size:
        return page.image
    return page.image.resize((w, h), Image.Resampling.BICUBIC)
