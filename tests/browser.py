"""A real browser for the web UI's tests: Debian's Chromium, headless, driven by Playwright.

Never a downloaded browser: /usr/bin/chromium comes from the distribution (.ci/run installs it).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts" / "ui"
TIMEOUT_MS = 60_000  # a cold first run on a 2-core CI machine


@contextmanager
def chromium() -> Iterator:
    from playwright.sync_api import sync_playwright

    if not CHROMIUM.exists():
        raise RuntimeError(f"{CHROMIUM} is missing: apt-get install chromium (see .ci/run)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def open_ui(browser, server) -> Iterator:
    """A fresh page on the server's /ui that fails the test if it asks anything of another host."""
    context = browser.new_context(viewport={"width": 1320, "height": 1000}, accept_downloads=True)
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    outside: list[str] = []
    page.on("request", lambda r: outside.append(r.url)
            if not r.url.startswith((server.url, "data:", "blob:")) else None)
    page.goto(server.url + "/ui")
    page.locator("#hy-run").wait_for()
    yield page
    context.close()
    assert not outside, f"the UI fetched from outside the server: {outside}"


def upload(page, folder: Path, files: dict[str, bytes]) -> None:
    paths = []
    for name, data in files.items():
        (folder / name).write_bytes(data)
        paths.append(str(folder / name))
    page.locator("#hy-files input[type=file]").set_input_files(paths)


def choose_task(page, label: str) -> None:
    page.locator("#hy-task input").click()
    page.get_by_role("option", name=label).click()


def status(page) -> str:
    return page.locator("#hy-status").inner_text()


def shot(page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
