"""The fast path of HunyuanOCR's image processor gives exactly transformers' pixel values."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from transformers.models.hunyuan_vl.image_processing_pil_hunyuan_vl import HunYuanVLImageProcessorPil  # noqa: E402

from hyocr.engines.vllm import pixels as hunyuan_pixels  # noqa: E402


@pytest.fixture
def processor():
    hunyuan_pixels.uninstall()
    yield HunYuanVLImageProcessorPil()
    hunyuan_pixels.uninstall()


def _images(sizes, seed=0):
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in sizes]


@pytest.mark.parametrize("sizes", [
    [(1024, 640)],                      # a card, already the processor's size: no resize
    [(1600, 1216), (512, 512)],         # several images in one call
    [(1000, 637), (333, 1201)],         # not multiples of 32: resized by the processor first
    [(3000, 2900)],                     # over max_pixels: scaled down
])
def test_fast_path_gives_identical_pixel_values(processor, sizes):
    images = _images(sizes)
    expected = processor(images=images, return_tensors="np")
    assert hunyuan_pixels.install()
    got = processor(images=images, return_tensors="np")
    assert got["pixel_values"].dtype == expected["pixel_values"].dtype == np.float32
    np.testing.assert_array_equal(got["image_grid_thw"], expected["image_grid_thw"])
    np.testing.assert_array_equal(got["pixel_values"], expected["pixel_values"])


def test_grayscale_and_palette_images_match(processor):
    rng = np.random.default_rng(1)
    gray = Image.fromarray(rng.integers(0, 256, (640, 1024), dtype=np.uint8), "L")
    palette = gray.convert("P")
    expected = processor(images=[gray, palette], return_tensors="np")["pixel_values"]
    hunyuan_pixels.install()
    np.testing.assert_array_equal(processor(images=[gray, palette], return_tensors="np")["pixel_values"], expected)


def test_float_input_takes_the_original_path(processor, monkeypatch):
    calls = []
    hunyuan_pixels.install()
    original = hunyuan_pixels._original["preprocess"]
    monkeypatch.setitem(hunyuan_pixels._original, "preprocess",
                        lambda *a, **k: calls.append(1) or original(*a, **k))
    floats = np.random.default_rng(2).random((3, 64, 64)).astype(np.float32)
    processor(images=[floats], return_tensors="np", do_rescale=False)
    assert calls == [1]


def test_uninstall_restores_transformers_method(processor):
    original = HunYuanVLImageProcessorPil._preprocess
    hunyuan_pixels.install()
    assert HunYuanVLImageProcessorPil._preprocess is hunyuan_pixels.fast_preprocess
    hunyuan_pixels.uninstall()
    assert HunYuanVLImageProcessorPil._preprocess is original


def test_bytes_normalised_in_the_engine_process_are_exactly_the_float_values(processor, tmp_path, monkeypatch):
    """uint8 mode: the API process sends the patch bytes, vision.normalised turns them into the values the
    float path sends, bit for bit, with the table made from the checkpoint's preprocessor_config.json."""
    import json

    from hyocr.engines.vllm import vision

    images = _images([(1024, 640), (512, 544)], seed=3)
    hunyuan_pixels.install()
    floats = processor(images=images, return_tensors="np")["pixel_values"]
    hunyuan_pixels.install(uint8=True)
    # only vLLM's own processor calls get bytes: another user of the class (the transformers engine) floats
    assert processor(images=images, return_tensors="np")["pixel_values"].dtype == np.float32
    with hunyuan_pixels.for_vllm():
        got = processor(images=images, return_tensors="pt")
    assert got["pixel_values"].dtype == torch.uint8 and got["pixel_values"].shape == floats.shape
    config = tmp_path / "preprocessor_config.json"
    # 1.5's layout: the settings under processor_config.json's image_processor
    config.write_text(json.dumps({"image_processor": {"image_mean": processor.image_mean,
                                                      "image_std": processor.image_std,
                                                      "rescale_factor": processor.rescale_factor}}))
    monkeypatch.setenv(vision.ENV_PIXELS, str(config))
    monkeypatch.setattr(vision, "_tables", {})
    values = vision.normalised(got["pixel_values"])
    assert values.dtype == torch.float32
    np.testing.assert_array_equal(values.numpy(), floats)
    # float input (vLLM's dummy inputs at start) passes as it is
    same = torch.from_numpy(floats)
    assert vision.normalised(same) is same


def test_bytes_without_a_processor_config_are_refused(monkeypatch):
    from hyocr.engines.vllm import vision

    monkeypatch.delenv(vision.ENV_PIXELS, raising=False)
    monkeypatch.setattr(vision, "_tables", {})
    with pytest.raises(RuntimeError, match="names no processor config"):
        vision.normalised(torch.zeros((4, 768), dtype=torch.uint8))
