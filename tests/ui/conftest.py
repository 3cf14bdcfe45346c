"""The browser and a fresh tab on the UI, for every browser test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from browser import chromium, open_ui


@pytest.fixture(scope="module")
def browser() -> Iterator:
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser, rapid_server):
    with open_ui(browser, rapid_server) as tab:
        yield tab
