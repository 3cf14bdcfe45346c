"""The /v1/ocr body comes from the protocol models, byte for byte as it was built by hand before.

``wire_bodies_golden.json`` was captured from the hand-built ``ocr_body``/``page_body`` (and from FastAPI's
rendering of them through ``response_model=OcrResponse``) for the results in ``wire_cases.py``; a change
that alters a key, its order, an omitted key or a number's formatting fails here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from wire_cases import CASES, HTTP_CASES

from hyocr.api.bodies import ocr_body, page_body
from hyocr.api.protocol import OcrResponse

GOLDEN = json.loads((Path(__file__).parent / "wire_bodies_golden.json").read_text(encoding="utf-8"))


def _dumps(body: dict) -> str:
    assert isinstance(body["created"], int)
    return json.dumps({**body, "created": 0}, ensure_ascii=False)


@pytest.mark.parametrize("name", sorted(CASES))
def test_ocr_body_is_unchanged(name):
    assert _dumps(ocr_body(CASES[name])) == GOLDEN["ocr_body"][name]


@pytest.mark.parametrize("name", sorted(CASES))
def test_page_body_is_unchanged(name):
    for i, page in enumerate(CASES[name].pages):
        assert json.dumps(page_body(page), ensure_ascii=False) == GOLDEN["page_body"][f"{name}/{i}"]


def test_http_rendering_through_the_response_model_is_unchanged():
    app = FastAPI()

    @app.get("/{name}", response_model=OcrResponse)
    def one(name: str):
        return {**ocr_body(HTTP_CASES[name]), "created": 0}

    client = TestClient(app)
    for name in HTTP_CASES:
        assert client.get(f"/{name}").text == GOLDEN["http"][name], name
