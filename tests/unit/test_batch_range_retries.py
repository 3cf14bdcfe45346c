"""``hyocr batch``'s in-process reader (batch/readers.py LocalReader._range) when a range fails part way, with a
scripted service in place of OcrService.read (the real one is in tests/e2e/test_batch_ranges.py): pages read
before a 5xx are kept and only the rest is asked again, at once; a 5xx with no page read is tried again after a
backoff, up to the reader's retries; a deadline that passes without a page, or a 4xx, fails the range."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from hyocr.batch import readers
from hyocr.batch.partial import Partial
from hyocr.batch.readers import LocalReader, ReadFailed
from hyocr.errors import GatewayTimeout, InvalidRequest, ServiceUnavailable
from hyocr.types import PageRead, PageResult


@dataclass
class Call:
    pages: str
    document_range: bool = False


def _pages(spec: str) -> list[int]:
    out = []
    for part in spec.split(","):
        first, _, last = part.partition("-")
        out += range(int(first) - 1, int(last or first))
    return out


class Script:
    """Each read: read ``n`` of the asked pages, then raise ``error`` (or end)."""

    max_pages = 100

    def __init__(self, *steps: tuple[int, Exception | None]) -> None:
        self.steps, self.asked = list(steps), []

    async def read(self, call):
        self.asked.append(call.pages)
        n, error = self.steps.pop(0)
        for position, index in enumerate(_pages(call.pages)[:n]):
            yield PageRead(position, PageResult(index, 100, 100, f"page {index}"), position + 1, n)
        if error is not None:
            raise error


class Ticket:
    def __init__(self) -> None:
        self.pages = 0

    def on_page(self) -> None:
        self.pages += 1


@pytest.fixture
def sleeps(monkeypatch):
    """The reader's backoff, recorded instead of waited (asyncio.sleep itself is left alone: servers of other
    test modules still running in threads of this process poll with it)."""
    slept: list[float] = []

    async def sleep(seconds):
        slept.append(seconds)

    monkeypatch.setattr(readers, "backoff", sleep)
    return slept


def _range(script: Script, tmp_path, chunk=(0, 1, 2, 3)) -> tuple[Partial, Ticket]:
    parts, ticket = Partial(tmp_path, "doc.json", "sha", "opts"), Ticket()
    reader = LocalReader(script, range_pages=4, retries=3)
    asyncio.run(reader._range(Call("1-4"), list(chunk), parts, ticket, lone=False))
    return parts, ticket


def test_pages_read_before_a_5xx_are_kept_and_only_the_rest_is_asked_again(tmp_path, sleeps):
    script = Script((2, ServiceUnavailable("engine restarting")), (1, ServiceUnavailable("again")), (1, None))
    parts, ticket = _range(script, tmp_path)
    assert script.asked == ["1-4", "3-4", "4"] and sleeps == []  # progress: tried again at once
    assert sorted(parts.pages) == [0, 1, 2, 3] and ticket.pages == 4
    # kept on disk as they finished: a later run (or attempt) finds them
    assert sorted(Partial(tmp_path, "doc.json", "sha", "opts").pages) == [0, 1, 2, 3]


def test_a_5xx_without_progress_is_retried_with_backoff_up_to_the_reader_s_retries(tmp_path, sleeps):
    script = Script((0, ServiceUnavailable("busy")), (0, ServiceUnavailable("busy")), (4, None))
    parts, _ = _range(script, tmp_path)
    assert script.asked == ["1-4"] * 3 and sleeps == [2.0, 4.0] and len(parts.pages) == 4
    script = Script(*[(0, ServiceUnavailable("busy"))] * 3)
    with pytest.raises(ReadFailed, match="pages 1-4: busy"):
        _range(script, tmp_path / "b")
    assert len(script.asked) == 3


@pytest.mark.parametrize("error", [GatewayTimeout("past the deadline"), InvalidRequest("bad page")])
def test_a_deadline_without_a_page_or_a_4xx_fails_the_range_at_once(tmp_path, sleeps, error):
    script = Script((0, error))
    with pytest.raises(ReadFailed):
        _range(script, tmp_path)
    assert script.asked == ["1-4"] and sleeps == []
