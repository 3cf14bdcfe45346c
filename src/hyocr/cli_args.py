"""Argument types the commands share (ocr, batch, bench, eval): a mistyped number or URL is argparse's one-line
error and exit 2 before any work, not a traceback after jobs were submitted."""

from __future__ import annotations

import argparse
import math
import urllib.parse


def seconds(text: str) -> float:
    """A finite number of seconds above 0 (--timeout, --poll)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text}: seconds must be a finite number above 0")
    return value


def server_url(text: str) -> str:
    """An http(s) base URL with a host and a valid port; a trailing /v1 (an OpenAI-style base) is dropped."""
    try:
        parts = urllib.parse.urlsplit(text.strip())
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in 0-65535
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"{text!r}: expected http://HOST:PORT or https://HOST:PORT")
    return text.strip().rstrip("/").removesuffix("/v1")
