"""Seeded synthetic OCR workloads: card-size and page-size images with text, as data URLs.

Every request gets its own image (different text), generated from the seed, so runs are
reproducible and no cache can serve a repeat. Pillow's bundled font is used, so the images are
the same on machines without system fonts.
"""

from __future__ import annotations

import base64
import io
import random
from dataclasses import dataclass

from PIL import Image, ImageDraw, ImageFont


def a4_size() -> tuple[int, int]:
    """An A4 page (595 x 842 pt) at the DPI hyocr's PDF reader picks for HunyuanOCR at the default pixel
    bounds and visual-token budget (208 dpi: 1720 x 2433, 4106 visual tokens)."""
    from ..pipeline.pdf import RenderPlan
    from ..pipeline.pdf_worker import choose_dpi, pixels_at

    width_pt, height_pt = 595.28, 841.89
    return pixels_at(width_pt, height_pt, choose_dpi(width_pt, height_pt, RenderPlan.for_engine(True)))


SIZES = {"card": (1024, 640), "page": (1600, 1200), "a4": a4_size()}
_WORDS = ("NAME", "ID", "DATE", "TOTAL", "INVOICE", "ADDRESS", "AMOUNT", "TAX", "ITEM", "QTY", "PRICE",
          "姓名", "地址", "金额", "日期", "发票", "合计")


@dataclass(frozen=True, slots=True)
class Workload:
    name: str  # card | page
    prompt: str
    max_tokens: int
    fixed_output: bool  # ignore EOS so every request generates exactly max_tokens
    seed: int = 1234

    @property
    def size(self) -> tuple[int, int]:
        return SIZES[self.name]

    def image(self, index: int) -> Image.Image:
        rng = random.Random(self.seed * 100_003 + index)
        width, height = self.size
        image = Image.new("RGB", (width, height), (250, 250, 245))
        draw = ImageDraw.Draw(image)
        font = ImageFont.load_default(size=max(18, height // 28))
        y = height // 20
        while y < height - height // 10:
            words = [rng.choice(_WORDS) for _ in range(rng.randint(2, 5))]
            line = " ".join(words) + f" {rng.randint(0, 10**8):08d}"
            draw.text((width // 20, y), line, fill=(20, 20, 20), font=font)
            y += int(font.size * 1.8)
        return image

    def data_url(self, index: int) -> str:
        buf = io.BytesIO()
        self.image(index).save(buf, "PNG", compress_level=1)
        return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()

    def chat_body(self, index: int, model: str = "hyocr") -> dict:
        body = {
            "model": model,
            "messages": [
                {"role": "system", "content": ""},
                {"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": self.data_url(index)}},
                    {"type": "text", "text": self.prompt},
                ]},
            ],
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.fixed_output:
            body.update(ignore_eos=True, min_tokens=self.max_tokens, loop_guard=False)
        return body
