"""Command line: ``hyocr serve`` runs the API; ``hyocr ocr FILE...`` runs the same pipeline in-process
(hyocr/ocr_cli.py); ``hyocr batch INPUT... --output DIR`` reads many documents, resumably (hyocr/batch/).

Heavy imports (FastAPI, uvicorn, engines) happen inside the subcommand that needs them. ``ocr`` and
``batch`` take every setting as a flag, as ``serve`` does, but their ``--help`` shows the few they are
used with (``--help-all``: every one). Ctrl-C ends a command with "interrupted" and status 130, a reader
of stdout that went away (``| head``) with status 141, as a shell reports SIGPIPE: never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
import typing
from pathlib import Path

from . import __version__
from .cli_args import seconds, server_url
from .config import Settings, SettingsError, load_settings
from .ocr_cli import PDF_TIMEOUT

EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE
HELP_ALL = "--help-all"
# The settings ``ocr`` and ``batch`` show in --help (the rest: --help-all).
OCR_SETTINGS = ("engine", "model", "device", "request_timeout", "max_pages")
BATCH_SETTINGS = ("engine", "model", "device", "request_timeout", "job_range_pages", "job_max_pages", "ray",
                  "ray_replicas", "object_store_endpoint")


def task_help() -> str:
    """Every task (the Task enum), and which engines run which."""
    from .engines.registry import OCR_ONLY_TASKS, engines_for
    from .hunyuan.prompts import V15_TASKS
    from .types import Task

    anywhere = [t.value for t in Task if t in OCR_ONLY_TASKS]
    model = [t.value for t in Task if t not in OCR_ONLY_TASKS | V15_TASKS]
    return (f"any engine: {' | '.join(anywhere)}; HunyuanOCR ({', '.join(engines_for(Task.DOCUMENT))}): "
            f"{' | '.join(model)}; HunyuanOCR 1.5 also: {' | '.join(t.value for t in Task if t in V15_TASKS)} "
            "[default: spotting]")


def _settings_flags(p: argparse.ArgumentParser, *, skip: tuple[str, ...] = (),
                    shown: tuple[str, ...] | None = None) -> None:
    """One flag per setting (``--max-image-bytes`` for HYOCR_MAX_IMAGE_BYTES), generated from the
    Settings model so the CLI, the environment and the README table cannot drift apart. ``shown``: the
    only ones --help lists (every flag is taken all the same)."""
    if shown is None:
        group = p.add_argument_group("settings (each also HYOCR_<NAME> in the environment)")
    else:
        group = p.add_argument_group("settings", f"the most used (each also HYOCR_<NAME> in the environment); "
                                     f"every setting is a flag: {HELP_ALL} lists them")
    for name, field in Settings.model_fields.items():
        if name in skip:
            continue
        flag = "--" + name.replace("_", "-")
        kind, choices = _flag_type(field.annotation)
        default = field.default if field.default is not None else "unset"
        help_text = f"{field.description or ''} [default: {default}]".strip().replace("%", "%%")  # argparse formats
        if shown is not None and name not in shown:
            help_text = argparse.SUPPRESS
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
              "metrics_host", "metrics_api_keys", "public_metrics")  # settings of a server, not of a read in this process


def _read_flags(p: argparse.ArgumentParser) -> None:
    """How documents are read: ``ocr`` and ``batch`` take the same options (a manifest line overrides)."""
    p.add_argument(HELP_ALL, action="help", help="show this help with every setting flag, then exit")
    p.add_argument("--task", default="spotting", help=task_help())
    p.add_argument("--fields", help="comma-separated field names for --task extract")
    p.add_argument("--language", default="en", help="translation target for --task translate: en | zh")
    p.add_argument("--question", help="the question for --task vqa")
    p.add_argument("--pages", help="PDF files: the pages to read, 1-based, e.g. 1-3,8 (default all)")
    p.add_argument("--prefer-text-layer", dest="prefer_text_layer", action="store_true",
                   help="PDF files, --task text: take a page's own text when it is reliable instead of OCR")


def build_parser(*, full_help: bool = False) -> argparse.ArgumentParser:
    """The parser; ``full_help``: ``ocr`` and ``batch`` list every setting in their help (``--help-all``)."""
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
    ocr.add_argument("--url", type=server_url, help="send the files to a running hyocr server instead of running in-process")
    ocr.add_argument("--api-key", dest="api_key", help="--url: the server's API key (or HYOCR_CLIENT_API_KEY)")
    ocr.add_argument("--timeout", type=seconds, help=f"--url: seconds per attempt (default 3; {PDF_TIMEOUT:g} for "
                     "a PDF, which streams its pages: the wait until the first page, then between pages)")
    _settings_flags(ocr, skip=LOCAL_SKIP, shown=None if full_help else OCR_SETTINGS)

    batch = sub.add_parser("batch", help="read many documents into a folder, resumably (hyocr/batch/)",
                           description="Read files, folders, globs, .jsonl manifests ({'path', 'task', "
                           "'pages'} a line) and s3:// or gs:// prefixes into DIR (or below an s3:// or "
                           "gs:// prefix): a JSON result per document, summary.json; a rerun skips what is "
                           "done and retries what failed (DIR/.hyocr-batch.jsonl; for a prefix, in "
                           "--state-dir). In-process, a PDF is read JOB_RANGE_PAGES pages at a time, each "
                           "range under REQUEST_TIMEOUT, its pages kept as they finish. Exit status: 0 all "
                           "done, 1 some failed, 2 nothing could start, 3 the server (--url) cannot be "
                           "reached, 130 interrupted.")
    batch.add_argument("inputs", nargs="+", metavar="INPUT")
    batch.add_argument("--output", "-o", required=True, metavar="DIR|URI",
                       help="a folder, or an s3://bucket/prefix/ or gs:// prefix (credentials from the "
                       "environment)")
    batch.add_argument("--state-dir", dest="state_dir", type=Path, metavar="DIR",
                       help="where the state a rerun resumes from is kept [default: DIR itself; for a "
                       "prefix, ~/.cache/hyocr/batch/<bucket>-<digest of the prefix and endpoint>]")
    _read_flags(batch)
    batch.add_argument("--url", type=server_url, help="submit the documents as jobs to a running hyocr server (/v1/jobs)")
    batch.add_argument("--api-key", dest="api_key", help="--url: the server's key (or HYOCR_CLIENT_API_KEY)")
    batch.add_argument("--timeout", type=seconds, default=60.0, help="--url: seconds per request attempt")
    batch.add_argument("--poll", type=seconds, default=1.0, help="--url: seconds between looks at a job")
    batch.add_argument("--max-retries", dest="max_retries", type=int, default=2,
                       help="a failed document is read again by a rerun, up to 1 + this many attempts in all")
    batch.add_argument("--workers", type=int, default=2, help="documents read at once (in-process)")
    batch.add_argument("--table", choices=["jsonl", "parquet"],
                       help="also write pages.jsonl or pages.parquet beside the outputs: a row a page of "
                       "every document done")
    _settings_flags(batch, skip=LOCAL_SKIP, shown=None if full_help else BATCH_SETTINGS)

    bench = sub.add_parser(
        "bench", help="load-test a server (running, or started here) and report; 'bench compare' compares results",
        description="Load-test an OpenAI-compatible OCR server (--url) or hyocr started in this process "
                    "(--engine), one level per concurrency. 'hyocr bench compare A.json B.json ...' puts "
                    "result files side by side, with ratios to the first.")
    target = bench.add_mutually_exclusive_group()
    target.add_argument("--url", type=server_url, help="server base URL, e.g. http://127.0.0.1:8000")
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
    bench.add_argument("--timeout", type=seconds, default=600.0, help="per-request timeout, seconds")
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
    argv = sys.argv[1:] if argv is None else list(argv)
    full = HELP_ALL in argv  # the same help, rebuilt with every setting shown
    args = build_parser(full_help=full).parse_args(["--help" if a == HELP_ALL else a for a in argv] if full
                                                   else argv)
    try:
        return _command(args)
    except KeyboardInterrupt:  # hyocr batch says more (and writes its summary) before this
        print("hyocr: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # stdout's reader is gone (`hyocr ocr ... | head`): nothing more to say
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's last flush goes nowhere, quietly
        return EXIT_BROKEN_PIPE


def _command(args: argparse.Namespace) -> int:
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
        from .ocr_cli import run_ocr

        return run_ocr(args, settings)
    except SettingsError as exc:
        print(f"hyocr: {exc}", file=sys.stderr)
        return 2


def serve(settings: Settings) -> int:
    import uvicorn

    from .api.app import build_app, check_gateway_settings
    from .api.serving import warn_if_exposed
    from .server.shares import bind_early
    from .server.uvicorn import Server, uvicorn_options

    if settings.gil_switch_interval:
        sys.setswitchinterval(settings.gil_switch_interval)
    check_gateway_settings(settings)
    warn_if_exposed(settings)
    if settings.ray:  # the API and the engine replicas as a Ray Serve application
        from .ray.serve import run

        return run(settings)
    if settings.api_processes > 1:  # several front ends sharing one vLLM engine core
        from .server.processes import serve as serve_processes

        return serve_processes(settings)
    lock, sock = bind_early(settings)  # a port in use fails now, not after the engine has loaded
    app = build_app(settings)
    # uvicorn drains in-flight requests on SIGTERM/SIGINT, then re-raises the signal to the
    # process's previous handler. A no-op handler there makes a drained stop exit 0, as
    # supervisors (systemd, Kubernetes) expect of a clean shutdown.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    # uvicorn.Server, not uvicorn.run: the server tells the app when the drain starts (server/uvicorn.py).
    server = Server(uvicorn.Config(app, host=settings.host, port=settings.port, **uvicorn_options(settings)),
                    drain=app.state.drain)
    try:
        server.run(sockets=[sock] if sock is not None else None)
    finally:
        if sock is not None:
            sock.close()
        lock.close()
    # 3: the lifespan failed (the engine did not start); 130: a second Ctrl-C cut the drain short
    code = 3 if not server.started else 130 if server.force_exit else 0
    _exit_when_drained(code)
    return code


def _exit_when_drained(code: int, grace: float = 2.0) -> None:
    """The server has drained and stopped; work it abandoned may still run on engine threads (a CPU
    engine's page in ONNX Runtime cannot be interrupted), and the interpreter would wait for each before
    exiting (16 s past a 3 s DRAIN_TIMEOUT was seen): a supervisor sized to the grace would SIGKILL it. Such
    threads get ``grace`` seconds, then the process exits at once, logs flushed."""
    import threading

    from .pipeline.fetch import release_resolver

    release_resolver()  # its idle threads would otherwise take the whole grace
    deadline = time.monotonic() + grace
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join(max(0.0, deadline - time.monotonic()))
    left = [t.name for t in threading.enumerate() if t is not threading.current_thread() and not t.daemon
            and t.is_alive()]
    if left:
        logging.getLogger("hyocr").warning("exiting with %d thread(s) still at abandoned work: %s",
                                           len(left), ", ".join(left[:5]))
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
