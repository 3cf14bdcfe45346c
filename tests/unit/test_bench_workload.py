"""The benchmark workloads: seeded, reproducible, and the A4 page at the size hyocr's PDF reader renders."""

from __future__ import annotations

from hyocr.bench.workload import SIZES, Workload
from hyocr.hunyuan.geometry import visual_tokens
from hyocr.pipeline.pdf import RenderPlan, default_token_budget


def test_a4_is_the_page_hyocr_renders_for_hunyuanocr():
    width, height = SIZES["a4"]
    assert abs(width / height - 210 / 297) < 0.002  # A4's proportions
    plan = RenderPlan.for_engine(True)
    assert width * height <= plan.max_pixels
    assert visual_tokens(height, width) <= default_token_budget(512 * 512, 2048 * 2048)
    assert 200 <= width / (210 / 25.4) <= 300  # rendered at 200-300 dpi, not a thumbnail


def test_images_are_seeded_and_distinct():
    work = Workload("a4", "x", 16, False, seed=7)
    first, again, other = work.image(0), Workload("a4", "x", 16, False, seed=7).image(0), work.image(1)
    assert first.size == SIZES["a4"]
    assert first.tobytes() == again.tobytes() and first.tobytes() != other.tobytes()
