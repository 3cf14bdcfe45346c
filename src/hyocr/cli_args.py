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
    """An http(s) base URL with a host and a port in 1-65535 (or none), no credentials, query or fragment; a
    trailing /v1 (an OpenAI-style base) is dropped from its path."""
    import httpx

    def refuse(why: str) -> argparse.ArgumentTypeError:
        return argparse.ArgumentTypeError(f"{why}; expected http://HOST:PORT or https://HOST:PORT")

    text = text.strip()
    try:
        parts = urllib.parse.urlsplit(text)
        port = parts.port  # ValueError for a port that is not a number in 0-65535
        httpx.URL(text)  # what the client will build from it (e.g. "http://[::1]x:80" passes urlsplit)
    except (ValueError, httpx.InvalidURL) as exc:
        raise refuse(str(exc)) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise refuse("not an http(s) address")
    if port == 0 or parts.netloc.endswith(":"):
        raise refuse("no port")
    if parts.username is not None or parts.password is not None:
        raise refuse("credentials in the URL (give the key with --api-key)")
    if parts.query or parts.fragment:
        raise refuse("a query or fragment in a base URL")
    path = parts.path.rstrip("/").removesuffix("/v1").rstrip("/")
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))
