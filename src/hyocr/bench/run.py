"""``hyocr bench``: warm up, then one measured level per concurrency, then the report."""

from __future__ import annotations

import asyncio
import sys

from . import report
from .load import run_level
from .workload import Workload

DEFAULT_PROMPT = "提取图中的文字。"


async def bench(url: str, workload: Workload, concurrency: list[int], requests: list[int] | None,
                warmup: int, label: str | None, timeout: float) -> dict:
    url = url.rstrip("/").removesuffix("/v1")
    meta = report.metadata(url, workload, label)
    model = meta["server"].get("model") or "hyocr"
    if warmup:
        await run_level(url, workload, concurrency=min(warmup, max(concurrency)), requests=warmup,
                        offset=10**6, timeout=timeout, model=model)
    levels = []
    offset = 0
    for i, c in enumerate(concurrency):
        n = requests[min(i, len(requests) - 1)] if requests else max(32, 2 * c)
        done = [0]

        def tick() -> None:
            done[0] += 1
            print(f"\rconcurrency {c}: {done[0]}/{n}", end="", file=sys.stderr, flush=True)

        level = await run_level(url, workload, concurrency=c, requests=n, offset=offset, timeout=timeout,
                                model=model, progress=tick)
        print(file=sys.stderr)
        offset += n
        levels.append(level.as_dict())
    return {"metadata": meta, "levels": levels, "sustained_concurrency": report.sustained(levels)}


def main(args) -> int:
    workload = Workload(args.workload, args.prompt or DEFAULT_PROMPT, args.max_tokens, args.fixed_output, args.seed)
    concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    requests = [int(n) for n in args.requests.split(",") if n.strip()] if args.requests else None
    doc = asyncio.run(bench(args.url, workload, concurrency, requests, args.warmup, args.label,
                            args.timeout))
    report.write(doc, args.output)
    print(report.markdown(doc))
    return 0 if all(lv["errors"] < lv["requests"] for lv in doc["levels"]) else 1
