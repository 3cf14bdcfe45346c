"""An evaluation run: the SET loaded, its documents read by hyocr batch's machinery into a reads folder (the
same outputs, state file and resume rules: a rerun reads only what is missing or failed), every truth
scored, and the report built.

The reads folder also keeps ``eval.json`` (what read it: the engine and its settings, or the server; a
rerun with other settings is refused rather than mixing readings) and ``eval-runs.jsonl`` (each finished
run's reading time and pages), so pages/s covers the pages whose reading time is known, across reruns.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..batch.readers import Reader
from ..config import Settings
from . import EvalError, omnidocbench, pdf_text, report, score
from .sets import LoadedSet, load_manifest

REPORT_VERSION = 1
READS_FILE = "eval.json"
RUNS_FILE = "eval-runs.jsonl"


@dataclass(slots=True)
class Job:
    """What ``hyocr eval`` was asked: the set, where results go, and how documents are read."""

    set: str
    output: Path
    reads: Path
    defaults: dict[str, Any]  # the read options (task, fields, language, question, pages, max_tokens)
    settings: Settings  # in-process reading (ignored with url)
    truth: str | None = None  # manifest | omnidocbench | pdf-text; None: told by the SET
    url: str | None = None
    api_key: str | None = None
    timeout: float = 60.0
    poll: float = 1.0
    workers: int = 2
    max_retries: int = 2
    fold_case: bool = False
    label: str | None = None
    limit: int | None = None
    omnidocbench_pdfs: bool = False
    filters: dict[str, str] = field(default_factory=dict)
    writes: tuple[Path, ...] = ()  # the report, markdown and plot: never a file the set reads


def kind_of(job: Job) -> str:
    if job.truth:
        return job.truth
    path = Path(job.set).expanduser()
    if not path.exists() and not any(c in job.set for c in "*?["):  # a glob is pdf-text's to expand
        raise EvalError(f"{job.set}: no such file or folder")
    if path.is_file() and path.suffix.lower() == ".jsonl":
        return "manifest"
    if omnidocbench.is_omnidocbench(path):
        return "omnidocbench"
    raise EvalError(f"{job.set}: not a .jsonl manifest nor an OmniDocBench folder; for PDFs whose text layer is "
                    "the reference, add --truth pdf-text")


async def load_set(job: Job) -> LoadedSet:
    kind = kind_of(job)
    path = Path(job.set).expanduser()
    if kind == "manifest" and path.is_dir():
        raise EvalError(f"{job.set}: a folder; --truth manifest takes a .jsonl file")
    if kind == "pdf-text" and path.is_file() and path.suffix.lower() == ".jsonl":
        raise EvalError(f"{job.set}: a manifest; --truth pdf-text takes PDFs (a file, a folder or a glob): "
                        "leave --truth out to read the manifest")
    if kind == "manifest":
        loaded = load_manifest(path, job.defaults)
    elif kind == "omnidocbench":
        loaded = omnidocbench.load(path, job.defaults, use_pdfs=job.omnidocbench_pdfs, filters=job.filters)
    else:
        loaded = await pdf_text.load(job.set, job.defaults, job.settings, exclude=job.reads)
    # Checked against every file the set reads, before any is read: a report written over a folder set's
    # annotations or one of its documents replaced it (the command line's own check saw only SET itself).
    read = {Path(loaded.path).resolve(), *(s.document.path for s in loaded.samples)}
    for written in job.writes:
        if written.resolve() in read:
            raise EvalError(f"{written}: is read by this command (part of {job.set}); write it elsewhere")
    if job.limit is not None:
        loaded.samples = loaded.samples[:job.limit]
    return loaded


def target_of(job: Job) -> dict[str, Any]:
    """What reads the documents, as compared between runs on one reads folder."""
    if job.url:
        from ..bench.report import server_info

        headers = {"Authorization": f"Bearer {job.api_key}"} if job.api_key else None
        info = server_info(job.url.rstrip("/"), headers)
        if not info:
            raise EvalError(_unanswered(job.url.rstrip("/"), headers, job.api_key))
        return {"url": job.url.rstrip("/"), "engine": info.get("engine"), "model": info.get("model"),
                "revision": info.get("revision")}
    return {"settings": report.reading_settings(job.settings)}


def _unanswered(url: str, headers: dict[str, str] | None, api_key: str | None) -> str:
    """Why /v1/models gave no engine: the key (401/403 say so plainly), or no hyocr server there."""
    import httpx

    try:
        status = httpx.get(f"{url}/v1/models", timeout=10, headers=headers).status_code
    except httpx.HTTPError as exc:
        return f"{url}: no server answers ({type(exc).__name__})"
    if status in (401, 403):
        return (f"{url}: the server refused {'the API key' if api_key else 'a request without an API key'} "
                f"({status}): give --api-key or HYOCR_CLIENT_API_KEY")
    return f"{url}: no hyocr server answers at /v1/models ({status})"


def claim_reads(reads: Path, target: Mapping[str, Any]) -> None:
    """The reads folder for this target: made, or found made by the same one."""
    if reads.exists() and not reads.is_dir():
        raise EvalError(f"--reads {reads}: a file; --reads names the folder the documents' results are kept in")
    reads.mkdir(parents=True, exist_ok=True)
    marker = reads / READS_FILE
    try:
        known = json.loads(marker.read_text(encoding="utf-8"))["target"]
    except FileNotFoundError:
        report.write_json({"object": "hyocr.eval.reads", "target": dict(target)}, marker)
        return
    except (OSError, ValueError, KeyError, TypeError):
        raise EvalError(f"{marker}: unreadable; remove it (or give another --reads)") from None
    if known != json.loads(json.dumps(target)):
        raise EvalError(f"{reads} holds documents read by {json.dumps(known)}, not {json.dumps(dict(target))}: "
                        "give another --reads DIR (or remove that one) to read them again")


@contextlib.asynccontextmanager
async def reader_for(job: Job) -> AsyncIterator[tuple[Reader, dict[str, Any]]]:
    """batch's reader (in-process or jobs on a server) and what it reads with (engine, model, ...)."""
    if job.url:
        from ..batch.readers import RemoteReader
        from ..bench.report import server_info
        from ..client import AsyncHyocrClient

        client = AsyncHyocrClient(job.url, api_key=job.api_key, timeout=job.timeout)
        try:
            headers = {"Authorization": f"Bearer {job.api_key}"} if job.api_key else None
            yield RemoteReader(client, poll=job.poll), server_info(job.url.rstrip("/"), headers)
        finally:
            await client.aclose()
        return
    from ..batch.local import local_service
    from ..batch.readers import LocalReader

    async with local_service(job.settings) as service:
        info = service.engine.info
        yield LocalReader(service), {"engine": info.name, "model": info.model, "version": info.version or None,
                                     "follows_prompts": info.follows_prompts, **info.details}


async def evaluate(job: Job) -> dict[str, Any]:
    from ..batch.run import Batch
    from ..batch.state import StateFile, clean_temps

    loaded = await load_set(job)
    if not job.url:  # before the engine loads: a task it cannot run (rapidocr and extraction) is refused now
        from ..batch.local import check_engine_task
        from ..hunyuan.prompts import parse_task

        for task in sorted({s.task for s in loaded.samples} | {job.defaults.get("task") or "spotting"}):
            check_engine_task(parse_task(task), job.settings)
    target = target_of(job)
    claim_reads(job.reads, target)
    try:
        state = StateFile(job.reads)
    except RuntimeError as exc:  # another run holds the folder
        raise EvalError(str(exc)) from None
    try:
        clean_temps(job.reads)
        drop_damaged(job.reads, [s.document for s in loaded.samples])
        async with reader_for(job) as (reader, engine):
            # made here, after the engine started: its clock is the reading's
            batch = Batch([s.document for s in loaded.samples], job.reads, reader, job.defaults,
                          workers=job.workers, max_attempts=1 + job.max_retries, label="hyocr eval")
            summary = await batch.run(state)
    finally:
        state.close()
    runs = record_run(job.reads, summary, run_key(loaded, job))
    return build_report(job, loaded, batch, summary, runs, engine)


def run_key(loaded: LoadedSet, job: Job) -> str:
    """Which report a run's reading time belongs to: the same documents, truth and read options (a reads
    folder read once with pages 17-22 and then 17-20 timed the second report over both runs' pages)."""
    text = json.dumps([loaded.fingerprint(), job.defaults], sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def drop_damaged(reads: Path, documents: list[Any]) -> None:
    """A result that no longer parses (cut short, edited) is removed, so that this run reads its document again
    (batch's rule: a done document whose output is missing is read again) rather than reporting it failed."""
    for doc in documents:
        path = reads / doc.name
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            continue
        except (OSError, ValueError):
            with contextlib.suppress(OSError):
                path.unlink()


def record_run(reads: Path, summary: Mapping[str, Any], key: str) -> list[dict[str, Any]]:
    """This run's reading time appended to the runs log; the lines of the runs of the same ``key`` back."""
    line = {"at": round(time.time(), 3), "elapsed_s": summary["elapsed_s"],
            "pages_read": summary["pages"]["read_this_run"], "key": key}
    path = reads / RUNS_FILE
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
        f.flush()
        os.fsync(f.fileno())
    runs = []
    for text in path.read_text(encoding="utf-8", errors="replace").splitlines():  # a damaged line is skipped
        with contextlib.suppress(ValueError, TypeError):
            runs.append(dict(json.loads(text)))
    return [run for run in runs if run.get("key") == key]


def build_report(job: Job, loaded: LoadedSet, batch: Any, summary: Mapping[str, Any], runs: list[dict],
                 engine: Mapping[str, Any]) -> dict[str, Any]:
    rows, reads = [], []
    for sample in loaded.samples:
        item = batch.items[sample.document.key]
        body = None
        if item.status == "pending":  # not read: the run stopped (a server gone, Ctrl-C) before it; left out of
            continue  # the scores, never scored as an empty output (documents.done < total says the report is partial)
        if item.status == "done":
            try:
                body = json.loads((job.reads / item.output).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                item.status, item.error = "failed", f"its result {item.output} could not be read back"
        reads.append((sample, body, item))
        rows += score.score_sample(sample, body, item.error, fold_case=job.fold_case)
    pages = sum(len(s.truths) for s in loaded.samples)
    set_info = {"kind": loaded.kind, "path": loaded.path, "documents": len(loaded.samples),
                "pages_with_reference": pages, "fingerprint": loaded.fingerprint(),
                "tasks": dict(Counter(s.task for s in loaded.samples)), "fold_case": job.fold_case}
    settings = {"url": job.url} if job.url else report.reading_settings(job.settings)
    options = {**job.defaults, "workers": job.workers}
    return {"object": report.OBJECT, "version": REPORT_VERSION,
            "metadata": report.header(label=job.label, target=job.url or f"engine:{job.settings.engine}",
                                      engine=engine, settings=settings, options=options, set_info=set_info),
            "scores": score.summarize(rows), "operational": operational(loaded, summary, reads, runs),
            "pages": rows}


def operational(loaded: LoadedSet, summary: Mapping[str, Any], reads: list, runs: list[dict]) -> dict[str, Any]:
    finish: Counter[str] = Counter()
    failures, read_pages, prompt, completion = [], 0, 0, 0
    for sample, body, item in reads:
        if body is None:
            failures.append({"document": sample.document.rel, "page": None, "error": item.error or "not read"})
            continue
        for page in body.get("pages") or ():
            read_pages += 1
            finish[page.get("finish_reason") or "stop"] += 1
            if page.get("error"):  # a failed page, or an extraction whose output was not the JSON asked for
                failures.append({"document": sample.document.rel, "page": page.get("index", 0) + 1,
                                 "error": page.get("error") or "failed"})
        usage = body.get("usage") or {}
        prompt += usage.get("prompt_tokens") or 0
        completion += usage.get("completion_tokens") or 0
    timed = [r for r in runs if r.get("pages_read")]
    timed_pages = sum(r["pages_read"] for r in timed)
    timed_seconds = sum(r["elapsed_s"] for r in timed)
    return {"documents": dict(summary["documents"]),
            "pages": {"read": read_pages, "failed": finish.get("error", 0),
                      "without_reference": sum(len(s.skipped) for s in loaded.samples)},
            "pages_per_s": timed_pages / timed_seconds if timed_seconds else None,
            "timed_pages": timed_pages, "timed_seconds": round(timed_seconds, 3), "runs": len(runs),
            "finish_reasons": dict(finish),
            "tokens_per_page": {"prompt": prompt / read_pages if read_pages else None,
                                "completion": completion / read_pages if read_pages else None},
            "failures": failures[:200], "failures_total": len(failures),
            "skipped_documents": loaded.skipped_documents,
            **({"stopped": summary["stopped"]} if summary.get("stopped") else {})}  # e.g. a server gone
