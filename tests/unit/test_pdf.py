"""PDF rules as pure functions: page selection, the DPI per page, trusting a text layer."""

from __future__ import annotations

import dataclasses

import pytest

from hyocr.config import SettingsError, load_settings
from hyocr.errors import InvalidRequest, PayloadTooLarge
from hyocr.hunyuan.geometry import PixelBounds, smart_resize, visual_tokens
from hyocr.pipeline.pdf import RenderPlan, default_token_budget
from hyocr.pipeline.pdf_worker import (
    choose_dpi,
    clean_text_layer,
    parse_pages,
    pixels_at,
    text_layer_reliable,
)

A4, LETTER, A0 = (595, 842), (612, 792), (2384, 3370)
HUNYUAN = RenderPlan.for_engine(follows_prompts=True)  # the defaults: 512^2..2048^2 pixels, 4162 tokens
DETECTOR = RenderPlan.for_engine(follows_prompts=False)  # rapidocr: 150 dpi within 40 MP


# --------------------------------------------------------------------------- pages=2-5,8


@pytest.mark.parametrize(("spec", "expected"), [
    (None, (0, 1, 2, 3, 4, 5, 6, 7, 8, 9)),
    ("", tuple(range(10))),
    ("all", tuple(range(10))),
    ("3", (2,)),
    ("2-5,8", (1, 2, 3, 4, 7)),
    (" 8 , 2 - 3 ", (1, 2, 7)),  # spaces tolerated, page order whatever the order asked
    ("4-6,5-7,1", (0, 3, 4, 5, 6)),  # overlaps merged, each page once
    ("9-", (8, 9)),  # to the end
    ("10", (9,)),
])
def test_page_selection(spec, expected):
    assert parse_pages(spec, 10, max_pages=64) == expected


@pytest.mark.parametrize(("spec", "message"), [
    ("11", "page 11 is out of range; the document has 10 pages"),
    ("2-12", "page 12 is out of range; the document has 10 pages"),
    ("11-", "page 11 is out of range; the document has 10 pages"),  # open-ended, past the end
    ("0", "the first page is 1"),
    ("5-2", "'5-2' is not a range of pages (a range runs from its first page to its last)"),
    ("x", "'x' is not a page number or range"),
    ("1,,2", "'' is not a page number"),
    ("-3", "'-3' is not a page number"),
    ("1.5", "not a page number"),
    ("\uff11", "not a page number"),  # a fullwidth digit: page numbers are ASCII
])
def test_bad_page_selections_are_400s_that_say_why(spec, message):
    with pytest.raises(InvalidRequest) as exc:
        parse_pages(spec, 10, max_pages=64)
    assert exc.value.status == 400 and exc.value.param == "pages" and exc.value.code == "invalid_pages"
    assert message in exc.value.message


def test_one_page_document_says_page_not_pages():
    with pytest.raises(InvalidRequest, match="the document has 1 page$"):
        parse_pages("2", 1, max_pages=64)


def test_the_page_cap_applies_to_the_pages_read_and_is_checked_before_listing_them():
    assert parse_pages("4999-5000", 5000, max_pages=64) == (4998, 4999)
    with pytest.raises(InvalidRequest) as exc:
        parse_pages(None, 5000, max_pages=64)
    assert exc.value.code == "too_many_pages" and "the document has 5000 pages" in exc.value.message
    assert "pages=1-64" in exc.value.message and "/v1/jobs, hyocr batch" in exc.value.message
    with pytest.raises(InvalidRequest, match="pages=300-363"):  # the hint starts where the selection does
        parse_pages("300-", 5000, max_pages=64)
    with pytest.raises(InvalidRequest, match="pages selects 1000000000 pages; at most 64"):
        parse_pages("1-1000000000", 10**9, max_pages=64)  # a hostile /Count: nothing is materialised


# --------------------------------------------------------------------------- DPI per page


def test_default_token_budget_is_a_max_pixels_square_page():
    assert default_token_budget(512 * 512, 2048 * 2048) == 4162 == visual_tokens(2048, 2048)
    assert HUNYUAN.token_budget == 4162 and HUNYUAN.bounds == (512 * 512, 2048 * 2048)


@pytest.mark.parametrize(("size", "dpi"), [(A4, 208), (LETTER, 210), ((842, 1191), 147), (A0, 52),
                                            ((243, 153), 300), ((226, 600), 300)])
def test_hunyuan_pages_get_the_highest_dpi_within_pixels_and_tokens(size, dpi):
    assert choose_dpi(*size, HUNYUAN) == dpi
    width, height = pixels_at(*size, dpi)
    bounds = PixelBounds(*HUNYUAN.bounds)
    assert width * height <= HUNYUAN.max_pixels and visual_tokens(height, width, bounds) <= 4162
    if dpi < HUNYUAN.max_dpi:  # one more dpi would break a bound
        w2, h2 = pixels_at(*size, dpi + 1)
        assert w2 * h2 > HUNYUAN.max_pixels or visual_tokens(h2, w2, bounds) > 4162


def test_a4_at_its_dpi_costs_what_the_model_would_see():
    width, height = pixels_at(*A4, 208)
    assert (width, height) == (1719, 2433)
    assert smart_resize(height, width) == (2432, 1696)  # the 32-pixel grid
    assert visual_tokens(height, width) == (2432 // 32) * (1696 // 32 + 1) + 2 == 4106


def test_a_smaller_token_budget_lowers_the_dpi():
    plan = dataclasses.replace(HUNYUAN, token_budget=1500)
    dpi = choose_dpi(*A4, plan)
    width, height = pixels_at(*A4, dpi)
    assert dpi == 124 and visual_tokens(height, width) <= 1500 < visual_tokens(*reversed(pixels_at(*A4, dpi + 1)))


def test_the_detector_reads_at_its_fixed_dpi_lowered_only_past_the_pixel_cap():
    assert DETECTOR.fixed_dpi == 150
    assert choose_dpi(*A4, DETECTOR) == 150 and pixels_at(*A4, 150) == (1240, 1755)
    assert choose_dpi(*A0, DETECTOR) == 150  # 4967x7021 = 34.9 MP < 40 MP
    assert choose_dpi(*A0, dataclasses.replace(DETECTOR, max_pixels=12_000_000)) == 87


@pytest.mark.parametrize("plan", [HUNYUAN, DETECTOR])
@pytest.mark.parametrize("side", [14400, 10**9])  # the PDF maximum, and absurd
def test_a_giant_page_is_413_naming_its_size(plan, side):
    with pytest.raises(PayloadTooLarge) as exc:
        choose_dpi(side, side, plan)
    assert exc.value.code == "pdf_page_too_large" and "even at 36 dpi" in exc.value.message


def test_a_page_past_the_models_aspect_limit_is_400_but_a_detector_reads_it():
    with pytest.raises(InvalidRequest, match="aspect ratio"):
        choose_dpi(14400, 60, HUNYUAN)
    assert choose_dpi(14400, 60, DETECTOR) == 150


def test_dpi_settings_are_validated():
    plan = RenderPlan.for_engine(True, load_settings(pdf_max_dpi=150, max_pixels=1024 * 1024))
    assert plan.max_dpi == 150 and plan.token_budget == visual_tokens(1024, 1024, PixelBounds(512 * 512, 1024 * 1024))
    assert choose_dpi(*A4, plan) == 104
    assert RenderPlan.for_engine(False, load_settings(pdf_detector_dpi=200)).fixed_dpi == 200
    with pytest.raises(SettingsError, match="pdf_min_dpi"):
        load_settings(pdf_min_dpi=400)
    with pytest.raises(SettingsError, match="max_pages"):
        load_settings(max_pages=0)


# --------------------------------------------------------------------------- text layer


@pytest.mark.parametrize(("text", "reliable"), [
    ("Invoice 2024-117\r\nTotal due: 1,280.00 EUR", True),
    ("发票号码 12345678 金额 128.50 元 购买方", True),
    ("3", False),  # a page number on a scanned page
    ("", False),
    ("\x03\x04\x05\x06\x07\x08\x0e\x0f\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19", False),  # no ToUnicode map
    ("Inv\ufffdice T\ufffdtal \ufffd\ufffd\ufffd 1\ufffd80", False),  # replacement characters
    ("\ue000\ue001\ue002\ue003\ue004\ue005\ue006\ue007\ue008\ue009\ue00a\ue00b\ue00c\ue00d\ue00e\ue00f", False),
])
def test_text_layer_trust(text, reliable):
    assert text_layer_reliable(text) is reliable


def test_text_layer_cleaning():
    assert clean_text_layer("Line one  \r\nLine two\r\n\r\n\r\n\r\nLast\r\n") == "Line one\nLine two\n\nLast"
