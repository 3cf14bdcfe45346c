"""HunyuanOCR's chat format: the image placeholder, the message shape and the authors' sampling defaults.

Shared by every model engine (vLLM, transformers, remote upstream), so all of them send the model the
same thing and their results are comparable.
"""

from __future__ import annotations

import base64
import io
from dataclasses import replace

from PIL import Image

from ..types import SamplingParams

IMAGE_PLACEHOLDER = "<｜hy_place▁holder▁no▁102｜>"  # the image token; vLLM adds start/end itself


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
    for key in ("top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "seed",
                "min_tokens"):
        if getattr(s, key) is not None:
            kwargs[key] = getattr(s, key)
    if s.stop:
        kwargs["stop"] = list(s.stop)
    if s.ignore_eos:
        kwargs["ignore_eos"] = True
    return kwargs
