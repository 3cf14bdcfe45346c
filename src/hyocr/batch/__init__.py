"""``hyocr batch INPUT... --output DIR``: many documents read into a folder (or an object-store prefix),
resumably and exactly once.

``plan`` expands INPUTs (files, folders, globs, ``.jsonl`` manifests, object-store URIs: ``sources``) into
documents with stable output names; ``outputs`` writes them to DIR or below an ``s3://``/``gs://`` prefix
and says where the state lives (DIR; for a prefix, a local folder of its own); ``state`` keeps the state
file ``.hyocr-batch.jsonl`` and decides, on a rerun,
what is skipped (done, same content, same options, output present), retried (failed, attempts left) or
re-attached (a job submitted by an interrupted run); ``readers`` read a document in-process (a PDF in
ranges of pages, kept in ``partial`` as they finish, selected by ``pages``) or as a job (``--url``); ``run``
runs the plan. With ``--ray`` the plan runs as a Ray Data pipeline (hyocr/ray/data.py) that writes the same
outputs, state lines and summary, so either resumes the other's work.

Exit status: 0 every document done, 1 some failed (or left pending), 2 nothing could start (a bad INPUT,
manifest line, ``--pages``, task or URI; DIR busy), 3 the server (``--url``) could not be reached or refused the
caller (401/403: the API key): the documents not read are pending, no attempt spent; 130 interrupted (Ctrl-C):
the summary is written, a rerun resumes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from typing import Any

from ..config import Settings
from .outputs import Output, OutputError, open_output
from .plan import PlanError, expand
from .run import Batch
from .sources import Sources
from .state import StateFile, clean_temps
from .table import require as require_table
from .table import write_table

OPTIONS = ("task", "fields", "language", "question", "pages", "prefer_text_layer")
EXIT_UNREACHABLE = 3
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command that Ctrl-C ended


def main(args: argparse.Namespace, settings: Settings) -> int:
    """The exit status above."""
    from ..errors import HyocrError
    from .pages import check as check_pages

    defaults = {k: getattr(args, k, None) for k in OPTIONS}
    sources = Sources.from_settings(settings)
    try:
        check_pages(args.pages)
        output = open_output(str(args.output), getattr(args, "state_dir", None), sources)
        docs = expand(args.inputs, exclude=output.excluded, sources=sources)
        if not docs:
            raise PlanError("no documents (images or PDFs) in the INPUTs")
        if args.workers < 1 or args.max_retries < 0:
            raise PlanError("--workers must be >= 1, --max-retries >= 0")
        if not args.url:  # a task this build or this engine cannot run fails now, not once per document
            from ..hunyuan.prompts import parse_task
            from .local import check_engine_task

            for task in {d.options(defaults).get("task") or "spotting" for d in docs}:
                check_engine_task(parse_task(task), settings)
        table = getattr(args, "table", None)
        require_table(table)
        on_ray = settings.ray and not args.url  # --url: the server reads, however it is scaled
        if on_ray:
            from ..ray.data import require_ray

            require_ray()
        output.open()
        state = StateFile(output.state_dir)
    except (PlanError, RuntimeError, OSError) as exc:
        print(f"hyocr: {exc}", file=sys.stderr)
        return 2
    except HyocrError as exc:
        print(f"hyocr: {exc.message}", file=sys.stderr)
        return 2
    if str(output.state_dir) != output.where:
        print(f"hyocr: the batch's state (what is done, the pages read so far) is kept in "
              f"{output.state_dir}; the same command run again resumes from it", file=sys.stderr)
    batch = Batch(docs, output, None, defaults, workers=args.workers, max_attempts=1 + args.max_retries,
                  sources=sources)
    try:
        for folder in output.folders:  # once the state is locked: not the temp files of a run still going
            clean_temps(folder)
        try:
            if on_ray:
                summary = _run_on_ray(batch, state, settings)
                if summary is None:
                    return 2
            else:
                summary = asyncio.run(_run(args, settings, batch, state))
        except KeyboardInterrupt:  # the reads were cancelled on the way here; the pages read are kept
            batch.stop("interrupted", "interrupted (Ctrl-C)")
            summary = batch.finish()
    finally:
        state.close()
    return _report(summary, batch, output, table, args.url)


def _report(summary: dict[str, Any], batch: Batch, output: Output, table: str | None, url: str | None) -> int:
    """Failures one line each, the counts in one, then what stopped the run early: the exit status."""
    counts = summary["documents"]
    items = summary["items"]
    for item in items:
        if item["status"] == "failed":
            print(f"hyocr: {item['path']}: {item['error']}", file=sys.stderr)
    pending = sum(1 for i in items if i["status"] == "pending")
    noted = sum(1 for i in items if i.get("note"))
    written = [batch.summary_at] if batch.summary_at else []
    unwritten = [batch.summary_error] if batch.summary_error else []
    if table:
        try:
            written.append(write_table(output, summary, table))
        except OutputError as exc:
            unwritten.append(f"the --table file: {exc}")
    for why in unwritten:
        print(f"hyocr: {why}", file=sys.stderr)
    print(f"{counts['done']}/{counts['total']} documents done ({counts['resumed']} from an earlier run), "
          f"{counts['failed']} failed, {f'{pending} pending, ' if pending else ''}{summary['pages']['total']} "
          f"pages{f' ({noted} with fewer pages than --pages: see their note)' if noted else ''}; "
          f"{', '.join(written) or 'nothing written'}", file=sys.stderr)
    stopped = summary.get("stopped") or {}
    if stopped.get("reason") == "interrupted":
        print("hyocr: interrupted; run again to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    if stopped.get("reason") == "server_unreachable":
        print(f"hyocr: the server at {url} cannot be reached ({stopped['message']}): {pending} document(s) "
              "left pending, no attempt spent; run again once it answers", file=sys.stderr)
        return EXIT_UNREACHABLE
    if stopped.get("reason") == "server_refused":
        print(f"hyocr: the server at {url} refused this caller ({stopped['message']}): give the API key with "
              f"--api-key or HYOCR_CLIENT_API_KEY; {pending} document(s) left pending, no attempt spent",
              file=sys.stderr)
        return EXIT_UNREACHABLE
    return 1 if counts["failed"] or counts["done"] < counts["total"] or unwritten else 0


def _run_on_ray(batch: Batch, state: StateFile, settings: Settings) -> dict[str, Any] | None:
    """The Ray Data pipeline (hyocr/ray/data.py); None when it could not start (its error printed)."""
    from ..config import SettingsError
    from ..ray.data import run_batch

    try:
        return run_batch(batch, state, settings)
    except (SettingsError, ConnectionError) as exc:  # the engine, or the cluster at ray_address
        print(f"hyocr: {exc}", file=sys.stderr)
        return None


async def _run(args: argparse.Namespace, settings: Settings, batch: Batch, state: StateFile) -> dict[str, Any]:
    async with contextlib.AsyncExitStack() as stack:
        if args.url:
            from ..client import AsyncHyocrClient
            from .readers import RemoteReader

            key = args.api_key or os.environ.get("HYOCR_CLIENT_API_KEY")
            client = AsyncHyocrClient(args.url, api_key=key, timeout=args.timeout or 60.0)
            stack.push_async_callback(client.aclose)
            counter = None
            if args.pages:  # cut to a shorter PDF here, before its job is submitted
                from .readers import PageCounter

                counter = PageCounter(settings)
                stack.callback(counter.close)
            batch.reader = RemoteReader(client, poll=args.poll, counter=counter)
        else:
            from .local import local_service
            from .readers import LocalReader

            service = await stack.enter_async_context(local_service(settings))
            batch.reader = LocalReader(service, range_pages=settings.job_range_pages,
                                       max_pages=settings.job_max_pages, retries=settings.job_max_attempts)
        return await batch.run(state)
