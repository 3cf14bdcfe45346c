"""``hyocr batch INPUT... --output DIR``: many documents read into a folder, resumably and exactly once.

``plan`` expands INPUTs (files, folders, globs, ``.jsonl`` manifests) into documents with stable output
names; ``state`` keeps ``DIR/.hyocr-batch.jsonl`` and decides, on a rerun, what is skipped (done, same
content, same options, output present), retried (failed, attempts left) or re-attached (a job submitted by
an interrupted run); ``readers`` read a document in-process or as a job (``--url``); ``run`` runs the plan.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from pathlib import Path
from typing import Any

from ..config import Settings
from .plan import PlanError, expand
from .state import StateFile, clean_temps

OPTIONS = ("task", "fields", "language", "question", "pages", "prefer_text_layer")


def main(args: argparse.Namespace, settings: Settings) -> int:
    """Exit status: 0 every document done, 1 some failed, 2 nothing could start (bad INPUT, DIR busy)."""
    from ..errors import HyocrError

    out_dir: Path = args.output
    defaults = {k: getattr(args, k, None) for k in OPTIONS}
    try:
        docs = expand(args.inputs, exclude=out_dir)
        if not docs:
            raise PlanError("no documents (images or PDFs) in the INPUTs")
        if args.workers < 1 or args.max_retries < 0:
            raise PlanError("--workers must be >= 1, --max-retries >= 0")
        if not args.url:  # a task name this build does not know fails now, not once per document
            from ..hunyuan.prompts import parse_task

            for task in {d.options(defaults).get("task") or "spotting" for d in docs}:
                parse_task(task)
        out_dir.mkdir(parents=True, exist_ok=True)
        state = StateFile(out_dir)
    except (PlanError, RuntimeError, OSError) as exc:
        print(f"hyocr: {exc}", file=sys.stderr)
        return 2
    except HyocrError as exc:
        print(f"hyocr: {exc.message}", file=sys.stderr)
        return 2
    try:
        clean_temps(out_dir)
        summary = asyncio.run(_run(args, settings, docs, state, defaults))
    finally:
        state.close()
    counts = summary["documents"]
    for item in summary["items"]:
        if item["status"] == "failed":
            print(f"hyocr: {item['path']}: {item['error']}", file=sys.stderr)
    print(f"{counts['done']}/{counts['total']} documents done ({counts['resumed']} from an earlier run), "
          f"{counts['failed']} failed, {summary['pages']['total']} pages; {out_dir / 'summary.json'}",
          file=sys.stderr)
    return 1 if counts["failed"] or counts["done"] < counts["total"] else 0


async def _run(args: argparse.Namespace, settings: Settings, docs: list, state: StateFile,
               defaults: dict[str, Any]) -> dict[str, Any]:
    from .run import Batch

    async with contextlib.AsyncExitStack() as stack:
        if args.url:
            from ..client import AsyncHyocrClient
            from .readers import RemoteReader

            key = args.api_key or os.environ.get("HYOCR_CLIENT_API_KEY")
            client = AsyncHyocrClient(args.url, api_key=key, timeout=args.timeout or 60.0)
            stack.push_async_callback(client.aclose)
            reader: Any = RemoteReader(client, poll=args.poll)
        else:
            from .local import local_service
            from .readers import LocalReader

            reader = LocalReader(await stack.enter_async_context(local_service(settings)))
        batch = Batch(docs, args.output, reader, defaults, workers=args.workers,
                      max_attempts=1 + args.max_retries)
        return await batch.run(state)
