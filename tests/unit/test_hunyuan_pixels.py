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
