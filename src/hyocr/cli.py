"""Command line: ``hyocr serve`` runs the API; ``hyocr ocr FILE...`` runs the same pipeline in-process;
``hyocr batch INPUT... --output DIR`` reads many documents, resumably (its logic is in hyocr/batch/).

Heavy imports (FastAPI, uvicorn, engines) happen inside the subcommand that needs them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import typing
from pathlib import Path

from . import __version__
from .config import Settings, SettingsError, load_settings

TASK_HELP = "spotting | text | document | formula | table | chart | extract | subtitles | translate | vqa"
PDF_TIMEOUT = 300.0  # --url, a PDF: rendering and the first page come before any answer


def _settings_flags(p: argparse.ArgumentParser, *, skip: tuple[str, ...] = ()) -> None:
    """One flag per setting (``--max-image-bytes`` for HYOCR_MAX_IMAGE_BYTES), generated from the
    Settings model so the CLI, the environment and the README table cannot drift apart."""
    group = p.add_argument_group("settings (each also HYOCR_<NAME> in the environment)")
    for name, field in Settings.model_fields.items():
        if name in skip:
            continue
        flag = "--" + name.replace("_", "-")
        kind, choices = _flag_type(field.annotation)
        default = field.default if field.default is not None else "unset"
        help_text = f"{field.description or ''} [default: {default}]".strip()
        if kind is bool:
            group.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            group.add_argument(flag, dest=name, type=kind, choices=choices, default=None, help=help_text)


def _flag_type(annotation: object) -> tuple[type, list | None]:
    if typing.get_origin(annotation) is typing.Literal:
        return str, list(typing.get_args(annotation))
    if typing.get_origin(annotation) is tuple:
        return str, None  # comma-separated; Settings splits and validates
    options = [a for a in typing.get_args(annotation) if a is not type(None)]
    if options:  # X | None
        return _flag_type(options[0])
    if annotation in (bool, int, float):
        return annotation, None  # type: ignore[return-value]
    return str, None  # str, SecretStr: validated by Settings


LOCAL_SKIP = ("host", "port", "drain_timeout", "ui", "ui_upload_cache_bytes", "ui_upload_ttl", "metrics_port",
              "metrics_host")  # settings of a server, not of a read in this process


def _read_flags(p: argparse.ArgumentParser) -> None:
    """How documents are read: ``ocr`` and ``batch`` take the same options (a manifest line overrides)."""
    p.add_argument("--task", default="spotting", help=TASK_HELP)
    p.add_argument("--fields", help="comma-separated field names for --task extract")
    p.add_argument("--language", default="en", help="translation target for --task translate: en | zh")
    p.add_argument("--question", help="the question for --task vqa")
    p.add_argument("--pages", help="PDF files: the pages to read, 1-based, e.g. 1-3,8 (default all)")
    p.add_argument("--prefer-text-layer", dest="prefer_text_layer", action="store_true",
                   help="PDF files, --task text: take a page's own text when it is reliable instead of OCR")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hyocr", description="OCR service for HunyuanOCR.")
    parser.add_argument("--version", action="version", version=f"hyocr {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="serve the HTTP API (OpenAI-compatible and /v1/ocr)")
    _settings_flags(serve)

    ui = sub.add_parser("ui", help="serve the web UI (with the API) on port 7860: http://127.0.0.1:7860/ui")
    ui.add_argument("--port", type=int, default=7860, help="[default: 7860]")
    _settings_flags(ui, skip=("ui", "port"))
    ui.set_defaults(ui=True)

    ocr = sub.add_parser("ocr", help="recognise text in image and PDF files, in-process (no server)")
    ocr.add_argument("files", nargs="+", type=Path, metavar="FILE")
    _read_flags(ocr)
    ocr.add_argument("--json", action="store_true", help="print the full JSON result")
    ocr.add_argument("--url", help="send the files to a running hyocr server instead of running in-process")
    ocr.add_argument("--api-key", dest="api_key", help="--url: the server's API key (or HYOCR_CLIENT_API_KEY)")
    ocr.add_argument("--timeout", type=float, help=f"--url: seconds per attempt (default 3; {PDF_TIMEOUT:g} for "
                     "a PDF, which streams its pages: the wait until the first page, then between pages)")
    _settings_flags(ocr, skip=LOCAL_SKIP)

    batch = sub.add_parser("batch", help="read many documents into a folder, resumably (hyocr/batch/)",
                           description="Read files, folders, globs and .jsonl manifests ({'path', 'task', "
                           "'pages'} a line) into DIR: a JSON result per document, summary.json; a rerun "
                           "skips what is done and retries what failed (DIR/.hyocr-batch.jsonl).")
    batch.add_argument("inputs", nargs="+", metavar="INPUT")
    batch.add_argument("--output", "-o", required=True, type=Path, metavar="DIR")
    _read_flags(batch)
    batch.add_argument("--url", help="submit the documents as jobs to a running hyocr server (/v1/jobs)")
    batch.add_argument("--api-key", dest="api_key", help="--url: the server's key (or HYOCR_CLIENT_API_KEY)")
    batch.add_argument("--timeout", type=float, default=60.0, help="--url: seconds per request attempt")
    batch.add_argument("--poll", type=float, default=1.0, help="--url: seconds between looks at a job")
    batch.add_argument("--max-retries", dest="max_retries", type=int, default=2,
                       help="a failed document is read again by a rerun, up to 1 + this many attempts in all")
    batch.add_argument("--workers", type=int, default=2, help="documents read at once (in-process)")
    batch.add_argument("--table", choices=["jsonl", "parquet"],
                       help="also write DIR/pages.jsonl or DIR/pages.parquet: a row a page of every document done")
    _settings_flags(batch, skip=LOCAL_SKIP)

    bench = sub.add_parser(
        "bench", help="load-test a server (running, or started here) and report; 'bench compare' compares results",
        description="Load-test an OpenAI-compatible OCR server (--url) or hyocr started in this process "
                    "(--engine), one level per concurrency. 'hyocr bench compare A.json B.json ...' puts "
                    "result files side by side, with ratios to the first.")
    target = bench.add_mutually_exclusive_group()
    target.add_argument("--url", help="server base URL, e.g. http://127.0.0.1:8000")
    target.add_argument("--engine", metavar="NAME",
                        help="start hyocr with this engine in-process on loopback and benchmark it: "
                        "rapidocr | vllm | transformers | openai | fake")
    bench.add_argument("--model", help="--engine: the model id/path (or the fake engine's script)")
    bench.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="--engine: any server setting, e.g. --set max_num_seqs=32 (repeatable)")
    bench.add_argument("--api-key", dest="api_key",
                       help="sent as a Bearer token to the API and /metrics (or HYOCR_CLIENT_API_KEY)")
    bench.add_argument("--metrics-url", dest="metrics_url",
                       help="where the server's Prometheus metrics are, for peak GPU memory "
                       "(default URL/metrics; local nvidia-smi when they have no GPU gauge)")
    bench.add_argument("--workload", choices=["card", "page", "a4"], default="card",
                       help="card: 1024x640; page: 1600x1200; a4: an A4 page at the DPI hyocr picks for "
                       "HunyuanOCR, 1720x2433 (seeded synthetic text images)")
    bench.add_argument("--concurrency", default="1,8,32", help="comma-separated levels")
    bench.add_argument("--requests", help="requests per level, one number or one per level "
                       "(default max(32, 4 x concurrency))")
    bench.add_argument("--clients", type=int, default=0,
                       help="load-generator processes per level (default: one per 16 concurrent streams)")
    bench.add_argument("--max-tokens", dest="max_tokens", type=int, default=150)
    bench.add_argument("--fixed-output", dest="fixed_output", action="store_true",
                       help="ignore end-of-sequence: exactly --max-tokens per request (engine comparisons)")
    bench.add_argument("--prompt", help="instruction sent with each image (default: the text task prompt)")
    bench.add_argument("--warmup", type=int, default=4, help="requests sent before measuring")
    bench.add_argument("--seed", type=int, default=1234)
    bench.add_argument("--label", help="name of this run in reports")
    bench.add_argument("--timeout", type=float, default=600.0, help="per-request timeout, seconds")
    bench.add_argument("--output", help="write the JSON result here")
    bench.add_argument("--markdown", help="write the markdown table here")
    bench.add_argument("--plot", help="write req/s and p99 latency vs concurrency here (PNG; extra bench)")
    # Optional, so `hyocr bench --url ...` parses exactly as before compare existed.
    bench_sub = bench.add_subparsers(dest="bench_command", metavar="compare")
    compare = bench_sub.add_parser("compare", help="compare result files; the first is the baseline",
                                   description="Result files side by side: a summary and a row per run and "
                                   "concurrency, with req/s and latency as ratios of the first file's.")
    compare.add_argument("files", nargs="+", metavar="RESULT.json")
    compare.add_argument("--output", help="write the markdown here")
    compare.add_argument("--plot", help="write req/s and p99 latency vs concurrency here (PNG; extra bench)")
    from .eval.command import add_parser as add_eval_parser  # hyocr eval: its options live in hyocr/eval/

    add_eval_parser(sub)
    return parser


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings(**{k: getattr(args, k, None) for k in Settings.model_fields})


def _setup_logging(level: str, fmt: str = "text") -> None:
    from .observability.logs import setup_logging

    setup_logging(level, fmt)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "bench":
        from .bench.run import main as bench_main

        return bench_main(args)
    if args.command == "eval":  # its own settings (--engine, --set), as bench's
        from .eval.command import main as eval_main

        return eval_main(args)
    try:
        settings = _settings(args)
        serving = args.command in ("serve", "ui")
        _setup_logging(settings.log_level if serving else "warning", settings.log_format if serving else "text")
        if serving:
            from .observability.tracing import setup_tracing

            setup_tracing(settings.otel_endpoint)
        if args.command in ("serve", "ui"):
            return serve(settings)
        if args.command == "batch":
            from .batch import main as batch_main

            return batch_main(args, settings)
        return run_ocr(args, settings)
    except SettingsError as exc:
        print(f"hyocr: {exc}", file=sys.stderr)
        return 2


def serve(settings: Settings) -> int:
    import uvicorn

    from .api.app import build_app
    from .api.serving import warn_if_exposed
    from .server.uvicorn import Server, uvicorn_options

    if settings.gil_switch_interval:
        sys.setswitchinterval(settings.gil_switch_interval)
    warn_if_exposed(settings)
    if settings.ray:  # the API and the engine replicas as a Ray Serve application
        from .ray.serve import run

        return run(settings)
    if settings.api_processes > 1:  # several front ends sharing one vLLM engine core
        from .server.processes import serve as serve_processes

        return serve_processes(settings)
    app = build_app(settings)
    # uvicorn drains in-flight requests on SIGTERM/SIGINT, then re-raises the signal to the
    # process's previous handler. A no-op handler there makes a drained stop exit 0, as
    # supervisors (systemd, Kubernetes) expect of a clean shutdown.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    # uvicorn.Server, not uvicorn.run: the server tells the app when the drain starts (server/uvicorn.py).
    server = Server(uvicorn.Config(app, host=settings.host, port=settings.port, **uvicorn_options(settings)),
                    drain=app.state.drain)
    server.run()
    if not server.started:  # the lifespan failed (the engine did not start), as uvicorn.run reports it
        return 3
    return 0


def run_remote_ocr(args: argparse.Namespace) -> int:
    """``hyocr ocr FILE... --url URL``: the same command through the Python client."""
    import os

    from .client import HyocrClient, HyocrClientError

    fields = [f.strip() for f in (args.fields or "").split(",") if f.strip()] or None
    key = args.api_key or os.environ.get("HYOCR_CLIENT_API_KEY")
    out = _Output(args)
    with HyocrClient(args.url, api_key=key, timeout=args.timeout or 3.0) as client:
        for path in args.files:
            try:
                data = path.read_bytes()
                document = _is_pdf(data)
                with _Progress(path) as progress:
                    result = client.ocr(data, task=args.task, fields=fields, language=args.language,
                                        question=args.question, **(_pdf_options(args) if document else {}),
                                        on_page=progress.page if document else None,
                                        timeout=args.timeout or (PDF_TIMEOUT if document else None))
            except (HyocrClientError, OSError) as exc:
                out.failed(path, getattr(exc, "strerror", None) or str(exc))
                continue
            out.result(path, result.raw)
    return out.finish()


def _is_pdf(data: bytes) -> bool:
    from .pipeline.media import is_pdf

    return is_pdf(data)


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


def run_ocr(args: argparse.Namespace, settings: Settings) -> int:
    if args.url:
        return run_remote_ocr(args)
    from .api.bodies import ocr_body
    from .batch.local import file_call, local_service
    from .errors import HyocrError
    from .hunyuan.prompts import parse_task
    from .types import PageRead, ReadDone

    async def go() -> int:
        out = _Output(args)
        async with local_service(settings) as service:
            parse_task(args.task)
            for path in args.files:
                try:
                    data = path.read_bytes()
                except OSError as exc:
                    out.failed(path, exc.strerror)
                    continue
                call = file_call(data, str(path), vars(args))
                try:
                    # The service's one stream: admitted and under the request deadline, as on the server.
                    with _Progress(path) as progress:
                        async for event in service.read(call):  # pages as they finish, then the result
                            if isinstance(event, ReadDone):
                                result = event.result
                            elif isinstance(event, PageRead):
                                progress.page(event.page, event.completed, event.total)
                except HyocrError as exc:
                    out.failed(path, exc.message if exc.public else "internal error")
                    continue
                out.result(path, ocr_body(result))
        return out.finish()

    try:
        return asyncio.run(go())
    except HyocrError as exc:  # bad task name etc.
        print(f"hyocr: {exc.message}", file=sys.stderr)
        return 2


class _Output:
    """What ``hyocr ocr`` prints, the same in-process and through ``--url``: text per file (or one
    JSON document at the end), failures one line each on stderr, exit status 1 if any file failed."""

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
        if self.many:
            print(f"== {path} ==")
        print(_human(body))

    def finish(self) -> int:
        if self.json and self.bodies:
            print(json.dumps(self.bodies if self.many else self.bodies[0], ensure_ascii=False, indent=2))
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
