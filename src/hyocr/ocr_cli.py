"""``hyocr ocr FILE...``: files read in this process (the configured engine, the service's one read path) or
through a server (``--url``), printed as text or JSON.

Mistakes in what was asked are found before the engine loads (seconds for a model): a malformed ``--pages``
or task name, a task the engine cannot run (exit 2, 1 for the task), a missing file or a folder (said at
once; the other files are still read, exit 1).
"""

from __future__ import annotations

import argparse
import asyncio
import stat
import sys
import typing
from pathlib import Path

from .batch.jsontext import readable
from .config import Settings
from .jobs.codec import json_text

PDF_TIMEOUT = 300.0  # --url, a PDF: rendering and the first page come before any answer


def run_ocr(args: argparse.Namespace, settings: Settings) -> int:
    from .batch.local import check_engine_task
    from .batch.pages import check as check_pages
    from .errors import HyocrError, UnsupportedTask
    from .hunyuan.prompts import parse_task

    try:
        check_pages(args.pages)
        task = parse_task(args.task)
        if not args.url:  # a server's engine is the server's to judge
            check_engine_task(task, settings)
    except HyocrError as exc:
        print(f"hyocr: {exc.message}", file=sys.stderr)
        return 1 if isinstance(exc, UnsupportedTask) else 2  # 1: every file would fail for it
    out = _Output(args)
    files = [path for path in args.files if _readable(path, out)]
    if not files:
        return out.finish()
    return run_remote_ocr(args, files, out) if args.url else _run_local(args, settings, files, out)


def _readable(path: Path, out: _Output) -> bool:
    """Is there a file to read at ``path``? (Said now, not after the engine has loaded.)"""
    try:
        mode = path.stat().st_mode
    except (OSError, ValueError) as exc:
        out.failed(path, getattr(exc, "strerror", None) or str(exc))
        return False
    if stat.S_ISDIR(mode):
        out.failed(path, "Is a directory (hyocr batch reads folders)")
        return False
    return True


def _run_local(args: argparse.Namespace, settings: Settings, files: list[Path], out: _Output) -> int:
    from .api.bodies import ocr_body
    from .batch.local import file_call, local_service
    from .errors import HyocrError
    from .types import PageRead, ReadDone

    async def go() -> int:
        async with local_service(settings) as service:
            for path in files:
                try:
                    data = path.read_bytes()
                except OSError as exc:
                    out.failed(path, exc.strerror)
                    continue
                try:
                    call = file_call(data, str(path), vars(args))
                    # The service's one stream: admitted and under the request deadline, as on the server.
                    with _Progress(path) as progress:
                        async for event in service.read(call):  # pages as they finish, then the result
                            if isinstance(event, ReadDone):
                                result = event.result
                            elif isinstance(event, PageRead):
                                progress.page(event.page, event.completed, event.total)
                except HyocrError as exc:
                    out.failed(path, _hint(exc.message if exc.public else "internal error", exc.code, path))
                    continue
                out.result(path, ocr_body(result))
        return out.finish()

    try:
        return asyncio.run(go())
    except HyocrError as exc:  # the engine could not start: said as it is, to whoever runs it
        print(f"hyocr: {exc.message}", file=sys.stderr)
        return 2


def run_remote_ocr(args: argparse.Namespace, files: list[Path], out: _Output) -> int:
    """``hyocr ocr FILE... --url URL``: the same command through the Python client."""
    import os

    from .client import HyocrClient, HyocrClientError

    fields = [f.strip() for f in (args.fields or "").split(",") if f.strip()] or None
    key = args.api_key or os.environ.get("HYOCR_CLIENT_API_KEY")
    with HyocrClient(args.url, api_key=key, timeout=args.timeout or 3.0) as client:
        for path in files:
            try:
                data = path.read_bytes()
                document = _is_document(data)
                with _Progress(path) as progress:
                    result = client.ocr(data, task=args.task, fields=fields, language=args.language,
                                        question=args.question, **(_pdf_options(args) if document else {}),
                                        on_page=progress.page if document else None,
                                        timeout=args.timeout or (PDF_TIMEOUT if document else None))
            except (HyocrClientError, OSError) as exc:
                out.failed(path, _hint(getattr(exc, "strerror", None) or str(exc), getattr(exc, "code", None), path))
                continue
            out.result(path, result.raw)
    return out.finish()


def _hint(message: str, code: str | None, path: Path) -> str:
    """The command that does what was refused: a document longer than one request reads whole in batch."""
    if code == "too_many_pages":
        import shlex

        return f"{message}; all of it: hyocr batch {shlex.quote(str(path))} -o DIR"
    return message


def _is_document(data: bytes) -> bool:
    from .pipeline.media import is_document

    return is_document(data)


def _pdf_options(args: argparse.Namespace) -> dict:
    return {"pages": args.pages, "prefer_text_layer": args.prefer_text_layer or None}


class _Progress:
    """A progress bar on stderr for a document of several pages (a terminal only, as tqdm decides)."""

    def __init__(self, path: Path) -> None:
        self.path, self.bar = path, None

    def page(self, _page: object, done: int, total: int) -> None:
        if total > 1 and self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=self.path.name, unit="page", file=sys.stderr, disable=None,
                            leave=False)
        if self.bar is not None:
            self.bar.update(done - self.bar.n)

    def __enter__(self) -> typing.Self:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()


class _Output:
    """What ``hyocr ocr`` prints, the same in-process and through ``--url``: text per file as it is read
    (flushed, so a pipe sees each file when it is done), or one JSON document at the end; failures one line
    each on stderr, exit status 1 if any file failed."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.json, self.many = args.json, len(args.files) > 1
        self.bodies: list[dict] = []
        self.failures = 0

    def failed(self, path: Path, message: str) -> None:
        print(f"hyocr: {path}: {message}", file=sys.stderr)
        self.failures += 1

    def result(self, path: Path, body: dict) -> None:
        if self.json:
            self.bodies.append({"file": str(path), **body})
            return
        text = f"== {readable(str(path))} ==\n{_human(body)}" if self.many else _human(body)
        print(text, flush=True)

    def finish(self) -> int:
        if self.json and self.bodies:  # a file name that is not UTF-8 as \u escapes: it reads back as the path
            print(json_text(self.bodies if self.many else self.bodies[0], indent=2), flush=True)
        return 1 if self.failures else 0


def _human(body: dict) -> str:
    """Readable text: fields for extraction, else the page text. Pages are named as people and ``--pages``
    count them, from 1 (``--json`` keeps the API's 0-based ``index``)."""
    lines = []
    document = len(body["pages"]) > 1 and any(page.get("source") for page in body["pages"])
    for page in body["pages"]:
        number = page["index"] + 1
        if document:
            lines.append(f"[page {number}]")
        if page.get("fields") is not None:
            lines += [f"{k}: {v}" for k, v in page["fields"].items()]
        elif page["text"]:
            lines.append(page["text"])
        if page.get("error"):  # named once: a PDF page's error may already say "page N: ..."
            error = page["error"]
            lines.append(f"[{error}]" if error.startswith(f"page {number}:") else f"[page {number}: {error}]")
    if body["task"] != body["requested_task"]:
        lines.append(f"[ran task {body['task']!r} instead of {body['requested_task']!r}]")
    return "\n".join(lines)
