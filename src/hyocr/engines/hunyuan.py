"""HunyuanOCR conventions shared by every model engine (vLLM, transformers, remote upstream).

One place for the chat format, the image pixel bounds and the sampling defaults, so all three
engines send the model the same thing and their results are comparable.
"""

from __future__ import annotations

import base64
import io
import math
from dataclasses import dataclass, replace

from PIL import Image

from ..errors import InvalidRequest
from ..types import PageImage, SamplingParams

PATCH = 16
MERGE = 2
FACTOR = PATCH * MERGE  # image sides are rounded to multiples of 32
MIN_PIXELS = 512 * 512  # preprocessor_config.json of HunyuanOCR 1.0
MAX_PIXELS = 2048 * 2048
MAX_ASPECT = 200
IMAGE_PLACEHOLDER = "<｜hy_place▁holder▁no▁102｜>"  # the image token; vLLM adds start/end itself


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


def data_url(image: Image.Image) -> str:
    """PNG (lossless: OCR suffers from JPEG artefacts on small text) as a data URL."""
    buf = io.BytesIO()
    image.save(buf, "PNG", compress_level=1)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def chat_messages(system: str, prompt: str, image_urls: list[str]) -> list[dict]:
    """The official chat shape: always a system message (even empty: quality drops without it),
    then one user turn with the images first and the instruction after."""
    content: list[dict] = [{"type": "image_url", "image_url": {"url": u}} for u in image_urls]
    content.append({"type": "text", "text": prompt})
    return [{"role": "system", "content": system}, {"role": "user", "content": content}]


def sampling_defaults(sampling: SamplingParams) -> SamplingParams:
    """The authors' decoding: greedy unless the client asks otherwise."""
    return replace(sampling, temperature=0.0) if sampling.temperature is None else sampling


def sampling_kwargs(sampling: SamplingParams) -> dict:
    """The request's sampling in the OpenAI/vLLM vocabulary (vLLM's SamplingParams and the
    OpenAI-compatible body share these names), with the authors' defaults applied."""
    s = sampling_defaults(sampling)
    kwargs: dict = {"max_tokens": s.max_tokens, "temperature": s.temperature}
    for key in ("top_p", "top_k", "repetition_penalty", "presence_penalty", "frequency_penalty", "seed",
                "min_tokens"):
        if getattr(s, key) is not None:
            kwargs[key] = getattr(s, key)
    if s.stop:
        kwargs["stop"] = list(s.stop)
    if s.ignore_eos:
        kwargs["ignore_eos"] = True
    return kwargs
