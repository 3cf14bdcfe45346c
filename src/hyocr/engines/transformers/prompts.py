"""A request's model input, built before it reaches the model thread: the chat text through HunyuanOCR's
template, the images through its processor, and the XD-RoPE positions of every prompt token.

Built on a thread of its own (``encode``), so that decoding never waits for an image to be resized.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ...hunyuan.geometry import PixelBounds, fit_image
from ...types import EngineRequest

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Prompt:
    """One request's prompt as tensors on the CPU (one row, no padding)."""

    ids: Any  # [n] token ids
    positions: Any  # [axes, n] rotary positions: sequential for text, (width, height, image) for image tokens
    pixel_values: Any | None  # the images' patches, concatenated (the processor's layout)
    image_grid_thw: Any | None  # [images, 3]

    @property
    def length(self) -> int:
        return int(self.ids.shape[0])

    @property
    def next_position(self) -> int:
        """The position of the first generated token (every axis: generated tokens are text)."""
        return int(self.positions.max()) + 1


def encode(request: EngineRequest, processor: Any, model: Any, bounds: PixelBounds) -> Prompt:
    import torch

    content: list[dict] = [{"type": "image"} for _ in request.images]
    content.append({"type": "text", "text": request.prompt})
    messages = [{"role": "system", "content": request.system}, {"role": "user", "content": content}]
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    images = [fit_image(p, bounds) for p in request.images]
    inputs = processor(text=[text], images=images or None, return_tensors="pt")
    ids = inputs["input_ids"][0]
    grid = inputs.get("image_grid_thw")
    axes = len((model.config.text_config.rope_parameters or {}).get("mrope_section", [])) or 1
    if grid is not None:
        positions, _ = model.model.get_rope_index(
            inputs["input_ids"], mm_token_type_ids=inputs["mm_token_type_ids"], image_grid_thw=grid
        )
        positions = positions[:, 0]
    else:
        positions = torch.arange(ids.shape[0]).view(1, -1).expand(axes, -1)
    return Prompt(ids=ids, positions=positions, pixel_values=inputs.get("pixel_values"), image_grid_thw=grid)


def load_processor(model: str, **kwargs: Any) -> Any:
    """HunyuanOCR's processor. transformers declares both image processors as needing torchvision,
    although the PIL one does not use it; without torchvision (CPU machines), build the processor
    from the PIL image processor and the tokenizer directly."""
    from transformers import AutoProcessor

    try:
        return AutoProcessor.from_pretrained(model, **kwargs)
    except (ImportError, ValueError) as exc:
        # Also when the checkpoint ships custom image-processor code and remote code is not
        # trusted: the official classes below execute nothing from the checkpoint.
        if "torchvision" not in str(exc).lower() and "trust_remote_code" not in str(exc):
            raise
        from transformers import AutoTokenizer
        from transformers.models.hunyuan_vl.image_processing_pil_hunyuan_vl import HunYuanVLImageProcessorPil
        from transformers.models.hunyuan_vl.processing_hunyuan_vl import HunYuanVLProcessor

        log.info("using HunyuanOCR's PIL image processor (%s)", type(exc).__name__)
        kwargs.pop("trust_remote_code", None)
        kwargs.pop("backend", None)
        image_processor = HunYuanVLImageProcessorPil.from_pretrained(model, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(model, **kwargs)
        return HunYuanVLProcessor(image_processor=image_processor, tokenizer=tokenizer)
