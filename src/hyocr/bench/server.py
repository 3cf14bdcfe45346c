"""``hyocr bench --engine NAME``: hyocr served in this process on a free loopback port, for the run.

The load generator then measures it over real HTTP exactly as it measures ``--url`` targets (the
client shares this process's CPU; on a GPU engine that is noise, on CPU engines it is not).
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Self

import httpx
import uvicorn

from ..config import Settings, SettingsError, load_settings
from . import BenchError


def parse_sets(items: list[str] | None) -> dict[str, str]:
    """``--set max_num_seqs=32`` (dashes allowed) -> {"max_num_seqs": "32"}; Settings validates the values."""
    sets: dict[str, str] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise BenchError(f"--set {item!r}: expected KEY=VALUE")
        if key not in Settings.model_fields:
            raise BenchError(f"--set {key}: not a hyocr setting (see hyocr serve --help)")
        sets[key] = value
    return sets


def engine_settings(engine: str, model: str | None, sets: dict[str, str]) -> Settings:
    # The UI is off unless asked for: it is not benchmarked, and Gradio takes seconds to import.
    overrides: dict[str, object] = {"ui": False, **sets, "engine": engine}
    if model is not None:
        overrides["model"] = model
    try:
        return load_settings(**overrides)
    except SettingsError as exc:
        raise BenchError(str(exc)) from None


def public_settings(engine: str, model: str | None, sets: dict[str, str]) -> dict:
    """What the result records about the server it started; secrets (SecretStr settings) are masked."""
    shown = {k: ("***" if "SecretStr" in str(Settings.model_fields[k].annotation) else v) for k, v in sets.items()}
    return {"engine": engine, "model": model, **shown}


class InProcessServer:
    """``build_app`` served by uvicorn in a thread (as tests/servers.py's LiveServer), until ``stop``."""

    def __init__(self, settings: Settings, headers: dict[str, str] | None = None) -> None:
        from ..api.app import build_app  # FastAPI and the engine: only for --engine

        try:
            app = build_app(settings)
        except SettingsError as exc:  # unknown engine, its extra not installed, a setting it needs
            hint = " (hyocr bench takes server settings as --set name=value)" if "--" in str(exc) else ""
            raise BenchError(f"{exc}{hint}") from None
        self.headers = headers  # /ready needs credentials when HYOCR_PUBLIC_READY=false
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5,
                                proxy_headers=False, access_log=False)
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]},
                                        name="hyocr-bench-server", daemon=True)

    def start(self, timeout: float = 900.0) -> InProcessServer:
        """Returns once /ready answers 200 (a model engine may take minutes to load)."""
        self._thread.start()
        deadline = time.monotonic() + timeout
        while True:
            if not self._thread.is_alive():
                self.stop()
                raise BenchError("the in-process server stopped during start-up (the engine failed to start: "
                                 "see the log above)")
            if self.server.started and self._ready():
                return self
            if time.monotonic() > deadline:
                self.stop()
                raise BenchError(f"the in-process server was not ready after {timeout:.0f} s")
            time.sleep(0.05)

    def _ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/ready", timeout=5, headers=self.headers).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        self.server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=60)
        self._sock.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
