"""``hyocr bench``: warm up, then one measured level per concurrency, then the reports;
``hyocr bench compare``: result files side by side."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from tqdm import tqdm

from . import BenchError, compare, plot, report
from .gpu import choose_probe
from .load import default_requests, run_level
from .workload import Workload

DEFAULT_PROMPT = "提取图中的文字。"


async def bench(url: str, workload: Workload, concurrency: list[int], requests: list[int] | None,
                warmup: int, label: str | None, timeout: float, *, target: str | None = None,
                headers: dict[str, str] | None = None, metrics_url: str | None = None, clients: int = 0) -> dict:
    url = url.rstrip("/").removesuffix("/v1")
    meta = report.metadata(url, workload, label, target=target, headers=headers)
    model = meta["server"].get("model") or "hyocr"
    common = {"timeout": timeout, "model": model, "headers": headers}
    # Progress on stderr when it is a terminal (disable=None); logs and pipes stay clean.
    bar_options = {"unit": "req", "file": sys.stderr, "disable": None}
    if warmup:
        with tqdm(total=warmup, desc="warm-up", **bar_options) as bar:
            await run_level(url, workload, concurrency=min(warmup, max(concurrency)), requests=warmup,
                            offset=10**6, progress=bar.update, **common)
    gpu = await choose_probe(metrics_url or f"{url}/metrics", headers)
    levels = []
    offset = 0
    for i, c in enumerate(concurrency):
        n = requests[min(i, len(requests) - 1)] if requests else default_requests(c)
        with tqdm(total=n, desc=f"concurrency {c}", **bar_options) as bar:
            level = await run_level(url, workload, concurrency=c, requests=n, offset=offset, progress=bar.update,
                                    gpu=gpu, clients=clients, **common)
        offset += n
        levels.append(level.as_dict())
    return {"metadata": meta, "levels": levels, "sustained_concurrency": report.sustained(levels)}


def _positive_ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise BenchError(f"{flag} {text!r}: expected positive integers separated by commas, e.g. 1,8,32")
    return values


def _check_destinations(*paths: str | None) -> None:
    """Before the run, not after it: a typo in a folder name must not cost a finished benchmark."""
    for path in filter(None, paths):
        folder = Path(path).parent
        if not folder.is_dir():
            raise BenchError(f"{path}: folder {folder} does not exist")


def _write(path: str | None, text: str) -> None:
    if not path:
        return
    try:
        Path(path).write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")
    except OSError as exc:
        raise BenchError(f"{path}: {exc.strerror or exc}") from None


def run_main(args) -> int:
    if not (args.url or args.engine):
        raise BenchError("give --url URL (a running server) or --engine NAME (start one in this process)")
    if args.url and (args.model or args.set):
        raise BenchError("--model and --set configure the server that --engine starts; with --url, "
                         "configure that server instead")
    concurrency = _positive_ints(args.concurrency, "--concurrency")
    if args.clients < 0:
        raise BenchError(f"--clients {args.clients}: expected 0 (automatic) or a positive number")
    requests = _positive_ints(args.requests, "--requests") if args.requests else None
    _check_destinations(args.output, args.markdown, args.plot)
    if args.plot:
        plot.require_matplotlib()
    key = args.api_key or os.environ.get("HYOCR_CLIENT_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else None
    workload = Workload(args.workload, args.prompt or DEFAULT_PROMPT, args.max_tokens, args.fixed_output, args.seed)

    def measure(url: str, target: str | None = None) -> dict:
        return asyncio.run(bench(url, workload, concurrency, requests, args.warmup, args.label, args.timeout,
                                 target=target, headers=headers, metrics_url=args.metrics_url,
                                 clients=args.clients))

    if args.engine:
        from .server import InProcessServer, engine_settings, parse_sets, public_settings

        sets = parse_sets(args.set)
        with InProcessServer(engine_settings(args.engine, args.model, sets), headers) as server:
            doc = measure(server.url, target=f"engine:{args.engine}")
        doc["metadata"]["engine_settings"] = public_settings(args.engine, args.model, sets)
    else:
        doc = measure(args.url)
    table = report.markdown(doc)
    try:
        report.write(doc, args.output)
    except OSError as exc:
        raise BenchError(f"{args.output}: {exc.strerror or exc}") from None
    _write(args.markdown, table)
    if args.plot:
        plot.plot([(report.run_name(doc), doc)], args.plot)
    print(table)
    return 0 if all(lv["errors"] < lv["requests"] for lv in doc["levels"]) else 1


def compare_main(args) -> int:
    if len(args.files) < 2:
        raise BenchError("compare needs at least two result files (the first is the baseline)")
    _check_destinations(args.output, args.plot)
    if args.plot:
        plot.require_matplotlib()
    runs = compare.load_runs(args.files)
    text = compare.markdown(runs)
    _write(args.output, text)
    if args.plot:
        plot.plot([(run.name, run.doc) for run in runs], args.plot)
    print(text)
    return 0


def main(args) -> int:
    try:
        return compare_main(args) if getattr(args, "bench_command", None) == "compare" else run_main(args)
    except BenchError as exc:
        print(f"hyocr bench: {exc}", file=sys.stderr)
        return 2
