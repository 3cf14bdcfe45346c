"""An engine exception's chain, in the log and (its root's type only) in the client's message (errors.py).
vLLM raises ``EngineGenerateError()``, with no message, ``from`` the real error: issue 29's GPU log said
``EngineGenerateError: `` and nothing else."""

from __future__ import annotations

import logging
import sys

from hyocr.errors import (
    CHAIN_LINKS,
    CHAIN_MESSAGE_CHARS,
    EngineError,
    InvalidRequest,
    ServiceUnavailable,
    engine_failure,
    exception_chain,
    root_cause_type,
)


class EngineGenerateError(Exception):  # vLLM's name
    pass


class OutOfMemoryError(RuntimeError):  # torch's name
    pass


def _raised(build):
    try:
        build()
    except BaseException as exc:  # noqa: BLE001 - the test wants whatever was raised, with its chain
        return exc
    raise AssertionError("nothing raised")


def _vllm_missing_backend():
    try:
        raise ModuleNotFoundError("No module named 'lmformatenforcer'", name="lmformatenforcer")
    except ImportError as exc:
        raise EngineGenerateError() from exc


def test_the_chain_names_every_cause_outermost_first():
    exc = _raised(_vllm_missing_backend)
    assert exception_chain(exc) == "EngineGenerateError <- ModuleNotFoundError: No module named 'lmformatenforcer'"
    assert root_cause_type(exc) == "ModuleNotFoundError"


def test_an_exception_raised_while_handling_another_is_chained_unless_raised_from_none():
    def during():
        try:
            raise KeyError("pixel_values")
        except KeyError:
            raise RuntimeError("shape mismatch")

    assert exception_chain(_raised(during)) == "RuntimeError: shape mismatch <- KeyError: 'pixel_values'"

    def suppressed():
        try:
            raise KeyError("x")
        except KeyError:
            raise RuntimeError("clean") from None

    assert exception_chain(_raised(suppressed)) == "RuntimeError: clean"


def test_the_chain_is_bounded_and_one_line():
    exc: BaseException = ValueError("line one\nline two " + "x" * 1000)
    for depth in range(30):
        outer = RuntimeError(f"level {depth}")
        outer.__cause__ = exc
        exc = outer
    text = exception_chain(exc)
    assert "\n" not in text and text.count(" <- ") == CHAIN_LINKS  # 8 links and the "(n more)" mark
    assert text.endswith("<- (23 more)") and len(text) < CHAIN_LINKS * (CHAIN_MESSAGE_CHARS + 40)
    assert root_cause_type(exc) == "ValueError"  # the innermost, past the described links
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__cause__, b.__cause__ = b, a  # a cycle ends
    assert exception_chain(a) == "RuntimeError: a <- RuntimeError: b"


def test_an_unprintable_message_and_an_odd_class_name():
    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("no")

    assert exception_chain(Unprintable()) == "Unprintable: (no printable message)"
    odd = type("Error at /srv/models/x.py:12", (Exception,), {})
    assert root_cause_type(odd("x")) is None  # only a plain class name goes to a client


def test_an_engine_failure_keeps_its_chain_privately_and_shows_the_root_type(caplog):
    with caplog.at_level(logging.DEBUG, logger="hyocr.engines"):
        error = engine_failure(_raised(_vllm_missing_backend), "vLLM generation failed")
    assert isinstance(error, EngineError) and not error.public
    assert error.message == ("vLLM generation failed: EngineGenerateError <- ModuleNotFoundError: "
                             "No module named 'lmformatenforcer'")
    assert error.cause_type == "ModuleNotFoundError"
    assert error.shown("internal error (request id r1)") == "internal error (request id r1): ModuleNotFoundError"
    traceback = next(r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG)
    assert "Traceback (most recent call last)" in traceback and "direct cause" in traceback


def test_a_public_error_shows_its_message_and_an_internal_one_without_a_cause_only_the_fallback():
    assert InvalidRequest("bad field").shown() == "bad field"
    assert EngineError("secret /srv/path").shown("internal error") == "internal error"


def test_out_of_memory_anywhere_in_the_chain_is_the_retryable_503():
    def wrapped():
        try:
            raise OutOfMemoryError("CUDA error")
        except RuntimeError as exc:
            raise EngineGenerateError() from exc

    error = engine_failure(_raised(wrapped), "vLLM generation failed")
    assert isinstance(error, ServiceUnavailable) and error.code == "out_of_memory"


def test_a_json_log_line_names_the_error_and_its_causes_not_a_tracebacks_last_line():
    # SQLAlchemy ends its message with a footnote line; the JSON log kept only that line ("(Background on this
    # error at: https://sqlalche.me/e/21/e3q8)") and lost "database or disk is full" (a helper round, a full disk)
    import json as _json
    import sqlite3

    from sqlalchemy.exc import OperationalError

    from hyocr.observability.logs import JsonFormatter

    try:
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.OperationalError as low:
            raise OperationalError("INSERT INTO hyocr_job_pages ...", {}, low) from low
    except OperationalError:
        record = logging.LogRecord("hyocr.jobs", logging.ERROR, __file__, 1, "range 2 failed", (), sys.exc_info())
    line = _json.loads(JsonFormatter().format(record))
    assert "database or disk is full" in line["error"] and line["error"].startswith("OperationalError")
    assert "\n" not in line["error"]
